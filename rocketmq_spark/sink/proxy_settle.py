"""Exactly once for ``df.write`` through a 5.x proxy's remoting port: rows settled by check-back.

A genuine 5.1.4 proxy answers a first-phase END_TRANSACTION SUCCESS and drops it: it finds a
transaction only among the broker check-backs it has passed on. So the job's commit does not
send COMMITs. It registers the job's producer group with the proxy (a :class:`CheckResponder`
heartbeating there) and answers the brokers' check-backs, which the proxy passes to it:

* a half message of a task attempt Spark kept → COMMIT, the first time its row is asked about;
* its row asked about again (the broker re-stores an unsettled half message each round and asks
  about the copy): ROLLBACK when the row is already in its topic, UNKNOWN within
  :data:`ANSWER_GRACE_S` of the last COMMIT (that one may still be on its way), else COMMIT
  again (the last one was lost);
* a half message of this job's other attempts → ROLLBACK; anything else → UNKNOWN.

The commit returns once every row is seen in its topic (pulled through the proxy from where its
queue stood before the first COMMIT into it), so ``df.write`` ends with its rows visible, one
broker check round or more after the tasks finished (``transactionCheckInterval``, 30 s by
default on 5.x, plus up to the proxy's 20-s producer announcement). A row not seen by
``timeout`` fails the job, naming how many settled; the others stay half and the brokers
discard them after ``transactionCheckMax`` checks. Streams are refused through a proxy
(:mod:`.proxy_guard`): their recovery after a driver crash reads the brokers' op topic.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Dict, List, Optional, Sequence, Set, Tuple

from ..client.broker import BrokerClient
from ..client.errors import RocketMQError
from ..client.protocol.message import decode_messages
from ..client.protocol.properties import UNIQ_KEY
from ..client.protocol.route import MessageQueue
from ..client.pull import PullRequest, PullStatus
from ..client.remoting import RemotingClient
from ..client.txn.transaction import CheckRequest, CheckResponder, HalfHandle, Outcome
from .check_back import QUERY_PROPERTY, TOKEN_PROPERTY
from .options import SinkOptions

log = logging.getLogger(__name__)

ANSWER_GRACE_S = 10.0   # a COMMIT answered this recently may still be on its way
POLL_S = 0.5
# The longest a job waits for its rows: several check rounds of a default 5.x broker (30 s
# each), the proxy's producer announcement (20 s) and the first check's 6-s immunity.
SETTLE_TIMEOUT_S = 180.0
READ_GROUP_SUFFIX = "-settle"

Queue = Tuple[str, str, int]  # topic, broker name, queue id


class ProxySettlement:
    """One job's rows, settled through the proxy's check-backs (see the module's doc)."""

    def __init__(self, options: SinkOptions, proxy: str, group: str, job: str,
                 tokens: Sequence[str], handles: Sequence[HalfHandle],
                 clock=time.monotonic):
        self.options = options
        self.proxy = proxy
        self.group = group
        self.job = job
        self.tokens = set(tokens)
        self.rows: Dict[str, HalfHandle] = {h.uniq_key: h for h in handles}
        self.clock = clock
        self.answered: Dict[str, float] = {}     # uniq key -> last COMMIT answered at
        self.visible: Set[str] = set()
        self.queues: Dict[Queue, int] = {}       # where each queue is read from next
        self._lock = threading.Lock()
        self._lookups = RemotingClient(options.connection.client_config())
        self._brokers = BrokerClient(self._lookups)

    # ------------------------------------------------------------------ answers

    def decide(self, request: CheckRequest) -> Outcome:
        props = request.properties
        if props.get(QUERY_PROPERTY) != self.job:
            return Outcome.UNKNOWN  # another writer of the group
        if props.get(TOKEN_PROPERTY, "") not in self.tokens:
            return Outcome.ROLLBACK  # an attempt Spark did not keep
        uniq = request.uniq_key
        row = self.rows.get(uniq)
        queue = _queue_of(request, row)
        if row is None or queue is None:
            return Outcome.UNKNOWN
        with self._lock:
            last = self.answered.get(uniq)
        if last is not None:
            if uniq in self.visible or self._read(queue, uniq):
                return Outcome.ROLLBACK  # a copy of a row already stored
            if self.clock() - last < ANSWER_GRACE_S:
                return Outcome.UNKNOWN
        if queue not in self.queues:  # before the first COMMIT into it: where to read from
            start = self._brokers.get_max_offset(self.proxy, MessageQueue(*queue))
            with self._lock:
                self.queues.setdefault(queue, start)
        with self._lock:
            self.answered[uniq] = self.clock()
        return Outcome.COMMIT

    # ------------------------------------------------------------------ what is stored

    def _read(self, queue: Queue, uniq: Optional[str] = None) -> bool:
        """Read ``queue`` on from where it was left; whether ``uniq`` is stored now."""
        topic, broker, queue_id = queue
        group = self.group + READ_GROUP_SUFFIX
        while True:
            with self._lock:
                offset = self.queues.get(queue)
            if offset is None:
                return False
            result = self._brokers.pull(self.proxy, PullRequest(
                group, topic, queue_id, offset, broker))
            if result.status is not PullStatus.FOUND:
                break
            found = {m.properties.get(UNIQ_KEY) for m in decode_messages(result.body)}
            with self._lock:
                self.visible.update(found & self.rows.keys())
                self.queues[queue] = max(self.queues[queue], result.next_begin_offset)
        return uniq is not None and uniq in self.visible

    def settled(self) -> int:
        for queue in list(self.queues):
            try:
                self._read(queue)
            except RocketMQError as exc:
                log.info("reading %s through the proxy to see settled rows: %s", queue, exc)
        return len(self.visible)

    def close(self) -> None:
        self._lookups.close()

    # ------------------------------------------------------------------ the wait

    def run(self, timeout: float = SETTLE_TIMEOUT_S) -> Tuple[int, List[str]]:
        """Answer check-backs until every row is stored or ``timeout`` passes. Returns how
        many rows are stored and the ids of the others."""
        responder = CheckResponder.create(self.options.connection.client_config(),
                                          self.group, self.decide, heartbeat_interval=5.0)
        deadline = self.clock() + timeout
        try:
            responder.register([self.proxy])
            responder.start()
            while self.settled() < len(self.rows) and self.clock() < deadline:
                time.sleep(POLL_S)
        finally:
            responder.close()
            self.close()
        missing = sorted(set(self.rows) - self.visible)
        return len(self.visible), missing


def _queue_of(request: CheckRequest, row: Optional[HalfHandle]) -> Optional[Queue]:
    props = request.properties
    try:
        return (props["REAL_TOPIC"], row.broker_name if row else "", int(props["REAL_QID"]))
    except (KeyError, ValueError):
        return None


def settle_job(options: SinkOptions, proxy: str, group: str, job: str, tokens: Sequence[str],
               handles: Sequence[HalfHandle], timeout: float = SETTLE_TIMEOUT_S) -> int:
    """The job's commit through a proxy: wait for its rows to be settled by check-back; raise
    when some are not stored by ``timeout``. Returns how many rows are stored."""
    log.warning("rocketmq sink job %s: %d rows through the 5.x proxy %s are committed by the "
                "brokers' check-backs, not by END_TRANSACTION (the proxy drops those): waiting "
                "for them to settle, about one transactionCheckInterval (30 s by default)",
                job, len(handles), proxy)
    started = time.monotonic()
    stored, missing = ProxySettlement(options, proxy, group, job, tokens, handles).run(timeout)
    if missing:
        raise RocketMQError(
            f"rocketmq sink job {job}: {stored} of {len(handles)} rows were settled through the "
            f"5.x proxy {proxy} within {timeout:.0f} s; the other {len(missing)} (the first "
            f"{missing[0]}) are not in their topics (never duplicated: the brokers discard a "
            "half message after transactionCheckMax checks). Check that the brokers check back "
            "(transactionCheckInterval) or write through the brokers' name servers")
    log.info("rocketmq sink job %s: all %d rows settled through the proxy in %.1f s", job,
             stored, time.monotonic() - started)
    return stored
