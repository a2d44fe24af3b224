"""``.schema(...)`` on a rocketmq read: refused before any task unless it is the source's own
schema (Spark's Kafka source refuses any: "Kafka source has a fixed schema and cannot be set
with a custom one"). Without the check Spark fails inside the tasks with
DATA_SOURCE_RETURN_SCHEMA_MISMATCH."""
from __future__ import annotations

import pytest

from rocketmq_spark.source.schema import spark_schema
from source_helpers import produce, run_available_now

REFUSED = r"the rocketmq source has a fixed schema and cannot be set with a custom one"


@pytest.fixture
def filled(cluster, topic):
    produce(cluster.namesrv_addr, topic, range(20))
    return topic


def batch(spark, cluster, topic, schema, **options):
    r = spark.read.schema(schema).format("rocketmq").option("nameServer", cluster.namesrv_addr)
    for k, v in {"subscribe": topic, **options}.items():
        r = r.option(k, v)
    return r.load()


def stream(spark, cluster, topic, schema, **options):
    r = spark.readStream.schema(schema).format("rocketmq") \
        .option("nameServer", cluster.namesrv_addr)
    for k, v in {"subscribe": topic, "startingOffsets": "earliest", **options}.items():
        r = r.option(k, v)
    return r.load()


@pytest.mark.parametrize("schema, names", [
    ("value STRING", r"column 1 is value:string, the source's is topic:string"),
    (spark_schema().simpleString()[len("struct<"):-1].replace(":", " ").replace(",", ", ")
     + ", extra INT", r"the source has no column extra:int"),
    (spark_schema(True), r"the source has no column properties:map<string,string>"),
])
def test_batch_read_refuses_another_schema_naming_the_column(spark, cluster, filled, schema,
                                                              names):
    with pytest.raises(Exception, match=REFUSED) as err:
        batch(spark, cluster, filled, schema).collect()
    assert names.replace("\\", "") in str(err.value)
    assert "DATA_SOURCE_RETURN_SCHEMA_MISMATCH" not in str(err.value)


def test_stream_refuses_another_schema_at_start(spark, cluster, filled, tmp_path):
    df = stream(spark, cluster, filled, "topic STRING, body BINARY")
    with pytest.raises(Exception, match=REFUSED) as err:
        query = df.writeStream.format("noop").option("checkpointLocation",
                                                     str(tmp_path / "cp")).start()
        try:
            query.awaitTermination(120)
        finally:
            query.stop()
    assert "column 2 is body:binary, the source's is brokerName:string" in str(err.value)


def test_the_sources_own_schema_is_accepted_batch_and_stream(spark, cluster, filled, tmp_path):
    own = spark_schema().simpleString()[len("struct<"):-1]
    ddl = ", ".join(f"{name} {kind}" for name, kind in (f.split(":", 1) for f in own.split(",")))
    rows = batch(spark, cluster, filled, ddl).collect()
    assert len(rows) == 20 and rows[0].topic == filled

    with_props = batch(spark, cluster, filled, spark_schema(True), includeProperties="true")
    assert with_props.count() == 20

    df = stream(spark, cluster, filled, spark_schema(True), includeProperties="true")
    query = run_available_now(spark, df, str(tmp_path / "cp"))
    got = spark.table(query.table_name).collect()
    assert sorted(r.body for r in got) == sorted(f"m{n}".encode() for n in range(20))
    assert all(r.properties is not None for r in got)
