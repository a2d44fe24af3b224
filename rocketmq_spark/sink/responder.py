"""The check-back responder of an exactlyOnce query: ``python -m rocketmq_spark.sink.responder``.

Spark keeps no Python process of a sink alive for a whole query run (``commit`` runs in a
worker Spark may stop between micro-batches), so the sink starts this small process from its
first commit (:func:`.exactly_once.ensure_responder`). It registers the query's producer group
on every broker (HEART_BEAT), answers CHECK_TRANSACTION_STATE from the commit record
(:func:`.check_back.decide`) and exits when the driver JVM is gone or the query has not
committed for longer than the brokers keep asking (``idleLimitS`` of its configuration,
:data:`IDLE_LIMIT_S` when not given). One per query: it answers only while it holds the
record's lease object (:class:`..storage.Lease`, which holds on every store, object stores
included), and checks that it still holds it before each answer, so a zombie driver's
responder and its restart's never both answer. Its configuration arrives as JSON on stdin.
"""
from __future__ import annotations

import json
import logging
import sys
import threading
import time

import psutil

from ..client.nameserver import NameServerClient
from ..client.remoting import RemotingClient
from ..client.txn.transaction import CheckResponder, Outcome
from ..storage import Lease, StorageOptions
from .check_back import decide
from .commit_record import CommitLog
from .exactly_once import RESPONDER_LEASE
from ..client.txn.op_topic import OpTopic
from .options import parse_sink_options

log = logging.getLogger("rocketmq_spark.sink.responder")
IDLE_LIMIT_S = 20 * 60.0
LOCK_WAIT_S = 30.0
PRUNE_LIMIT = 32  # batches dropped per pass (a few requests each on an object store)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: the driver JVM died, its parent has not
    reaped it yet)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True


def _brokers(names: NameServerClient) -> list:
    """Where check-backs come from: every broker's master, or a 5.x proxy's remoting port,
    which passes its brokers' check-backs on to producers registered with it."""
    info = names.cluster_info()
    return sorted({b.master_addr for b in info.broker_addr_table.values() if b.master_addr}
                  | set(names.proxies))


def main() -> int:
    config = json.loads(sys.stdin.read())
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s responder %(process)d: %(message)s")
    storage = StorageOptions.from_raw(config["options"])
    commit_log = CommitLog(config["root"], storage=storage)
    jvm = int(config["jvmPid"])
    lease = Lease(commit_log.store, RESPONDER_LEASE, tag="responder-")
    # An earlier run's responder may still be noticing its JVM is gone: wait for it a little.
    if not lease.acquire(LOCK_WAIT_S, still_wanted=lambda: _alive(jvm)):
        log.info("another responder holds %s: leaving", RESPONDER_LEASE)
        return 0
    lost = threading.Event()
    stop = threading.Event()
    keeper = threading.Thread(target=_keep_lease, args=(lease, lost, stop), daemon=True,
                              name="responder-lease")
    keeper.start()
    try:
        _answer_while_needed(config, commit_log, lease, lost)
    finally:
        stop.set()
        keeper.join(10)
        lease.release()
    return 0


def _keep_lease(lease: Lease, lost: threading.Event, stop: threading.Event) -> None:
    """Renew the lease on a thread of its own, so that nothing the main loop waits for (a
    broker that does not answer, a slow listing) lets it lapse."""
    while not stop.wait(0.25):
        if lease.renew_due() and not lease.renew() or not lease.held():
            lost.set()
            return


def _prune(commit_log: CommitLog, lease: Lease) -> None:
    """Drop old settled batches from the record (off the commit's path), while holding the
    lease (one pruner per query)."""
    if not lease.held():
        return
    try:
        dropped = commit_log.prune(limit=PRUNE_LIMIT)
    except Exception as exc:  # the store is down: next time
        log.warning("pruning the record failed: %s", exc)
        return
    if dropped:
        log.info("pruned %d settled batches from the record", dropped)


def _answer_while_needed(config: dict, commit_log: CommitLog, lease: Lease,
                         lost: threading.Event) -> None:
    """Answer check-backs until the driver JVM is gone, the query stays idle too long or the
    lease is lost."""
    jvm = int(config["jvmPid"])
    idle_limit = float(config.get("idleLimitS", IDLE_LIMIT_S))
    options = parse_sink_options(config["options"])
    settings = options.connection
    lookups = RemotingClient(settings.client_config())
    ops = OpTopic(lookups)
    query_id = config["queryId"]

    def answer(request) -> Outcome:
        if not lease.held():  # fencing: a successor may hold it now; send nothing
            return Outcome.UNKNOWN
        return decide(commit_log, query_id, ops, request)

    responder = CheckResponder.create(settings.client_config(), config["group"], answer)
    names = NameServerClient(list(options.name_servers), lookups)
    log.info("answering check-backs of producer group %s (query %s) while JVM %d lives",
             config["group"], query_id, jvm)
    responder.register(_brokers(names))
    responder.start()
    last_brokers = last_report = time.monotonic()
    last_idle_check = 0.0
    reported = dict(responder.answered)
    try:
        while _alive(jvm):
            if time.monotonic() - last_report > 60 and dict(responder.answered) != reported:
                last_report, reported = time.monotonic(), dict(responder.answered)
                log.info("check-backs answered so far: %s", reported)
            if lost.is_set():
                log.warning("lost %s (another responder took it over): stopping",
                            RESPONDER_LEASE)
                break
            if time.monotonic() - last_idle_check > min(30.0, idle_limit / 2):
                last_idle_check = time.monotonic()
                _prune(commit_log, lease)
                if time.time() - commit_log.last_active() > idle_limit:
                    log.info("no commit for %.0f s: nothing left for the brokers to ask",
                             idle_limit)
                    break
            if time.monotonic() - last_brokers > 30:
                last_brokers = time.monotonic()
                try:
                    responder.register(_brokers(names))
                except Exception as exc:  # name server down: keep the brokers we have
                    log.warning("listing brokers failed: %s", exc)
            time.sleep(0.5)
    finally:
        log.info("stopping; answered %s", responder.answered)
        responder.close()
        lookups.close()


if __name__ == "__main__":
    sys.exit(main())
