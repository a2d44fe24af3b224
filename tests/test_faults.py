"""Exactly-once under faults: a checkpointed pipeline (tests/fault_pipeline.py, in a process of
its own) reads uniquely numbered messages from several topics on 2 brokers into two
exactly-once sinks while the test kills its driver, fails its tasks, stops brokers and the name
server, truncates queues, grows topics and moves the consumer group. Afterwards both sinks must
hold every message exactly once, in queue order within each queue.

CI runs the driver-kill, task-failure and broker-restart scenarios (the first and last on
``local-cluster[2,1,1024]``: executors in their own JVMs and Python workers); the others are
marked ``slow`` (``ci/test.sh -m slow``).
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional

import psutil
import pytest

from app_process import AppProcess
from feeder import PacedFeeder
from waiting import wait_until
from rocketmq_spark.client import Message, Producer
from rocketmq_spark.client.admin import Admin
from rocketmq_spark.client.protocol.codes import RequestCode, ResponseCode
from rocketmq_spark.source.offsets import queue_offsets

PIPELINE = Path(__file__).resolve().parent / "fault_pipeline.py"
LOCAL_CLUSTER = "local-cluster[2,1,1024]"
N = 20_000
TOPICS = ("FaultA", "FaultB", "FaultC")


# ------------------------------------------------------------------------------ harness


class Pipeline(AppProcess):
    """The pipeline process: start it, kill it, let it drain; its JSON events are kept."""

    def __init__(self, namesrv: str, work: Path, master: str = "local[2]", *extra: str):
        super().__init__([sys.executable, str(PIPELINE), "--namesrv", namesrv, "--topics",
                          ",".join(TOPICS), "--work", str(work), "--master", master,
                          "--stop-file", str(work / "stop"), *extra],
                         work, "pipeline", stop_file=work / "stop")

    def start(self, mode: str = "run", timeout: float = 120) -> "Pipeline":
        return super().start("--mode", mode, timeout=timeout)

    def mid_batch(self) -> bool:
        """A batch is planned in the offset log and not yet in the commit log."""
        def last(folder: str) -> int:
            path = self.work / "cp-file" / folder
            ids = [int(p.name) for p in path.iterdir() if p.name.isdigit()] if path.exists() \
                else []
            return max(ids, default=-1)
        return last("offsets") > last("commits") >= 0


class Feeder(PacedFeeder):
    """Sends messages numbered 0..n-1 (key = number) to the topics in batches of 100, in the
    background; every send must succeed, so each number is stored exactly once."""

    def __init__(self, namesrv: str, n: int = N, rate: float = 2000.0):
        super().__init__(namesrv, n, rate)
        self.queues_only = None  # a callable picking allowed queues (broker outages)
        self.pause_at: Optional[int] = None  # hold there until resume is set
        self.resume = threading.Event()

    def feed(self, producer: Producer) -> None:
        for chunk, start in enumerate(range(0, self.n, 100)):
            if self.pause_at is not None and start >= self.pause_at:
                self.resume.wait(300)
                self.restart_pace()
            topic = TOPICS[chunk % len(TOPICS)]
            msgs = [Message(topic, f"fault-{i}".encode(), keys=str(i))
                    for i in range(start, min(start + 100, self.n))]
            queue = None
            if self.queues_only is not None:
                allowed = [q for q in producer.queues(topic, refresh=True)
                           if self.queues_only(q)]
                queue = allowed[chunk % len(allowed)]
            producer.send_batch(msgs, queue=queue)
            self.pace(len(msgs))


@pytest.fixture
def cluster(embedded_cluster):
    for topic in TOPICS:
        embedded_cluster.create_topic(topic, queues=4)
    return embedded_cluster


# ------------------------------------------------------------------------------ checks


def read_sinks(spark, work: Path):
    columns = ["topic", "brokerName", "queueId", "queueOffset", "keys"]
    file_rows = spark.read.parquet(str(work / "file")).select(*columns).collect()
    batch_rows = spark.read.parquet(str(work / "batches")).select(*columns, "batch").collect()
    return file_rows, batch_rows


def assert_exactly_once_in_queue_order(rows, n: int, what: str) -> None:
    keys = [int(r["keys"]) for r in rows]
    assert len(keys) == n, f"{what}: {len(keys)} rows for {n} messages"
    assert sorted(keys) == list(range(n)), f"{what}: messages missing or duplicated"
    per_queue = defaultdict(list)
    for r in rows:
        per_queue[(r["topic"], r["brokerName"], r["queueId"])].append(
            (r["queueOffset"], int(r["keys"])))
    for queue, items in per_queue.items():
        items.sort()
        assert [o for o, _ in items] == list(range(len(items))), f"{what}: gap in {queue}"
        numbers = [k for _, k in items]
        assert numbers == sorted(numbers), f"{what}: {queue} out of producer order"


def assert_batches_in_queue_order(rows, what: str) -> None:
    """Within a queue, a later batch id holds only later offsets."""
    ranges = defaultdict(lambda: defaultdict(list))
    for r in rows:
        ranges[(r["topic"], r["brokerName"], r["queueId"])][r["batch"]].append(r["queueOffset"])
    for queue, by_batch in ranges.items():
        spans = [(b, min(o), max(o)) for b, o in sorted(by_batch.items())]
        for (_, _, hi), (_, lo, _) in zip(spans, spans[1:]):
            assert hi < lo, f"{what}: batches of {queue} overlap or go back: {spans}"


def verify(spark, work: Path, n: int = N) -> None:
    file_rows, batch_rows = read_sinks(spark, work)
    assert_exactly_once_in_queue_order(file_rows, n, "file sink")
    assert_exactly_once_in_queue_order(batch_rows, n, "foreachBatch sink")
    assert_batches_in_queue_order(batch_rows, "foreachBatch sink")


def committed_batches(checkpoint: Path) -> Dict[int, dict]:
    """End offsets of the batches in the commit log, from the offset log."""
    out = {}
    for path in (checkpoint / "offsets").iterdir():
        if path.name.isdigit() and (checkpoint / "commits" / path.name).exists():
            out[int(path.name)] = queue_offsets(json.loads(path.read_text().splitlines()[-1]))
    return out


def replay_audit(spark, namesrv: str, work: Path, batches: int = 5) -> int:
    """Re-read committed batches' ranges with spark.read and compare them, by hash, with what
    the foreachBatch sink holds for those batch ids."""
    ends = committed_batches(work / "cp-batches")
    audited = 0
    for batch_id in sorted(ends)[1:][-batches:]:
        start, end = ends.get(batch_id - 1), ends[batch_id]
        if start is None or start == end:
            continue
        again = (spark.read.format("rocketmq").option("nameServer", namesrv)
                 .option("subscribe", ",".join(TOPICS))
                 .option("startingOffsets", json.dumps(start))
                 .option("endingOffsets", json.dumps(end)).load()
                 .select("topic", "brokerName", "queueId", "queueOffset", "keys", "body",
                         "msgId").collect())
        stored = spark.read.parquet(str(work / "batches" / f"batch={batch_id:09d}")).select(
            "topic", "brokerName", "queueId", "queueOffset", "keys", "body", "msgId").collect()

        def digest(rows) -> str:
            return hashlib.sha256(repr(sorted(tuple(r) for r in rows)).encode()).hexdigest()

        assert digest(again) == digest(stored), f"batch {batch_id} replays differently"
        audited += 1
    return audited


# ------------------------------------------------------------------------------ scenarios


@pytest.mark.timeout(900)
def test_driver_sigkill_mid_batch_several_times_on_local_cluster(spark, cluster, tmp_path):
    pipeline = Pipeline(cluster.namesrv_addr, tmp_path, LOCAL_CLUSTER, "--max-per-trigger",
                        "3000")
    feeder = Feeder(cluster.namesrv_addr, rate=1500).start()
    pipeline.start()
    kills = 0
    for _ in range(3):
        pipeline.wait_for(lambda e: e["event"] == "progress" and e["rows"] > 0, 180,
                          "a batch with rows")
        wait_until(pipeline.mid_batch, 60, "a batch planned and not yet committed",
                   interval=0.01)
        pipeline.kill()
        kills += 1
        pipeline.start()
    feeder.join()
    pipeline.drain()
    verify(spark, tmp_path)
    assert kills == 3 and pipeline.starts == 4
    assert pipeline.ready()["executors"] == 2  # executors in JVMs of their own
    assert replay_audit(spark, cluster.namesrv_addr, tmp_path) >= 3


@pytest.mark.timeout(600)
def test_task_failures_are_retried_without_loss_or_duplicates(spark, cluster, tmp_path):
    pipeline = Pipeline(cluster.namesrv_addr, tmp_path, "local[2,4]", "--max-per-trigger",
                        "4000")
    feeder = Feeder(cluster.namesrv_addr, rate=1000).start()  # reads go on for ~20 s
    pipeline.start()
    pipeline.wait_for(lambda e: e["event"] == "progress" and e["rows"] > 0, 120, "progress")
    # An exception inside read(): the broker refuses pulls with an error nothing retries.
    cluster.fail_next(3, ResponseCode.NO_PERMISSION, "the topic is not readable now",
                      request_codes=[RequestCode.PULL_MESSAGE])
    wait_until(lambda: not cluster._call(lambda: len(cluster.faults.rules)), 120,
               "the three refusals to be used up")
    # The refused task's last retry must be done before workers die, or one task could use up
    # its 4 attempts: wait for a batch that started after the refusals.
    seen = len(pipeline.events)
    pipeline.wait_for(lambda e: e["event"] == "progress" and e["rows"] > 0
                      and pipeline.events.index(e) > seen + 1, 120, "a batch after the refusals")
    log = tmp_path / "pipeline-0.log"
    # A killed Python worker inside read(): the broker holds every pull for a second, so a read
    # lasts long enough to be caught, and the forked Python workers are killed until Spark logs
    # that a task's worker crashed (the task is then retried). Idle workers just respawn.
    cluster.delay_next(1_000_000, 1.0, request_codes=[RequestCode.PULL_MESSAGE])
    killed = 0

    def worker_crash_logged() -> bool:
        nonlocal killed
        if "Python worker exited unexpectedly" in log.read_text():
            return True
        for pid in python_workers(pipeline.proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        return False

    wait_until(worker_crash_logged, 90, "Spark to log a task's crashed Python worker",
               interval=1.5)
    cluster.clear_faults()
    assert killed >= 1, "no Python worker was reading to kill"
    feeder.join()
    pipeline.drain()
    verify(spark, tmp_path)
    assert not any(e["event"] == "failed" for e in pipeline.events)
    logs = (tmp_path / "pipeline-0.log").read_text()
    assert "NO_PERMISSION" in logs, "the broker's refusal failed a task (then retried)"
    assert "Python worker exited unexpectedly" in logs, "a killed worker failed a task"


def python_workers(root_pid: int) -> List[int]:
    """Forked Python workers (children of a pyspark.daemon pyspark.worker process) under
    ``root_pid``."""
    found = []
    for daemon in psutil.Process(root_pid).children(recursive=True):
        try:
            cmdline = " ".join(daemon.cmdline())
            if "pyspark.daemon" in cmdline and "pyspark.worker" in cmdline:
                found += [worker.pid for worker in daemon.children()]
        except psutil.NoSuchProcess:
            continue
    return found


@pytest.mark.timeout(900)
def test_broker_stopped_for_30_seconds_mid_stream_on_local_cluster(spark, cluster, tmp_path):
    pipeline = Pipeline(cluster.namesrv_addr, tmp_path, LOCAL_CLUSTER, "--max-per-trigger",
                        "3000")
    feeder = Feeder(cluster.namesrv_addr, rate=600).start()
    pipeline.start()
    pipeline.wait_for(lambda e: e["event"] == "progress" and e["rows"] > 0, 180, "progress")
    feeder.queues_only = lambda q: q.broker_name == "broker-b"
    time.sleep(1.0)  # sends in flight to broker-a finish first
    cluster.broker("broker-a").stop()
    stopped = time.monotonic()
    time.sleep(30)
    cluster.broker("broker-a").start()
    feeder.queues_only = None
    outage = time.monotonic() - stopped
    feeder.join()
    pipeline.drain()
    verify(spark, tmp_path)
    assert outage >= 30
    assert pipeline.starts == 1, "the query rode the outage out without a restart"
    assert pipeline.ready()["executors"] == 2


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_broker_gone_for_a_while_then_restart_from_checkpoint(spark, cluster, tmp_path):
    pipeline = Pipeline(cluster.namesrv_addr, tmp_path, "local[2]")
    feeder = Feeder(cluster.namesrv_addr, rate=4000)
    feeder.queues_only = lambda q: q.broker_name == "broker-b" or sent_before_outage()
    sent_before_outage = lambda: feeder.sent < N // 4  # noqa: E731
    feeder.start()
    pipeline.start()
    pipeline.wait_for(lambda e: e["event"] == "progress" and e["rows"] > 0, 120, "progress")
    wait_until(lambda: feeder.sent >= N // 4, 120, "a quarter of the messages sent")
    time.sleep(1.0)
    cluster.broker("broker-a").stop()      # gone, data kept
    pipeline.drain()                       # the query ends while broker-a is away
    feeder.join()
    cluster.broker("broker-a").start()     # back later; the query restarts from its checkpoint
    pipeline.start(mode="drain")
    pipeline.wait_for(lambda e: e["event"] == "drained", 300, "the drain")
    verify(spark, tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_name_server_restart_mid_stream(spark, cluster, tmp_path):
    pipeline = Pipeline(cluster.namesrv_addr, tmp_path, "local[2]")
    feeder = Feeder(cluster.namesrv_addr, rate=1500).start()
    pipeline.start()
    pipeline.wait_for(lambda e: e["event"] == "progress" and e["rows"] > 0, 120, "progress")
    cluster.stop_namesrv()
    time.sleep(10)
    cluster.start_namesrv()
    feeder.join()
    pipeline.drain()
    verify(spark, tmp_path)
    assert pipeline.starts == 1


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_retention_past_the_checkpoint(spark, cluster, tmp_path, fail_on_data_loss):
    options = [] if fail_on_data_loss else ["--option", "failOnDataLoss=false"]
    pipeline = Pipeline(cluster.namesrv_addr, tmp_path, "local[2]", *options)
    Feeder(cluster.namesrv_addr, n=N // 2, rate=10_000).start().join()
    pipeline.start(mode="drain")
    pipeline.wait_for(lambda e: e["event"] == "drained", 300, "the first drain")
    # The second half, then retention deletes 50 messages past the checkpoint of one queue.
    with Producer(cluster.namesrv_addr) as rest:
        for chunk, start in enumerate(range(N // 2, N, 100)):
            topic = TOPICS[chunk % len(TOPICS)]
            rest.send_batch([Message(topic, f"fault-{i}".encode(), keys=str(i))
                             for i in range(start, min(start + 100, N))])
    with Admin(cluster.namesrv_addr) as admin:
        queue = admin.queues(TOPICS[0], refresh=True)[0]
        checkpoint_end = queue_offsets(json.loads(sorted(
            (tmp_path / "cp-file" / "offsets").iterdir(),
            key=lambda p: int(p.name) if p.name.isdigit() else -1)[-1].read_text()
            .splitlines()[-1]))[queue.key]
    cluster.truncate(queue.topic, queue.broker_name, queue.queue_id, checkpoint_end + 50)
    pipeline.start(mode="drain")
    if fail_on_data_loss:
        with pytest.raises(AssertionError) as err:
            pipeline.wait_for(lambda e: e["event"] == "drained", 300, "the second drain")
        text = str(err.value)
        assert queue.key in text and f"[{checkpoint_end}, {checkpoint_end + 50})" in text
        return
    pipeline.wait_for(lambda e: e["event"] == "drained", 300, "the second drain")
    file_rows, batch_rows = read_sinks(spark, tmp_path)
    for rows in (file_rows, batch_rows):
        keys = sorted(int(r["keys"]) for r in rows)
        assert len(keys) == len(set(keys)) == N - 50
    logs = "".join(p.read_text() for p in tmp_path.glob("pipeline-*.log"))
    assert f"skipped 50 lost messages of {queue.key}" in logs  # logged, with the count


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_topic_expanded_mid_stream(spark, cluster, tmp_path):
    pipeline = Pipeline(cluster.namesrv_addr, tmp_path, "local[2]")
    feeder = Feeder(cluster.namesrv_addr, rate=1500)
    feeder.pause_at = N // 2
    feeder.start()
    pipeline.start()
    pipeline.wait_for(lambda e: e["event"] == "progress" and e["rows"] > 0, 120, "progress")
    wait_until(lambda: feeder.sent >= N // 2, 120, "half of the messages sent")
    for topic in TOPICS:
        cluster.add_queues(topic, 8)
    feeder.queues_only = lambda q: q.queue_id >= 4  # the second half goes to the new queues
    feeder.resume.set()
    feeder.join()
    pipeline.drain()
    verify(spark, tmp_path)
    rows, _ = read_sinks(spark, tmp_path)
    fresh = [r for r in rows if r["queueId"] >= 4]
    assert len(fresh) == N // 2 and min(r["queueOffset"] for r in fresh) == 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_consumer_group_reset_from_outside_does_not_move_the_query(spark, cluster, tmp_path):
    pipeline = Pipeline(cluster.namesrv_addr, tmp_path, "local[2]", "--option",
                        "consumerGroup=fault-group")
    feeder = Feeder(cluster.namesrv_addr, rate=1500).start()
    pipeline.start()
    pipeline.wait_for(lambda e: e["event"] == "progress" and e["rows"] > 0, 120, "progress")
    with Admin(cluster.namesrv_addr) as admin:
        for _ in range(3):
            queues = [q for t in TOPICS for q in admin.queues(t, refresh=True)]
            assert admin.commit_offsets("fault-group", {q: 0 for q in queues}) == {}
            time.sleep(2)
    feeder.join()
    pipeline.drain()
    verify(spark, tmp_path)
