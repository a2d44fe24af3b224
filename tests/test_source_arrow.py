"""Decoded columns -> the RecordBatch the Spark source yields (rocketmq_spark.source.arrow).

The schema must equal pyspark's own conversion exactly, every value must equal what the
one-message-at-a-time decoder gives, and a real local Spark must accept and read the batches.
"""
from __future__ import annotations

import datetime as dt
import sys

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketmq_spark.client.protocol.message import decode_messages, encode_stored_message
from rocketmq_spark.client.protocol.pull_decode import SCHEMA, decode_columns
from rocketmq_spark.source.arrow import (
    arrow_schema, empty_spark_batch, properties_map, spark_schema, to_spark_batch,
)

pyspark = pytest.importorskip("pyspark")
from pyspark.sql.datasource import DataSource, DataSourceReader  # noqa: E402
from pyspark.sql.pandas.types import to_arrow_schema  # noqa: E402

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
# Range that Python datetimes (to_pylist) can hold.
MS_MIN, MS_MAX = -62135596800000, 253402300799999


def record(i: int = 0, **kw) -> bytes:
    args = dict(topic="TopicTest", queue_id=i % 4, queue_offset=1000 + i,
                physical_offset=200 * i, body=b"body-%d" % i,
                properties=f"UNIQ_KEY\x01ID{i}\x02TAGS\x01TagA\x02KEYS\x01k{i}\x02",
                born_timestamp=1700000000123 + i, store_timestamp=1700000000456 + i,
                born_host="10.0.0.1:5555", store_host="10.0.0.2:10911", reconsume_times=i % 3)
    args.update(kw)
    return encode_stored_message(**args)


def expected_rows(body: bytes, broker: str, include_properties: bool):
    """The output rows as the scalar decoder sees the same records."""
    rows = []
    messages = list(decode_messages(body))
    for m in messages:
        row = {
            "topic": m.topic, "brokerName": broker, "queueId": m.queue_id,
            "queueOffset": m.queue_offset, "body": m.body, "tags": m.tags, "keys": m.keys,
            "msgId": m.msg_id,
            "bornTimestamp": EPOCH + dt.timedelta(milliseconds=m.born_timestamp),
            "storeTimestamp": EPOCH + dt.timedelta(milliseconds=m.store_timestamp),
            "bornHost": m.born_host, "storeHost": m.store_host,
            "reconsumeTimes": m.reconsume_times, "commitLogOffset": m.physical_offset,
            "queueTopic": messages[0].topic,  # by default the queue's topic is the rows'
        }
        if include_properties:
            # Arrow maps come back as (key, value) lists; dict order = first-occurrence order.
            row["properties"] = list(m.properties.items())
        rows.append(row)
    return rows


# --------------------------------------------------------------------------------------------
# Schema


@pytest.mark.parametrize("include_properties", [False, True])
def test_arrow_schema_is_pysparks_own_conversion(include_properties):
    want = to_arrow_schema(spark_schema(include_properties), timezone="UTC")
    got = arrow_schema(include_properties)
    assert got.equals(want, check_metadata=True)
    assert str(got) == str(want)
    for a, b in zip(got, want):  # nested fields too (map key/value names and nullability)
        assert a.nullable and a.type == b.type and str(a.type) == str(b.type)
    if include_properties:
        kind = got.field("properties").type
        assert kind.key_field.nullable is False and kind.item_field.nullable is True


def test_spark_schema_names_and_order():
    names = ["topic", "brokerName", "queueId", "queueOffset", "body", "tags", "keys", "msgId",
             "bornTimestamp", "storeTimestamp", "bornHost", "storeHost", "reconsumeTimes",
             "commitLogOffset", "queueTopic"]
    assert spark_schema().fieldNames() == names
    assert spark_schema(True).fieldNames() == names + ["properties"]
    assert all(f.nullable for f in spark_schema(True).fields)
    assert spark_schema(True)["properties"].dataType.simpleString() == "map<string,string>"


@pytest.mark.parametrize("include_properties", [False, True])
def test_pyspark_worker_accepts_the_batches(include_properties):
    """The exact check Spark's Python worker runs on a read() that yields RecordBatches."""
    from pyspark.sql.worker.plan_data_source_read import records_to_arrow_batches
    body = b"".join(record(i) for i in range(5))
    batch = to_spark_batch(decode_columns(body), "broker-a", include_properties)
    out = list(records_to_arrow_batches(iter([batch, batch.slice(2)]), 10000,
                                        spark_schema(include_properties), None))
    assert [b.num_rows for b in out] == [5, 3]


@pytest.mark.parametrize("include_properties", [False, True])
def test_empty_batches(include_properties):
    empty = empty_spark_batch(include_properties)
    assert empty.num_rows == 0 and empty.schema.equals(arrow_schema(include_properties))
    out = to_spark_batch(decode_columns(b""), "b", include_properties)
    assert out.num_rows == 0 and out.schema.equals(arrow_schema(include_properties))


# --------------------------------------------------------------------------------------------
# Values


def check(body: bytes, broker: str = "broker-a"):
    columns = decode_columns(body)
    for include in (False, True):
        out = to_spark_batch(columns, broker, include)
        assert out.schema.equals(arrow_schema(include))
        out.validate(full=True)
        assert out.to_pylist() == expected_rows(body, broker, include)


def test_typical_records():
    check(b"".join(record(i) for i in range(20)))


def test_timestamps_are_exact_microseconds():
    ms = [0, 1, -1, 1700000000123, MS_MIN, MS_MAX, 2 ** 53, -(2 ** 53)]
    body = b"".join(record(i, born_timestamp=v, store_timestamp=-v) for i, v in enumerate(ms))
    out = to_spark_batch(decode_columns(body), "b")
    assert out.column("bornTimestamp").type == pa.timestamp("us", tz="UTC")
    assert out.column("bornTimestamp").cast(pa.int64()).to_pylist() == [v * 1000 for v in ms]
    assert out.column("storeTimestamp").cast(pa.int64()).to_pylist() == [-v * 1000 for v in ms]
    assert out.column("bornTimestamp")[3].as_py() == dt.datetime(
        2023, 11, 14, 22, 13, 20, 123000, tzinfo=dt.timezone.utc)


def test_broker_name_is_a_plain_constant_column_of_any_length():
    one = decode_columns(record(1))
    for rows in (1, 3, 70000, 5, 140001):  # past the cached array's size, then back
        big = pa.Table.from_batches([one] * rows).combine_chunks().to_batches()[0]
        for name in ("broker-a", "broker-ü", ""):
            col = to_spark_batch(big, name).column("brokerName")
            assert col.type == pa.string() and len(col) == rows and col.null_count == 0
            assert col.unique().to_pylist() == [name]
            col.validate(full=True)


def test_queue_topic_is_the_constant_given_and_leaves_topic_alone():
    columns = decode_columns(b"".join(record(i) for i in range(4)))
    out = to_spark_batch(columns, "b", False, "%RETRY%group")
    assert out.column("queueTopic").to_pylist() == ["%RETRY%group"] * 4
    assert out.column("topic").to_pylist() == columns.column("topic").to_pylist()
    assert to_spark_batch(decode_columns(b""), "b", True, "T").column("queueTopic").to_pylist() \
        == []


def test_other_columns_are_the_decoders_arrays():
    columns = decode_columns(b"".join(record(i) for i in range(4)))
    out = to_spark_batch(columns, "b")
    for name, source in [("body", "body"), ("topic", "topic"), ("queueOffset", "queue_offset"),
                         ("msgId", "msg_id"), ("bornHost", "born_host")]:
        data = out.column(name).buffers()[-1]
        assert data.address == columns.column(source).buffers()[-1].address


def test_sliced_input():
    body = b"".join(record(i, properties=f"A\x01{i}\x02B\x01x\x02A\x01last{i}") for i in range(6))
    columns = decode_columns(body)
    out = to_spark_batch(columns.slice(2, 3), "b", include_properties=True)
    assert out.column("queueOffset").to_pylist() == [1002, 1003, 1004]
    assert out.column("properties").to_pylist() == [[("A", f"last{i}"), ("B", "x")]
                                                    for i in (2, 3, 4)]


def test_nulls_pass_through_and_null_properties_are_empty_maps():
    columns = decode_columns(b"".join(record(i) for i in range(3)))
    arrays = {name: columns.column(name) for name in SCHEMA.names}
    arrays["born_timestamp"] = pa.array([1, None, 3], pa.int64())
    arrays["properties"] = pa.array(["a\x01b", None, ""], pa.string())
    out = to_spark_batch(pa.RecordBatch.from_pydict(arrays, schema=SCHEMA), "b", True)
    assert out.column("bornTimestamp").cast(pa.int64()).to_pylist() == [1000, None, 3000]
    assert out.column("properties").to_pylist() == [[("a", "b")], [], []]
    assert out.column("properties").null_count == 0


@pytest.mark.parametrize("text, want", [
    ("", []),
    ("\x02", []),
    ("\x02\x02\x02", []),
    ("a\x01b", [("a", "b")]),
    ("a\x01b\x02", [("a", "b")]),
    ("\x02a\x01b\x02\x02", [("a", "b")]),
    ("a\x01", []),
    ("\x01b", []),
    ("a\x01\x02\x01b\x02ab\x02a", []),
    ("a\x01b\x01c", [("a", "b\x01c")]),          # the first \x01 separates
    ("a\x01\x01", [("a", "\x01")]),
    ("a\x01b\x02c\x01d\x02a\x01e", [("a", "e"), ("c", "d")]),  # first position, last value
    ("a\x01b\x02a\x01\x02", [("a", "b")]),       # an empty later value does not overwrite
    ("k\x011\x02k\x012\x02k\x013\x02j\x01x\x02k\x014", [("k", "4"), ("j", "x")]),
    ("é\x01中文\x02😀\x01ü", [("é", "中文"), ("😀", "ü")]),
])
def test_properties_rule(text, want):
    from rocketmq_spark.client.protocol.properties import decode_properties
    assert list(decode_properties(text).items()) == want  # the reference agrees
    got = properties_map(pa.array(["x\x01y", text, "z\x01w\x02z\x01v"], pa.string()))
    got.validate(full=True)
    assert got.to_pylist() == [[("x", "y")], want, [("z", "v")]]


def test_properties_all_empty_and_no_rows():
    assert properties_map(pa.array(["", "", "\x02"], pa.string())).to_pylist() == [[], [], []]
    empty = properties_map(pa.array([], pa.string()))
    assert len(empty) == 0 and empty.type == arrow_schema(True).field("properties").type


def test_duplicates_resolved_in_some_rows_only():
    texts = [f"A\x01{i}\x02B\x01b\x02" + ("A\x01dup\x02" if i % 3 == 0 else "C\x01c")
             for i in range(30)]
    got = properties_map(pa.array(texts, pa.string())).to_pylist()
    for i, row in enumerate(got):
        if i % 3 == 0:
            assert row == [("A", "dup"), ("B", "b")]
        else:
            assert row == [("A", str(i)), ("B", "b"), ("C", "c")]


# Property texts built item by item, so they can hold what encode_properties refuses:
# duplicates, empty names or values, stray separators, with or without a trailing \x02.
_NAMES = st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "a", "b", "ü", "中", "😀x", ""])
_TEXT = st.text(alphabet=st.sampled_from(["a", "b", "1", " ", "\x01", "é", "中", "😀", "\x00"]),
                max_size=6)
_ITEM = st.one_of(st.tuples(_NAMES, _TEXT).map(lambda kv: f"{kv[0]}\x01{kv[1]}"), _TEXT)
_PROPS = st.tuples(st.lists(_ITEM, max_size=8), st.booleans()).map(
    lambda t: "\x02".join(t[0]) + ("\x02" if t[1] and t[0] else ""))
_HOSTS = st.sampled_from(["127.0.0.1:10911", "10.1.2.3:1", "[::1]:10911", "[fe80::1]:9876"])
_MESSAGE = st.fixed_dictionaries({
    "topic": st.sampled_from(["T", "TopicTest", "主题", "t" * 200]),
    "queue_id": st.integers(0, 2 ** 31 - 1),
    "queue_offset": st.integers(0, 2 ** 63 - 1),
    "physical_offset": st.integers(0, 2 ** 63 - 1),
    "body": st.binary(max_size=64),
    "properties": _PROPS,
    "born_timestamp": st.integers(MS_MIN, MS_MAX),
    "store_timestamp": st.integers(MS_MIN, MS_MAX),
    "born_host": _HOSTS,
    "store_host": _HOSTS,
    "reconsume_times": st.integers(-2 ** 31, 2 ** 31 - 1),
})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_MESSAGE, max_size=12), st.sampled_from(["broker-a", "b", "ブローカー"]))
def test_every_column_matches_the_scalar_decoder(messages, broker):
    check(b"".join(encode_stored_message(**m) for m in messages), broker)


# --------------------------------------------------------------------------------------------
# A real Spark read: proof that Spark accepts the schema and the batches


class ArrowTestDataSource(DataSource):
    """Decodes the hex pull body given as an option, in the Python worker, and yields it as
    two RecordBatches (the second a slice)."""

    @classmethod
    def name(cls):
        return "rocketmq_arrow_test"

    def schema(self):
        return spark_schema(self.options.get("properties") == "true")

    def reader(self, schema):
        return ArrowTestReader(self.options)


class ArrowTestReader(DataSourceReader):
    def __init__(self, options):
        self.body = bytes.fromhex(options["body"])
        self.broker = options["broker"]
        self.properties = options.get("properties") == "true"

    def read(self, partition):
        from rocketmq_spark.client.protocol.pull_decode import decode_columns as decode
        from rocketmq_spark.source.arrow import to_spark_batch
        columns = decode(self.body)
        half = columns.num_rows // 2
        yield to_spark_batch(columns.slice(0, half), self.broker, self.properties)
        yield to_spark_batch(columns.slice(half), self.broker, self.properties)


@pytest.fixture
def spark(spark):
    """The shared session; the Python workers cannot import this test module, so its classes
    travel by value."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        yield spark
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


@pytest.mark.parametrize("include_properties", [False, True])
def test_spark_reads_the_batches(spark, include_properties):
    body = b"".join([
        record(0),
        record(1, properties="", body=b""),
        record(2, properties="TAGS\x01x\x02a\x01\x02b\x01c\x02TAGS\x01y\x02UNIQ_KEY\x01U2",
               born_host="[::1]:1", born_timestamp=-1, store_timestamp=MS_MAX),
        record(3, properties="KEYS\x01k 1\x02ü\x01中\x02", body=bytes(range(256)),
               topic="主题", reconsume_times=-5),
        record(4, born_timestamp=0),
    ])
    spark.dataSource.register(ArrowTestDataSource)
    df = (spark.read.format("rocketmq_arrow_test").option("body", body.hex())
          .option("broker", "broker-ü").option("properties", str(include_properties).lower())
          .load())
    assert df.schema == spark_schema(include_properties)
    want = expected_rows(body, "broker-ü", include_properties)

    # Exact microseconds, whatever the driver's local time zone does to collected datetimes.
    micros = df.selectExpr("queueOffset", "unix_micros(bornTimestamp) AS born",
                           "unix_micros(storeTimestamp) AS store").collect()
    assert [(r.born, r.store) for r in sorted(micros)] == [
        (m.born_timestamp * 1000, m.store_timestamp * 1000) for m in decode_messages(body)]

    rows = sorted(df.drop("bornTimestamp", "storeTimestamp").collect(),
                  key=lambda r: r.queueOffset)
    got = [r.asDict() for r in rows]
    for g, w in zip(got, want):
        g["body"] = bytes(g["body"])
        w = {k: v for k, v in w.items() if not k.endswith("Timestamp")}
        if include_properties:
            w["properties"] = dict(w["properties"])
        assert g == w
    assert len(got) == len(want)
