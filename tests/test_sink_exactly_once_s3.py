"""The exactly-once sink with its record on S3 (moto's server on loopback, over S3's HTTP API),
in real Spark queries.

This machine's Spark cannot keep its own checkpoint on S3 (pyspark ships no hadoop-aws jar),
so Spark's checkpoint stays on the local disk and ``checkpointStorage.location`` places the
sink's record on S3; the query id is read from the local ``metadata`` through the same layer.
On a cluster whose ``checkpointLocation`` is ``s3a://b/p``, the record goes to
``s3://b/p/rocketmq-sink`` without that option (tests/test_storage.py checks the mapping).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from rocketmq_spark.sink.commit_record import open_record, spark_checkpoint
from rocketmq_spark.sink.exactly_once import responder_log_dir
from rocketmq_spark.storage import StorageOptions, spark_log
from s3_server import s3_server_fixture  # noqa: F401 (the fixture s3_server)
from source_helpers import produce


def visible(cluster, topic: str) -> int:
    return sum(cluster.max_offset(topic, b.name, q) for b in cluster.brokers for q in range(4))


def _stream(spark, cluster, source: str, sink: str, checkpoint: str, options: dict):
    writer = (spark.readStream.format("rocketmq").option("nameServer", cluster.namesrv_addr)
              .option("subscribe", source).option("startingOffsets", "earliest")
              .option("maxMessagesPerTrigger", "300").load()
              .selectExpr("CAST(body AS STRING) AS body")
              .writeStream.format("rocketmq").option("nameServer", cluster.namesrv_addr)
              .option("topic", sink).option("deliveryGuarantee", "exactlyOnce")
              .option("checkpointLocation", checkpoint))
    for key, value in options.items():
        writer = writer.option(key, value)
    return writer.trigger(availableNow=True)


def _files_text(root) -> str:
    return "\n".join(p.read_text(errors="replace") for p in root.rglob("*") if p.is_file())


def test_exactly_once_with_the_record_on_s3_through_a_restart(spark, embedded_cluster_factory,
                                                               unique_name, s3_server,
                                                               tmp_path):
    cluster = embedded_cluster_factory(brokers=2, transaction_check_interval=30,
                                       transaction_timeout=6)
    source, sink = unique_name("EoS3In"), unique_name("EoS3Out")
    cluster.create_topic(source, 4)
    cluster.create_topic(sink, 4)
    s3_server.create_bucket("eo-record")
    options = s3_server.options(location="s3a://eo-record/q1/rocketmq-sink")
    checkpoint = tmp_path / "cp"
    produce(cluster.namesrv_addr, source, range(900))
    for run in range(2):  # the second run: a restart on the same checkpoint and record
        query = _stream(spark, cluster, source, sink, str(checkpoint), options).start()
        assert query.awaitTermination(240)
        assert query.exception() is None, query.exception()
        if run == 0:
            produce(cluster.namesrv_addr, source, range(900, 1200))
    assert visible(cluster, sink) == 1200
    keys = s3_server.keys("eo-record", "q1/rocketmq-sink/")
    committed = [k for k in keys if "/committed/" in k]
    assert len(committed) >= 4 and len([k for k in keys if "/ended/" in k]) == len(committed)
    assert "q1/rocketmq-sink/responder.lease" in keys
    log = open_record(str(checkpoint), StorageOptions.from_raw(options))
    assert log.pending() == [] and log.committed_ids() == sorted(log.committed_ids())
    spark_cp = spark_checkpoint(str(checkpoint), StorageOptions.from_raw(options))
    assert spark_log.committed_batches(spark_cp) == log.committed_ids(), \
        "Spark's commit log (read through the storage layer) and the record disagree"
    assert spark_log.query_id(spark_cp) == log.committed(log.committed_ids()[-1]).query_id
    responder_log = Path(responder_log_dir(log)) / "responder.log"
    assert "answering check-backs" in responder_log.read_text()
    assert s3_server.secret_key not in responder_log.read_text()
    assert not (checkpoint / "rocketmq-sink").exists(), "the record went to the local disk"
    text = _files_text(checkpoint)
    assert s3_server.secret_key not in text and s3_server.access_key not in text
    body = "".join(s3_server.client().get_object(Bucket="eo-record", Key=k)["Body"].read()
                   .decode(errors="replace") for k in keys)
    assert s3_server.secret_key not in body


@pytest.mark.parametrize("case", ["unknown scheme", "no bucket", "refused key"])
def test_bad_record_storage_fails_the_query_at_its_start(spark, embedded_cluster_factory,
                                                         unique_name, s3_server, tmp_path,
                                                         case):
    cluster = embedded_cluster_factory(brokers=1)
    source, sink = unique_name("EoS3BadIn"), unique_name("EoS3BadOut")
    cluster.create_topic(source, 4)
    cluster.create_topic(sink, 4)
    produce(cluster.namesrv_addr, source, range(50))
    s3_server.create_bucket("eo-bad")
    options, named = {
        "unknown scheme": (s3_server.options(location="ftp://eo-bad/rec"), "scheme ftp:"),
        "no bucket": (s3_server.options(location="s3://eo-missing/rec"),
                      "the bucket 'eo-missing' does not exist"),
        "refused key": (s3_server.options(location="s3://eo-bad/rec",
                                          secretKey="SKrefused8Q2"), "'eo-bad' cannot be read"),
    }[case]
    before = len(s3_server.requests())
    query = _stream(spark, cluster, source, sink, str(tmp_path / "cp"), options).start()
    with pytest.raises(Exception) as info:
        query.awaitTermination(120)
    text = str(info.value)
    assert named in text, text[-2000:]
    assert "SKrefused8Q2" not in text and s3_server.secret_key not in text
    assert visible(cluster, sink) == 0
    writes = [r for r in s3_server.requests()[before:] if r.startswith(("PUT", "POST"))
              and r.split()[1].startswith(("/eo-bad", "/eo-missing"))]
    assert writes == [] and s3_server.keys("eo-bad") == []
    assert not (tmp_path / "cp" / "commits").exists() or \
        not list((tmp_path / "cp" / "commits").iterdir())
