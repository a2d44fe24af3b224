"""The sink's pure parts, without Spark or sockets: column encodings against the one-message
codecs, options, the input schema, row checks, message ids and request planning."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.types import (
    ArrayType, BinaryType, DoubleType, IntegerType, LongType, MapType, StringType, StructField,
    StructType,
)

from rocketmq_spark.client.send.producer import queue_for_key
from rocketmq_spark.client.protocol.properties import decode_properties, java_string_hash
from rocketmq_spark.client.protocol.message import BatchEntry, decode_batch, encode_batch
from rocketmq_spark.client.protocol.route import MessageQueue
from rocketmq_spark.client.protocol.send_encode import (
    encode_entries, entries_body, java_string_hashes, join_pieces, map_properties,
    property_piece,
)
from rocketmq_spark.options import OptionError
from rocketmq_spark.sink.ids import TaskIdentity, message_id, message_ids
from rocketmq_spark.sink.options import parse_sink_options
from rocketmq_spark.sink.requests import cut_by_bytes, plan_requests
from rocketmq_spark.sink.rows import RowError, normalize
from rocketmq_spark.sink.schema import SchemaError, plan_columns
from rocketmq_spark.sink.transport import Prepared

NS = {"nameServer": "127.0.0.1:9876"}
JOB = TaskIdentity("job", "tok", None, 3)
text = st.text(alphabet=st.characters(blacklist_characters="\x01\x02",
                                      blacklist_categories=("Cs",)), max_size=12)


# ------------------------------------------------------------------ column encodings


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=300), text, st.integers(0, 2 ** 31 - 1)),
                min_size=1, max_size=30), st.data())
def test_entries_are_the_batch_codec_row_by_row(rows, data):
    flag = rows[0][2]
    entries = encode_entries(pa.array([b for b, _, _ in rows], pa.binary()),
                             pa.array([p for _, p, _ in rows], pa.string()), flag)
    expected = [BatchEntry(b, p, flag) for b, p, _ in rows]
    assert entries_body(entries, np.arange(len(rows))) == encode_batch(expected)
    order = data.draw(st.permutations(range(len(rows))))
    body = entries_body(entries, np.array(order))
    assert decode_batch(body) == [expected[i] for i in order]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(max_size=40)), max_size=40))
def test_string_hashes_are_javas(values):
    hashes = java_string_hashes(pa.array(values, pa.string()))
    assert [int(h) for h in hashes] == [java_string_hash(v) if v is not None else 0
                                        for v in values]


def test_queue_for_key_matches_javas_select_by_hash():
    queues = [MessageQueue("T", b, q) for b in ("broker-a", "broker-b") for q in range(4)]
    # String.hashCode() of "order-7" is negative: Java takes |h| mod n.
    assert java_string_hash("order-7") < 0
    assert queue_for_key(queues, "order-7") == queues[abs(java_string_hash("order-7")) % 8]


def test_properties_of_a_map_column_and_pieces():
    maps = pa.array([[("a", "1"), ("b", "2")], None, [], [("c", "3")]],
                    pa.map_(pa.string(), pa.string()))
    text_ = join_pieces([map_properties(maps),
                         property_piece("TAGS", pa.array(["t", None, "u", None]))])
    assert [decode_properties(v.decode()) for v in text_.to_pylist()] == [
        {"a": "1", "b": "2", "TAGS": "t"}, {}, {"TAGS": "u"}, {"c": "3"}]
    assert map_properties(maps.slice(2)).to_pylist() == [None, b"c\x013\x02"]


# ------------------------------------------------------------------ message ids


def test_message_ids_depend_on_the_rows_place_only():
    a = TaskIdentity("stream", "query-1", 7, 2)
    assert message_ids(a, 10, 3).to_pylist() == [message_id(a, r) for r in (10, 11, 12)]
    assert message_id(a, 10) == message_id(TaskIdentity("stream", "query-1", 7, 2), 10)
    others = {message_id(TaskIdentity("stream", "query-1", 8, 2), 10),
              message_id(TaskIdentity("stream", "query-1", 7, 3), 10),
              message_id(TaskIdentity("stream", "query-2", 7, 2), 10),
              message_id(TaskIdentity("job", "query-1", 7, 2), 10), message_id(a, 11)}
    assert message_id(a, 10) not in others and len(others) == 5
    assert len(message_id(a, 10)) == 32 and message_id(a, 10) == message_id(a, 10).upper()


# ------------------------------------------------------------------ options


@pytest.mark.parametrize("options, match", [
    ({}, "option nameServer is required"),
    ({**NS, "endpoints": "h:8081"}, "not both"),
    ({**NS, "topc": "T"}, "unknown option.*topc"),
    ({**NS, "path": "/x"}, "has no path"),
    ({**NS, "topic": "bad topic"}, "option topic: 'bad topic' is not a valid topic"),
    ({**NS, "sendTimeoutMs": "soon"}, "option sendTimeoutMs must be a whole number"),
    ({**NS, "retries": "-1"}, "option retries must be between 0 and 100"),
    ({**NS, "maxBatchBytes": str(64 * 1024 * 1024)}, "option maxBatchBytes must be between"),
    ({**NS, "maxInFlightPerBroker": "0"}, "option maxInFlightPerBroker"),
    ({**NS, "acceptStatuses": "FLUSH_DISK_TIMEOUT,MAYBE"}, "acceptStatuses: 'MAYBE'"),
    ({**NS, "accessKey": "ak"}, "accessKey and secretKey go together"),
    ({**NS, "tls": "yes"}, "option tls must be true or false"),
    ({**NS, "producerGroup": "a b"}, "option producerGroup 'a b'"),
    ({"nameServer": "nohost"}, "option nameServer: .*not host:port"),
])
def test_bad_options_name_the_option(options, match):
    with pytest.raises(OptionError, match=match):
        parse_sink_options(options)


def test_options_defaults_and_spark_added_ones():
    o = parse_sink_options({**NS, "checkpointLocation": "/c", "queryName": "q", "TOPIC": "T",
                            "acceptStatuses": "flush_disk_timeout", "accessKey": "AK",
                            "secretKey": "SECRET"})
    assert o.topic == "T" and o.name_servers == ("127.0.0.1:9876",) and not o.tls
    assert o.accept_statuses == ("SEND_OK", "FLUSH_DISK_TIMEOUT")
    assert (o.compress_over, o.max_batch_bytes, o.retries) == (4096, 1024 * 1024, 2)
    assert "SECRET" not in repr(o) and "AK" not in repr(o)
    grpc = parse_sink_options({"endpoints": "proxy:8081"})
    assert grpc.transport == "grpc" and grpc.tls, "TLS is on by default for endpoints"


# ------------------------------------------------------------------ the input schema

def schema(*fields) -> StructType:
    return StructType([StructField(n, t) for n, t in fields])


@pytest.mark.parametrize("fields, match", [
    ([("value", BinaryType())], "column 'value' is not one the rocketmq sink writes"),
    ([("body", DoubleType())], "column 'body' must be binary or string, got double"),
    ([("body", StringType()), ("keys", ArrayType(LongType()))],
     "column 'keys' must be string or array<string>"),
    ([("body", StringType()), ("properties", MapType(StringType(), LongType()))],
     "column 'properties' must be map<string,string>"),
    ([("body", StringType()), ("delayLevel", StringType())], "column 'delayLevel' must be int"),
    ([("tags", StringType())], "needs a body column"),
    ([("body", StringType()), ("BODY", StringType())], "both name the body column"),
])
def test_bad_columns_name_the_column(fields, match):
    with pytest.raises(SchemaError, match=match):
        plan_columns(schema(*fields), "T")


def test_a_topic_is_required_somewhere():
    with pytest.raises(SchemaError, match="no topic"):
        plan_columns(schema(("body", StringType())), None)
    plan = plan_columns(schema(("Body", StringType()), ("topic", StringType()),
                               ("KEYS", ArrayType(StringType())),
                               ("delaylevel", IntegerType())), None)
    assert (plan.body, plan.keys, plan.keys_is_array, plan.delay_level) == (
        "Body", "KEYS", True, "delaylevel")


# ------------------------------------------------------------------ row checks


def rows_of(**columns):
    batch = pa.RecordBatch.from_pydict(columns)
    fields = []
    for name, column in zip(batch.schema.names, batch.columns):
        t = column.type
        spark_type = (BinaryType() if pa.types.is_binary(t) else
                      IntegerType() if pa.types.is_integer(t) else
                      ArrayType(StringType()) if pa.types.is_list(t) else
                      MapType(StringType(), StringType()) if pa.types.is_map(t) else
                      StringType())
        fields.append((name, spark_type))
    options = parse_sink_options({**NS, "topic": "T"})
    return normalize(batch, plan_columns(schema(*fields), "T"), options, JOB, 100)


MAP = pa.map_(pa.string(), pa.string())


@pytest.mark.parametrize("columns, match", [
    (dict(body=pa.array([b"a", None])), r"row 101 \(partition 3\): the body is null"),
    (dict(body=["a", "b"], topic=["T", "no way"]), "row 101 .*'no way' is not a valid topic"),
    (dict(body=["a"], properties=pa.array([[("UNIQ_KEY", "x")]], MAP)),
     "row 100 .*property 'UNIQ_KEY' is a name RocketMQ reserves"),
    (dict(body=["a", "b"], properties=pa.array([[], [("DELAY", "3")]], MAP)),
     "row 101 .*property 'DELAY' is a name RocketMQ reserves"),
    (dict(body=["a"], properties=pa.array([[("ok", None)]], MAP)),
     "property 'ok' has a null value"),
    (dict(body=["a"], properties=pa.array([[("ok", "")]], MAP)), "property 'ok' has an empty"),
    (dict(body=["a"], tags=["x\x01y"]), "the tags value contains"),
    (dict(body=["a", "b"], keys=pa.array([["k"], ["k", None]])), "row 101 .*null key"),
    (dict(body=["a", "b"], delayLevel=[0, 19]), "row 101 .*delayLevel 19 is not a delay level"),
])
def test_bad_rows_name_the_row(columns, match):
    with pytest.raises(RowError, match=match):
        rows_of(**columns)


def test_rows_are_normalized():
    rows = rows_of(body=["a", "b", "c"], keys=pa.array([["k1", "k2"], [], None]),
                   tags=["t", "", None], shardingKey=["s", "", None], delayLevel=[None, 0, 3],
                   topic=[None, "U", None])
    assert rows.keys.to_pylist() == ["k1 k2", None, None]
    assert rows.tags.to_pylist() == ["t", None, None]
    assert rows.sharding_key.to_pylist() == ["s", None, None]
    assert rows.delay.tolist() == [0, 0, 3]
    assert rows.topic.to_pylist() == ["T", "U", "T"], "the topic option fills null topics"
    assert rows.ids.to_pylist() == [message_id(JOB, r) for r in (100, 101, 102)]


# ------------------------------------------------------------------ requests


def test_cut_by_bytes_keeps_order_and_limit():
    sizes = np.array([5, 5, 5, 20, 1, 1])
    parts = [p.tolist() for p in cut_by_bytes(np.arange(6), sizes, 10)]
    assert parts == [[0, 1], [2], [3], [4, 5]]
    parts = [p.tolist() for p in cut_by_bytes(np.arange(6), np.ones(6), 10, max_rows=4)]
    assert parts == [[0, 1, 2, 3], [4, 5]]


def test_requests_keep_each_keys_rows_in_order_on_one_queue():
    n = 200
    keys = [f"order-{i % 7}" if i % 5 else None for i in range(n)]
    rows = rows_of(body=[f"b{i}" for i in range(n)], shardingKey=keys,
                   delayLevel=[2 if i == 50 else 0 for i in range(n)])
    klass = np.zeros(n, np.int8)
    klass[60:70] = 1  # compressed rows never share a request with plain ones
    prepared = Prepared(rows, np.full(n, 10), klass)
    queues = [MessageQueue("T", b, q) for b in ("broker-a", "broker-b") for q in range(4)]
    seen = {}
    requests = list(plan_requests(prepared, lambda topic: queues, 100))
    for topic, queue, index, single in requests:
        assert topic == "T" and len({int(klass[i]) for i in index}) == 1
        assert sum(10 for _ in index) <= 100 or len(index) == 1
        if single:
            assert index.tolist() == [50]
        for i in index:
            seen.setdefault(keys[i], []).append((queue, int(i)))
    assert sorted(i for v in seen.values() for _, i in v) == list(range(n))
    for key, placed in seen.items():
        if key is None:
            assert {q for q, _ in placed} == {None}, "keyless rows: queue chosen later"
        else:
            assert {q for q, _ in placed} == {queue_for_key(queues, key)}
            assert [i for _, i in placed] == sorted(i for _, i in placed), "row order kept"
