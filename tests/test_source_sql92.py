"""SQL92 property filters in the source: options, pulls, gaps, the broker's refusal, membership.

Messages come from Apache's C++ producer (``tests/cpp_peer.py``) with user properties; the
embedded broker runs with ``enable_property_filter=True`` (4.9.8's ``enablePropertyFilter``)
and filters on its side, as the genuine one does (capture ``rocketmq-4.9.8-sql92``). What each
expression should select is computed here from the properties the producer set, with the
rules of Apache's SQL92 filter (a missing property is NULL; a comparison, BETWEEN or IN on NULL
is NULL; NOT NULL is NULL; AND/OR are three-valued; only TRUE selects) written out plainly.
"""
from __future__ import annotations

import importlib.util
import json
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rocketmq_spark.client import QueueRangeReader, ReadSettings
from rocketmq_spark.client.admin import Admin
from rocketmq_spark.client.errors import FilterNotSupportedError
from rocketmq_spark.client.protocol.codes import RequestCode
from rocketmq_spark.client.protocol.frame import decode_frame
from rocketmq_spark.client.protocol.route import MessageQueue
from rocketmq_spark.options import OptionError
from rocketmq_spark.source.options import parse_source_options

from raw_client import RawClient  # noqa: E402  (tests/ is on sys.path)
from source_helpers import run_available_now  # noqa: E402
from waiting import wait_until  # noqa: E402

pytestmark = pytest.mark.skipif(importlib.util.find_spec("rocketmq") is None,
                                reason="needs PyPI rocketmq 0.4.4 (Apache's C++ client)")

PEER = Path(__file__).resolve().parent / "cpp_peer.py"
TOPIC = "SqlOrders"
COUNT = 96
REGIONS = ("eu", "us", "ap", None)


def message_properties(i: int) -> dict:
    """The user properties of message ``i`` (None: not set): a region (one in four has none),
    an amount (every seventh has none; 20 and 60, BETWEEN's bounds, occur) and a priority
    (one in three)."""
    props = {"region": REGIONS[i % 4], "amount": None if i % 7 == 3 else str((i * 5) % 90),
             "priority": "high" if i % 3 == 0 else None}
    return {k: v for k, v in props.items() if v is not None}


# The three expressions and, for each, its selection as Apache's rules make it.
def _between_and(p: dict) -> bool:
    # amount BETWEEN 20 AND 60 AND region = 'eu': both sides must be TRUE; a missing amount
    # or region makes its side NULL.
    amount_ok = "amount" in p and 20 <= int(p["amount"]) <= 60
    return amount_ok and p.get("region") == "eu"


def _in_or_is_null(p: dict) -> bool:
    # region IN ('us', 'ap') OR priority IS NULL: TRUE if either side is TRUE; IN on a missing
    # region is NULL (not TRUE); IS NULL is TRUE exactly when priority is missing.
    return p.get("region") in ("us", "ap") or "priority" not in p


def _not_is_not_null(p: dict) -> bool:
    # NOT (region = 'eu') AND priority IS NOT NULL: NOT of NULL is NULL, so a message without
    # a region never matches.
    return "region" in p and p["region"] != "eu" and "priority" in p


EXPRESSIONS = {
    "between_and": ("amount BETWEEN 20 AND 60 AND region = 'eu'", _between_and),
    "in_or_is_null": ("region IN ('us', 'ap') OR priority IS NULL", _in_or_is_null),
    "not_is_not_null": ("NOT (region = 'eu') AND priority IS NOT NULL", _not_is_not_null),
}


def expected_keys(rule) -> set:
    return {f"k{i}" for i in range(COUNT) if rule(message_properties(i))}


def run_peer(*args, stdin=None, timeout=120):
    proc = subprocess.run([sys.executable, str(PEER), *args], input=stdin, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"cpp_peer {args[0]} failed:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def produce_with_properties(namesrv: str, topic: str) -> None:
    specs = [{"body": f"order {i}", "tags": "Order", "keys": f"k{i}",
              "properties": message_properties(i)} for i in range(COUNT)]
    sent = run_peer("produce", "--namesrv", namesrv, "--topic", topic, "--group", "SqlProducer",
                    stdin=json.dumps(specs))["results"]
    assert [r.get("status") for r in sent] == ["OK"] * COUNT, sent


@pytest.fixture(scope="module")
def sql_cluster():
    """A cluster of its own: its broker has property filtering on (the session's has not)."""
    from rocketmq_spark.embedded import EmbeddedCluster

    cluster = EmbeddedCluster(brokers=1, enable_property_filter=True)
    cluster.start()
    cluster.create_topic(TOPIC, queues=4)
    produce_with_properties(cluster.namesrv_addr, TOPIC)
    try:
        yield cluster
    finally:
        cluster.stop()


def sql_read(spark, namesrv: str, expression: str, stream: bool = False, **extra):
    reader = (spark.readStream if stream else spark.read).format("rocketmq") \
        .option("nameServer", namesrv).option("subscribe", TOPIC) \
        .option("startingOffsets", "earliest") \
        .option("filterType", "SQL92").option("filter", expression)
    for k, v in extra.items():
        reader = reader.option(k, str(v))
    return reader.load()


# ------------------------------------------------------------------ what the reads select


@pytest.mark.parametrize("name", sorted(EXPRESSIONS))
def test_batch_read_selects_what_the_java_rules_select(spark, sql_cluster, name):
    expression, rule = EXPRESSIONS[name]
    want = expected_keys(rule)
    assert 0 < len(want) < COUNT  # the expression selects some messages, not all
    rows = sql_read(spark, sql_cluster.namesrv_addr, expression).select("keys", "tags") \
        .collect()
    got = [r["keys"] for r in rows]
    assert sorted(got) == sorted(want)  # each once: nothing dropped, nothing twice
    assert {r["tags"] for r in rows} == {"Order"}  # the tag check left the SQL92 rows alone


@pytest.mark.parametrize("name", sorted(EXPRESSIONS))
def test_available_now_stream_selects_what_the_java_rules_select(spark, sql_cluster, name,
                                                                  tmp_path):
    expression, rule = EXPRESSIONS[name]
    df = sql_read(spark, sql_cluster.namesrv_addr, expression, stream=True,
                  maxMessagesPerTrigger=40)  # offsets per batch: several batches
    query = run_available_now(spark, df, str(tmp_path / "cp"))
    got = [r["keys"] for r in spark.sql(f"select keys from {query.table_name}").collect()]
    assert sorted(got) == sorted(expected_keys(rule))
    # every micro-batch's range ended although many of them hold no match
    assert len(query.recentProgress) > 1


def test_filter_gaps_are_not_data_loss(sql_cluster):
    """Ranges where nothing matches end (one NO_MATCHED_MSG answer after another), with
    failOnDataLoss on and nothing counted lost; where a few match, the gaps are the offsets
    between them. On both pull loops (the reader counts gaps apart from loss)."""
    topic = "SqlGaps"
    sql_cluster.create_topic(topic, queues=1)
    for region in ("us", "eu", "us", "eu", "us"):  # 2,500 'us', 2 'eu' at 1000 and 2001
        sql_cluster.append(topic, "broker-a", 0, [b"g"] * (1000 if region == "us" else 1),
                           properties={"region": region})
    mq, end = MessageQueue(topic, "broker-a", 0), sql_cluster.max_offset(topic, "broker-a", 0)
    with Admin(sql_cluster.namesrv_addr) as admin:
        for native in (True, False):
            for expression, matches in (("region = 'nowhere'", []),
                                        ("region = 'eu'", [1000, 2001])):
                settings = ReadSettings(consumer_group="SqlGaps", subscription=expression,
                                        expression_type="SQL92", sub_version=1, native=native,
                                        fail_on_data_loss=True, retry_deadline=5.0)
                reader = QueueRangeReader(admin.brokers, admin.address, mq, 0, end, settings)
                offsets = [o for b in reader for o in b.column("queue_offset").to_pylist()]
                assert offsets == matches and reader.lost_ranges == []
                assert reader.filter_skipped == end - len(matches)
                assert reader.pulls >= 3  # the broker scans a window per pull, not the queue


# ------------------------------------------------------------------ bad expressions


@pytest.mark.parametrize("expression, column", [
    ("a >>> 3", 4),             # the capture's bad expression: the broker takes it as '*'
    ("region IN ('eu',", 17),   # ends inside the list
    ("amount BETWEEN 1", 17),   # BETWEEN without AND
])
def test_a_bad_expression_fails_on_the_driver_naming_the_option_and_column(expression, column):
    with pytest.raises(OptionError) as info:
        parse_source_options({"nameServer": "127.0.0.1:9876", "subscribe": TOPIC,
                              "filterType": "SQL92", "filter": expression}, streaming=False)
    text = str(info.value)
    assert "option filter" in text and f"(position {column})" in text, text


def test_a_bad_expression_fails_the_spark_read_before_any_task(spark, sql_cluster):
    with pytest.raises(Exception) as info:
        sql_read(spark, sql_cluster.namesrv_addr, "a >>> 3").collect()
    assert "option filter" in str(info.value) and "at column 4" in str(info.value)


def test_filter_type_tag_keeps_the_tag_rules():
    options = parse_source_options({"nameServer": "127.0.0.1:9876", "subscribe": TOPIC,
                                    "filter": "TagA || TagB"}, streaming=False)
    assert (options.filter_type, options.tags) == ("TAG", ["TagA", "TagB"])
    with pytest.raises(OptionError, match="option filterType must be one of TAG, SQL92"):
        parse_source_options({"nameServer": "127.0.0.1:9876", "subscribe": TOPIC,
                              "filterType": "REGEX"}, streaming=False)


# ------------------------------------------------------------------ the broker's refusal


def test_a_broker_without_property_filtering_fails_the_read_at_once(spark, tmp_path):
    """PullMessageProcessor.java (4.9.8) answers SYSTEM_ERROR "The broker does not support
    consumer to filter message by SQL92" when enablePropertyFilter is false (its default),
    as the capture rocketmq-4.9.8-sql92 shows; that is never retried."""
    from pyspark.errors import AnalysisException

    from rocketmq_spark.embedded import EmbeddedCluster

    with EmbeddedCluster(brokers=1) as plain:
        plain.create_topic(TOPIC, queues=2)
        produce_with_properties(plain.namesrv_addr, TOPIC)
        started = time.monotonic()
        with pytest.raises(Exception) as info:
            sql_read(spark, plain.namesrv_addr, "region = 'eu'").collect()
        assert "enablePropertyFilter=true" in str(info.value)
        # planning failed it (the driver's probe), not a task (which raises PythonException)
        assert isinstance(info.value, AnalysisException), type(info.value)
        with pytest.raises(Exception) as info:  # a stream too, while planning its batch
            run_available_now(spark, sql_read(spark, plain.namesrv_addr, "region = 'eu'",
                                              stream=True), str(tmp_path / "cp"), timeout=60)
        assert "enablePropertyFilter=true" in str(info.value)
        assert "planPartitions" in str(info.value)
        assert time.monotonic() - started < 30  # not the 60 s of retries a busy broker gets
        with Admin(plain.namesrv_addr) as admin:
            reader = QueueRangeReader(
                admin.brokers, admin.address, MessageQueue(TOPIC, "broker-a", 0), 0, 1,
                ReadSettings(consumer_group="g", subscription="region = 'eu'",
                             expression_type="SQL92"))
            with pytest.raises(FilterNotSupportedError):
                list(reader)
            assert reader.retries == 0


# ------------------------------------------------------------------ membership


def test_a_group_member_registers_its_sql92_subscription(spark, sql_cluster, tmp_path):
    expression = EXPRESSIONS["between_and"][0]
    group = "SqlMembers"
    df = sql_read(spark, sql_cluster.namesrv_addr, expression, stream=True,
                  consumerGroup=group, membership="group")
    query = df.writeStream.format("memory").queryName("sql_members") \
        .option("checkpointLocation", str(tmp_path / "cp")).start()
    try:
        address = sql_cluster.broker("broker-a").addr

        def registered():
            with RawClient(address) as raw:
                answer = raw.request(RequestCode.GET_CONSUMER_CONNECTION_LIST,
                                     {"consumerGroup": group})
            if answer.code != 0:
                return None
            listed = json.loads(answer.body)
            sub = listed["subscriptionTable"].get(TOPIC)
            return sub and (sub, listed["connectionSet"][0]["clientId"])
        sub, client_id = wait_until(registered, 60, "the group's subscription at the broker")
        assert sub["expressionType"] == "SQL92" and sub["subString"] == expression
        assert sub["tagsSet"] == [] and sub["codeSet"] == []
        assert sub["subVersion"] > 0
        # what mqadmin consumerStatus shows: the member's own running info, through the broker
        with Admin(sql_cluster.namesrv_addr) as admin:
            text = admin.brokers.get_consumer_running_info(address, group, client_id).decode()
        running = {s["topic"]: s for s in json.loads(
            re.search(r'"subscriptionSet":(\[.*\])\}$', text).group(1))}
        assert (running[TOPIC]["expressionType"], running[TOPIC]["subString"],
                running[TOPIC]["tagsSet"]) == ("SQL92", expression, [])
        want = expected_keys(EXPRESSIONS["between_and"][1])
        wait_until(lambda: len(spark.sql("select keys from sql_members").collect()) >= len(want),
                   120, "the member's rows")
        got = [r["keys"] for r in spark.sql("select keys from sql_members").collect()]
        assert sorted(got) == sorted(want)
    finally:
        query.stop()


# ------------------------------------------------------------------ the bytes on the wire


class RecordingProxy:
    """A TCP relay in front of one broker that keeps what the client sent."""

    def __init__(self, upstream: str):
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.addr = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.sent = bytearray()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False),
                             daemon=True).start()

    def _pump(self, src, dst, record: bool) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                for s in (src, dst):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return
            if record:
                with self._lock:
                    self.sent += data
            dst.sendall(data)

    def take_pulls(self) -> list:
        """The PULL_MESSAGE frames sent so far, their opaque (bytes 13-16) zeroed."""
        with self._lock:
            data, self.sent = bytes(self.sent), bytearray()
        frames, pos = [], 0
        while pos + 4 <= len(data):
            length = int.from_bytes(data[pos:pos + 4], "big")
            frame = data[pos:pos + 4 + length]
            pos += 4 + length
            if decode_frame(frame).code == RequestCode.PULL_MESSAGE:
                frames.append(frame[:13] + b"\0\0\0\0" + frame[17:])
        return frames

    def close(self) -> None:
        self.listener.close()


def test_both_pull_loops_send_the_same_bytes(sql_cluster):
    """The C loop and its Python twin put the same SQL92 pulls on the wire: subscription,
    expressionType SQL92, subVersion and the subscription bit of sysFlag (4), as Java's
    PullAPIWrapper.pullKernelImpl and the capture's requests carry them."""
    from rocketmq_spark.client.read.native_pull import why_python_pulls

    if why_python_pulls() is not None:
        pytest.skip(f"no C loop to compare: {why_python_pulls()}")
    expression = EXPRESSIONS["in_or_is_null"][0]
    proxy = RecordingProxy(sql_cluster.broker("broker-a").addr)
    mq = MessageQueue(TOPIC, "broker-a", 1)
    end = sql_cluster.max_offset(TOPIC, "broker-a", 1)
    sent = {}
    try:
        for native in (True, False):
            with Admin(sql_cluster.namesrv_addr) as admin:
                settings = ReadSettings(consumer_group="SqlBytes", subscription=expression,
                                        expression_type="SQL92", sub_version=1795633966879,
                                        max_msg_nums=4, native=native)
                reader = QueueRangeReader(admin.brokers, lambda *_: proxy.addr, mq, 0, end,
                                          settings)
                assert sum(b.num_rows for b in reader) > 0
                assert reader.path == ("native" if native else "python")
            sent[native] = proxy.take_pulls()
    finally:
        proxy.close()
    assert len(sent[True]) > 1 and sent[True] == sent[False]
    fields = decode_frame(sent[True][0]).ext_fields
    assert (fields["expressionType"], fields["subscription"], fields["subVersion"],
            fields["sysFlag"]) == ("SQL92", expression, "1795633966879", "4")
