"""writeStream.format("rocketmq"): a read-transform-write pipeline from one topic to another,
checkpointed, stopped and restarted, and its driver killed mid-batch (in a process of its own,
tests/sink_pipeline.py): every input message reaches the output at least once, and a message
sent again after the kill carries the message id of its first copy."""
from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path
from typing import List

import pytest

from app_process import AppProcess
from rocketmq_spark.client.protocol.codes import RequestCode
from source_helpers import produce
from waiting import wait_until

PIPELINE = Path(__file__).resolve().parent / "sink_pipeline.py"


def total(cluster, topic: str) -> int:
    return sum(cluster.max_offset(topic, b.name, q) for b in cluster.brokers for q in range(4))


def output(spark, namesrv: str, topic: str):
    rows = (spark.read.format("rocketmq").option("nameServer", namesrv)
            .option("subscribe", topic).option("includeProperties", "true").load()
            .selectExpr("CAST(body AS STRING) AS body", "keys", "tags", "msgId",
                        "properties['src'] AS src").collect())
    by_key = defaultdict(list)
    for r in rows:
        by_key[int(r.keys)].append(r)
    return rows, by_key


def transform_and_write(spark, namesrv: str, source: str, sink: str, checkpoint: str):
    out = (spark.readStream.format("rocketmq").option("nameServer", namesrv)
           .option("subscribe", source).option("startingOffsets", "earliest").load()
           .selectExpr("upper(CAST(body AS STRING)) AS body", "keys", "'T' AS tags",
                       "map('src', concat_ws('/', brokerName, CAST(queueId AS STRING), "
                       "CAST(queueOffset AS STRING))) AS properties"))
    query = (out.writeStream.format("rocketmq").option("nameServer", namesrv)
             .option("topic", sink).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    assert query.awaitTermination(240), "the query did not finish"
    assert query.exception() is None, query.exception()
    return query


def test_read_transform_write_restarts_from_its_checkpoint(spark, embedded_cluster_session,
                                                           unique_name, tmp_path):
    cluster = embedded_cluster_session
    source, sink = unique_name("StreamIn"), unique_name("StreamOut")
    cluster.create_topic(source, 4)
    cluster.create_topic(sink, 4)
    checkpoint = str(tmp_path / "cp")
    produce(cluster.namesrv_addr, source, range(0, 3000))
    first = transform_and_write(spark, cluster.namesrv_addr, source, sink, checkpoint)
    assert total(cluster, sink) == 3000
    produce(cluster.namesrv_addr, source, range(3000, 5000))
    second = transform_and_write(spark, cluster.namesrv_addr, source, sink, checkpoint)
    assert first.id == second.id, "one query, restarted from its checkpoint"

    rows, by_key = output(spark, cluster.namesrv_addr, sink)
    assert sorted(by_key) == list(range(5000)) and len(rows) == 5000, \
        "a clean stop and restart sends each message once"
    assert all(r.body == f"M{r.keys}" and r.tags == "T" for r in rows)
    assert len({r.msgId for r in rows}) == 5000
    assert len({r.src for r in rows}) == 5000


# ------------------------------------------------------------------ driver SIGKILL


class Pipeline(AppProcess):
    """tests/sink_pipeline.py in a process of its own: start, kill, drain."""

    def __init__(self, namesrv: str, source: str, sink: str, work: Path, *extra: str):
        super().__init__([sys.executable, str(PIPELINE), "--namesrv", namesrv, "--source",
                          source, "--sink", sink, "--work", str(work), "--stop-file",
                          str(work / "stop"), *extra], work, "pipeline", stop_file=work / "stop")

    def start(self, mode: str = "run") -> "Pipeline":
        return super().start("--mode", mode)

    def batches(self, folder: str) -> List[int]:
        path = self.work / "cp" / folder
        return sorted(int(p.name) for p in path.iterdir() if p.name.isdigit()) \
            if path.exists() else []


@pytest.mark.slow  # two Spark drivers in a subprocess: 1-3 minutes on two cores
@pytest.mark.timeout(900)
def test_after_a_driver_sigkill_resent_messages_keep_their_ids(spark, embedded_cluster,
                                                               unique_name, tmp_path):
    cluster = embedded_cluster
    source, sink = unique_name("KillIn"), unique_name("KillOut")
    cluster.create_topic(source, 4)
    cluster.create_topic(sink, 4)
    n = 6_000
    produce(cluster.namesrv_addr, source, range(n))
    # Every sink request waits 50 ms at the broker, and requests are small, so a micro-batch
    # takes a while to write and the kill lands while part of it has been sent.
    cluster.delay_next(10 ** 6, 0.05, request_codes=[RequestCode.SEND_BATCH_MESSAGE])
    pipeline = Pipeline(cluster.namesrv_addr, source, sink, tmp_path, "--max-per-trigger",
                        "2000", "--sink-option", "maxBatchBytes=4096")
    pipeline.start()
    pipeline.wait_for(lambda e: e["event"] == "progress" and e["rows"] > 0, 300,
                      "a first batch")
    # Event-based, so it holds on a loaded machine: a batch is part-way written once the
    # output grew after the batch was first seen planned and before it is committed.
    first_seen: dict = {}

    def batch_being_written() -> bool:
        offsets, commits = pipeline.batches("offsets"), pipeline.batches("commits")
        if not (offsets and commits and offsets[-1] > commits[-1]):
            return False
        if first_seen.get("batch") != offsets[-1]:
            first_seen.update(batch=offsets[-1], out=total(cluster, sink), commits=commits)
            return False
        return total(cluster, sink) > first_seen["out"] and commits == first_seen["commits"]

    wait_until(batch_being_written, 120, "a micro-batch part-way written", interval=0.02)
    pipeline.kill()
    cluster.clear_faults()
    pipeline.start()
    pipeline.drain()

    rows, by_key = output(spark, cluster.namesrv_addr, sink)
    assert sorted(by_key) == list(range(n)), "every input message reached the output"
    duplicated = {k: rs for k, rs in by_key.items() if len(rs) > 1}
    assert duplicated, "the killed micro-batch was replayed"
    for key, copies in duplicated.items():
        assert len({r.msgId for r in copies}) == 1, f"key {key}: {[r.msgId for r in copies]}"
        assert len({r.src for r in copies}) == 1
    assert len({r.msgId for r in rows}) == n, "distinct messages, distinct ids"
