"""Exactly once from RocketMQ to RocketMQ through crashes: the read-transform-write pipeline
(tests/sink_pipeline.py, a process of its own) with ``deliveryGuarantee=exactlyOnce``, its
driver SIGKILLed at three points and one of its tasks failed mid-write; then Apache's C++
PushConsumer (tests/cpp_peer.py push) on the output topic receives every number exactly once.

The runs, one checkpoint, one query:

1. killed by the pipeline's kill hook (tests/sink_pipeline.py hands the sink a CommitObserver
   that SIGKILLs the driver) after the sink recorded micro-batch 1 as committed and before any
   END_TRANSACTION: the output holds batch 0 only, batch 1 waits as half messages;
   (20k variant: killed half-way through the END_TRANSACTIONs of batch 3; on 5.1 brokers,
   ``release="5.1"``, half-way through those of batch 1 instead of after its record;)
2. killed by the hook after the sink's commit of batch 3 (slow: 5) returned, before Spark's
   commit log was written: Spark replays that batch, which the sink has already committed;
3. every send held at the broker for a while; the next two sends of a micro-batch answered
   with an error that cannot be retried, so tasks fail mid-write and Spark runs them again
   (``local[2,4]``);
   then the driver SIGKILLed while a later micro-batch is being sent (half messages growing,
   nothing of that batch visible in the output topic);
4. restarted; 5 of its END_TRANSACTIONs are lost (the brokers' check-backs settle them);
   then drained (Trigger.AvailableNow).

The broker checks back pending half messages every second (``transaction_check_interval``) once
they are two seconds old, so check-backs reach the query during the runs: a half message of a
failed attempt or of a killed run that is committed by mistake shows up as a duplicate.
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional

import psutil
import pytest

from app_process import AppProcess
from waiting import wait_until
from rocketmq_spark.client.protocol.codes import RequestCode, ResponseCode
from rocketmq_spark.client.txn.transaction import END_TRANSACTION
from source_helpers import produce

TESTS = Path(__file__).resolve().parent
PIPELINE = TESTS / "sink_pipeline.py"
PEER = TESTS / "cpp_peer.py"
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
SEND_CODES = [RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2,
              RequestCode.SEND_BATCH_MESSAGE]
# Seconds each send is held in run 3, so a micro-batch takes a while. The sink writes up to
# 512 half messages per write and the embedded broker holds each request on its own timer,
# so a whole run waits this long once.
SEND_DELAY = 0.5
INJECTED = "injected: this task fails mid-write"
CHECK_INTERVAL, CHECK_TIMEOUT = 1.0, 2.0  # seconds; a genuine 4.x broker: 60 s and 6 s

pytestmark = [
    pytest.mark.cpp,
    pytest.mark.skipif(importlib.util.find_spec("rocketmq") is None,
                       reason="needs PyPI rocketmq 0.4.4 (Apache's C++ client)"),
]


class Pipeline(AppProcess):
    """tests/sink_pipeline.py with ``deliveryGuarantee=exactlyOnce``: start, kill, drain."""

    def __init__(self, namesrv: str, source: str, sink: str, work: Path, *extra: str):
        super().__init__([sys.executable, str(PIPELINE), "--namesrv", namesrv, "--source",
                          source, "--sink", sink, "--work", str(work), "--stop-file",
                          str(work / "stop"), "--guarantee", "exactlyOnce", *extra], work,
                         "pipeline", stop_file=work / "stop")

    def start(self, *extra: str, mode: str = "run") -> "Pipeline":
        return super().start("--mode", mode, *extra)

    def batches(self, folder: str) -> List[int]:
        path = self.work / "cp" / folder
        return sorted(int(p.name) for p in path.iterdir() if p.name.isdigit()) \
            if path.exists() else []

    def sink_recorded(self, batch: int) -> bool:
        """Whether the sink has recorded ``batch`` as committed: its END_TRANSACTIONs may go
        out from then on, before Spark writes its own commit log."""
        return (self.work / "cp" / "rocketmq-sink" / "committed" / f"{batch}.json").exists()

    def rows_through(self, batch: int) -> int:
        """Input rows of micro-batches 0..batch: the end offsets Spark logged for ``batch``
        (the source topic is read from offset 0)."""
        lines = (self.work / "cp" / "offsets" / str(batch)).read_text().splitlines()
        logged = json.loads(lines[-1])
        table = logged.get("queues", logged)  # {"version": 2, "queues": {...}} or the table
        return sum(v for k, v in table.items() if "/" in k)

    def wait_killed_by_hook(self, timeout: float = 240) -> None:
        """Wait until the pipeline's kill hook has SIGKILLed the driver JVM (the script then dies of
        its lost gateway), then clear away what is left of the process group."""
        def ended() -> bool:
            for event in self.run_events:
                assert event["event"] not in ("failed", "drained"), \
                    f"the pipeline ended on its own instead of being killed: {event}"
            return self.proc.poll() is not None

        wait_until(ended, timeout, "the kill hook to fire (the pipeline process to end)")
        jvm = self.jvm_pid()
        assert jvm is not None and not alive(jvm), "the driver JVM outlived the hook"
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # Python workers the JVM left behind
        except ProcessLookupError:
            pass
        self.events.append({"event": "killed"})


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def total(cluster, topic: str, queues: int = 4) -> int:
    return sum(cluster.max_offset(topic, b.name, q) for b in cluster.brokers
               for q in range(queues))


def halves(cluster) -> int:
    """Half messages stored so far, check-back copies included (the half topic has one queue
    on each broker)."""
    return sum(cluster.max_offset(HALF_TOPIC, b.name, 0) for b in cluster.brokers)


HELD = 10 ** 6  # sends the delay rule of run 3 may hold: more than the test ever makes


def sends_held(cluster) -> int:
    """Send requests the delay rule has held so far: a counter of the sink's sends (check-back
    copies of half messages are made inside the broker and are not counted)."""
    return sum(HELD - r.remaining for r in list(cluster.faults.rules) if r.kind == "delay")


def checks_sent(cluster) -> int:
    """CHECK_TRANSACTION_STATE requests the brokers have sent to a registered producer."""
    return sum(cluster.transaction_stats(b.name)["checks_sent"] for b in cluster.brokers)


def mid_batch(cluster, pipeline: Pipeline, sink: str, after: int) -> int:
    """Wait until a micro-batch later than ``after`` is being sent: Spark logged its offsets
    but not its commit, and the sink's sends go on while the output topic does not grow
    (nothing of the batch is visible before it commits). Returns the batch id.

    Event-based, so it holds on a loaded machine: the batch counts as being sent once the
    broker has held more of the sink's sends than when the batch was first seen planned."""
    first_seen: Dict[str, int] = {}

    def batch_being_sent() -> Optional[tuple]:  # a tuple, so that batch 0 counts as found
        assert pipeline.proc.poll() is None, "the pipeline exited"
        offsets, commits = pipeline.batches("offsets"), pipeline.batches("commits")
        if not (offsets and offsets[-1] > after and (not commits or offsets[-1] > commits[-1])):
            return None
        batch = offsets[-1]
        if first_seen.get("batch") != batch:
            first_seen.update(batch=batch, sent=sends_held(cluster), out=total(cluster, sink))
            return None
        if (sends_held(cluster) <= first_seen["sent"] or batch in pipeline.batches("commits")
                or pipeline.sink_recorded(batch)):  # not sent yet, or committed meanwhile
            return None
        assert total(cluster, sink) == first_seen["out"], \
            f"rows of micro-batch {batch} became visible before the sink committed it"
        return (batch,)

    (batch,) = wait_until(batch_being_sent, 180,
                          "a micro-batch caught while its half messages were being sent",
                          interval=0.02)
    return batch


def consume_with_cpp_push(namesrv: str, topic: str, expect: int) -> List[dict]:
    """Apache's C++ PushConsumer, a fresh group, until ``expect`` messages arrived and 5 s
    more (a late duplicate would arrive then)."""
    out = subprocess.run(
        [sys.executable, str(PEER), "push", "--namesrv", namesrv, "--topic", topic, "--group",
         f"eo-check-{topic}", "--expect", str(expect), "--timeout", "180", "--linger", "5",
         "--props", "src"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])["messages"]


def killed_by_hook(cluster, pipeline: Pipeline, sink: str, point: str, batch: int) -> None:
    """Run the pipeline until its kill hook kills the driver at ``point`` of ``batch``, then
    check what the output and the sink's record show at that point."""
    pipeline.start("--kill-at", f"{point}:{batch}")
    pipeline.wait_killed_by_hook()
    assert batch in pipeline.batches("offsets") and batch not in pipeline.batches("commits")
    record = pipeline.work / "cp" / "rocketmq-sink"
    assert (record / "committed" / f"{batch}.json").exists(), f"batch {batch} not recorded"
    ended = (record / "ended" / str(batch)).exists()
    before, through = pipeline.rows_through(batch - 1), pipeline.rows_through(batch)
    if point == "after_commit":
        assert ended
        wait_until(lambda: total(cluster, sink) >= through, 30,
                   f"batches 0-{batch} in the output after the sink committed batch {batch}")
        time.sleep(0.5)
        assert total(cluster, sink) == through, \
            f"the output holds {total(cluster, sink)} messages for {through} rows: duplicates"
        return
    assert not ended
    if point == "after_record":  # (younger than transaction_timeout: not checked back yet)
        assert total(cluster, sink) == before, \
            f"batch {batch} is recorded, none of its END_TRANSACTIONs sent: only 0-{batch - 1}"
    else:  # mid_end: COMMIT sent for the first half of the batch's rows
        wait_until(lambda: total(cluster, sink) > before, 30, "the first half's COMMITs")
    assert total(cluster, sink) <= through


def run_kills(cluster, tmp_path: Path, n: int, per_trigger: int,
              hooks: List[tuple]) -> Dict[str, int]:
    source, sink = "EoKillIn", "EoKillOut"
    cluster.create_topic(source, 4)
    cluster.create_topic(sink, 4)
    produce(cluster.namesrv_addr, source, range(n))
    last_hook = hooks[-1][1]
    assert n // per_trigger >= last_hook + 5, "the scenario needs more micro-batches"
    pipeline = Pipeline(cluster.namesrv_addr, source, sink, tmp_path, "--max-per-trigger",
                        str(per_trigger), "--task-max-failures", "4")
    seen: Dict[str, int] = {}

    # 1-2. killed by the pipeline's kill hooks: after the record of a batch (before any of its
    # END_TRANSACTIONs), [half-way through them,] after its commit (before Spark's commit log)
    for point, batch in hooks:
        killed_by_hook(cluster, pipeline, sink, point, batch)

    # 3. a task fails mid-write (Spark runs it again), then the driver dies mid-batch
    pipeline.start()
    pipeline.wait_for(lambda e: e["event"] == "progress" and e["batch"] >= last_hook, 240,
                      f"the replay of batch {last_hook}")
    cluster.delay_next(HELD, SEND_DELAY, request_codes=SEND_CODES)
    failed_batch = mid_batch(cluster, pipeline, sink, after=last_hook)
    cluster.clear_faults()  # rules are taken in order: the failure first, then the delays
    cluster.fail_next(2, ResponseCode.MESSAGE_ILLEGAL, INJECTED,
                      request_codes=SEND_CODES)
    cluster.delay_next(HELD, SEND_DELAY, request_codes=SEND_CODES)
    wait_until(lambda: all(r.kind != "fail" for r in list(cluster.faults.rules)), 60,
               "the injected send failure")
    # A refused half message fails its task once the rest of its run (512 requests held by
    # the delay rule together) is answered: wait for the failure before the next kill.
    run_log = tmp_path / f"pipeline-{pipeline.starts - 1}.log"
    wait_until(lambda: INJECTED in run_log.read_text(errors="replace"), 120,
               "a task failing on the injected error")
    wait_until(lambda: failed_batch in pipeline.batches("commits"), 240,
               f"batch {failed_batch} committed after its failed task ran again")
    killed_batch = mid_batch(cluster, pipeline, sink, after=failed_batch)
    pipeline.kill()
    cluster.clear_faults()
    log = (tmp_path / f"pipeline-{pipeline.starts - 1}.log").read_text(errors="replace")
    assert INJECTED in log, "no task failed on the injected error"
    seen.update(failed_batch=failed_batch, killed_batch=killed_batch)

    # 4. restart; lose a few END_TRANSACTIONs on the way: the brokers ask the query's
    # responder about those half messages and it settles them from the record (batches are
    # too quick for a half message to wait the 2 s a broker leaves before asking on its own);
    # then drain
    cluster.drop_next(5, request_codes=[END_TRANSACTION])
    pipeline.start()
    wait_until(lambda: all(r.kind != "drop" for r in list(cluster.faults.rules)), 240,
               "END_TRANSACTIONs to drop")
    wait_until(lambda: checks_sent(cluster) > 0, 60, "a check-back about a dropped one")
    wait_until(lambda: total(cluster, sink) == n, 240,
               "every row visible, the dropped ones committed by check-back")
    pipeline.drain()
    assert total(cluster, source) == n
    seen["output_stored"] = total(cluster, sink)
    seen["half_messages"] = halves(cluster)
    seen["checks_sent"] = checks_sent(cluster)
    assert seen["checks_sent"] > 0, "no check-back reached the query"

    messages = consume_with_cpp_push(cluster.namesrv_addr, sink, n)
    keys = Counter(int(m["keys"]) for m in messages)
    missing = sorted(set(range(n)) - set(keys))
    duplicated = sorted(k for k, c in keys.items() if c > 1)
    assert not missing and not duplicated, \
        f"{len(missing)} missing (first {missing[:10]}), {len(duplicated)} duplicated " \
        f"(first {duplicated[:10]}); {seen}"
    assert len(messages) == n
    assert all(m["body"] == f"M{m['keys']}" for m in messages)
    assert len({m["properties"]["src"] for m in messages}) == n
    assert seen["output_stored"] == n, f"the output topic stores duplicates: {seen}"
    return seen


def transactional_cluster(factory, release: str = "4.9"):
    return factory(brokers=2, transaction_check_interval=CHECK_INTERVAL,
                   transaction_timeout=CHECK_TIMEOUT, release=release)


# Where the driver is killed, per release. Under 5.1 the brokers write op messages as
# comma-joined offsets, in batches up to 3 s late (.embedded.op_batches): a kill half-way
# through the END_TRANSACTIONs makes the restart decide by the op topic which rows to commit,
# and the brokers' check-backs about copies of rows already committed are answered from it.
# (No after_commit kill there: 5.1 mode serves END_TRANSACTION on the Python path, and the
# embedded broker drops what a killed connection had queued, so the batch's last rows show only
# once the restarted query answers their check-backs; the replay it tests is the same in both.)
KILLS = {"4.9": [("after_record", 1), ("after_commit", 3)],
         "5.1": [("mid_end", 1), ("after_record", 3)]}


@pytest.mark.slow  # four Spark driver starts, 3-4 minutes on two cores: over CI's budget
@pytest.mark.timeout(600)
@pytest.mark.parametrize("release", sorted(KILLS))
def test_exactly_once_through_three_driver_kills_and_a_failed_task(embedded_cluster_factory,
                                                                    tmp_path, release):
    """5,000 numbers in micro-batches of 500, on brokers behaving as 4.9.8's and as 5.1.4's
    (CI runs tests/test_sink_exactly_once.py: the same guarantees without the driver
    kills)."""
    run_kills(transactional_cluster(embedded_cluster_factory, release), tmp_path, 5_000, 500,
              KILLS[release])


@pytest.mark.slow  # 20,000 numbers, four Spark drivers: several minutes on two cores
@pytest.mark.timeout(1200)
def test_exactly_once_20k_through_three_driver_kills_and_a_failed_task(
        embedded_cluster_factory, tmp_path):
    run_kills(transactional_cluster(embedded_cluster_factory), tmp_path, 20_000, 2_000,
              [("after_record", 1), ("mid_end", 3), ("after_commit", 5)])
