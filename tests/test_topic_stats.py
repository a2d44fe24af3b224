"""Max and min offsets in one GET_TOPIC_STATS_INFO per topic and broker, and the fallback to one
GET_MAX_OFFSET per queue where the request is refused.

The embedded broker's answer follows 4.9.8's AdminBrokerProcessor.getTopicStatsInfo (and
TopicStatsTable / TopicOffset / MessageQueue.hashCode, read at apache/rocketmq, not run
against a genuine broker: no capture holds this answer). The refusal of the 5.x proxy's remoting
port is the one captured in shared/captures/rocketmq-5.1.4-proxy-remoting (seq 943/944).
Requests are counted at the embedded brokers, over real sockets.
"""
from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Dict, List, Tuple

import pytest

from rocketmq_spark.client.admin import Admin
from rocketmq_spark.client.errors import ProtocolError
from rocketmq_spark.client.protocol.codes import RequestCode, ResponseCode
from rocketmq_spark.client.protocol.properties import java_string_hash
from rocketmq_spark.client.protocol.route import MessageQueue
from rocketmq_spark.client.protocol.topic_stats import parse_topic_stats
from rocketmq_spark.client.topic_stats import REPROBE_SECONDS
from rocketmq_spark.embedded.cluster import EmbeddedCluster

from raw_client import RawClient

STATS = int(RequestCode.GET_TOPIC_STATS_INFO)
MAX = int(RequestCode.GET_MAX_OFFSET)


class Counted:
    """Requests a server's handler receives, by code (the handler wrapped in place)."""

    def __init__(self, handler_owner):
        self.codes: Counter = Counter()
        self._lock = threading.Lock()
        original = handler_owner.handle

        def counted(conn, cmd):
            with self._lock:
                self.codes[cmd.code] += 1
            return original(conn, cmd)
        handler_owner.handle = counted

    def take(self) -> Counter:
        with self._lock:
            out, self.codes = self.codes, Counter()
        return out


def count_brokers(cluster: EmbeddedCluster) -> Dict[str, Counted]:
    return {b.name: Counted(cluster._broker(b.name)) for b in cluster.brokers}


def java_hashmap_iteration(items: List[Tuple[int, str]]) -> List[str]:
    """Put ``(hashCode, value)`` pairs into a simulated java.util.HashMap (16 bins, doubled
    when more than 3/4 full, each bin split in order on a resize) and iterate it."""
    capacity, bins, size = 16, [[] for _ in range(16)], 0
    for h, value in items:
        h &= 0xFFFFFFFF
        spread = h ^ (h >> 16)
        bins[spread & (capacity - 1)].append((spread, value))
        size += 1
        if size > capacity * 0.75:
            capacity *= 2
            grown = [[] for _ in range(capacity)]
            for chain in bins:
                for entry in chain:
                    grown[entry[0] & (capacity - 1)].append(entry)
            bins = grown
    return [value for chain in bins for _, value in chain]


def mq_hash(topic: str, broker: str, queue_id: int) -> int:
    return 31 * (31 * (31 + java_string_hash(broker)) + queue_id) + java_string_hash(topic)


@pytest.fixture
def cluster(embedded_cluster_factory):
    """A cluster of its own: its brokers' handlers are wrapped to count requests."""
    return embedded_cluster_factory(brokers=2)


def test_the_broker_answers_topic_stats_as_4_9_8_does(cluster, unique_name):
    """AdminBrokerProcessor.getTopicStatsInfo (4.9.8): a row for each of the first
    writeQueueNums queues only, min/max as the store has them, lastUpdateTimestamp the store
    time of the last message, fastjson's object keys in HashMap order; no extFields, no
    remark. An unknown topic is TOPIC_NOT_EXIST, a missing header field SYSTEM_ERROR."""
    topic = unique_name("Stats")
    cluster.create_topic(topic, read_queues=5, write_queues=3, brokers=["broker-a"])
    cluster.append(topic, "broker-a", 1, [b"a", b"b", b"c"], store_timestamp=1_700_000_000_123)
    cluster.truncate(topic, "broker-a", 1, 1)
    cluster.append(topic, "broker-a", 4, [b"d"])  # a read-only queue: not in the table
    client = RawClient(cluster.brokers[0].addr)
    try:
        answer = client.request(STATS, {"topic": topic})
        assert (answer.code, answer.remark, answer.ext_fields) == (0, None, None)
        rows = []
        for qid in range(3):
            low, high, last = (1, 3, 1_700_000_000_123) if qid == 1 else (0, 0, 0)
            rows.append((mq_hash(topic, "broker-a", qid),
                         f'{{"brokerName":"broker-a","queueId":{qid},"topic":"{topic}"}}:'
                         f'{{"lastUpdateTimestamp":{last},"maxOffset":{high},"minOffset":{low}}}'))
        expected = '{"offsetTable":{' + ",".join(java_hashmap_iteration(rows)) + "}}"
        assert answer.body.decode() == expected

        missing = client.request(STATS, {"topic": topic + "-none"})
        assert (missing.code, missing.remark) == (ResponseCode.TOPIC_NOT_EXIST,
                                                  f"topic[{topic}-none] not exist")
        assert missing.ext_fields is None and missing.body == b""
        no_field = client.request(STATS, {})
        assert no_field.code == ResponseCode.SYSTEM_ERROR
        assert no_field.remark.endswith("the custom field <topic> is null")
    finally:
        client.close()


def test_a_thousand_row_answer_follows_java_hashmap_order(cluster, unique_name):
    """1,000 queues: the table grows to 2,048 bins; the rows come as Java iterates them."""
    topic = unique_name("Wide")
    cluster.create_topic(topic, queues=1000, brokers=["broker-b"])
    client = RawClient(cluster.brokers[1].addr)
    try:
        body = client.request(STATS, {"topic": topic}).body.decode()
    finally:
        client.close()
    order = [int(part.split(",")[0]) for part in body.split('"queueId":')[1:]]
    expected = java_hashmap_iteration([(mq_hash(topic, "broker-b", q), str(q))
                                       for q in range(1000)])
    assert order == [int(q) for q in expected]


def test_the_parser_reads_fastjson_object_keys_and_names_bad_bytes():
    body = (b'{"offsetTable":{{"brokerName":"b","queueId":2,"topic":"T"}:{"lastUpdate'
            b'Timestamp":5,"maxOffset":9,"minOffset":4},"{\\"brokerName\\":\\"b\\",\\"queueId'
            b'\\":0,\\"topic\\":\\"T\\"}":{"lastUpdateTimestamp":0,"maxOffset":1,"minOffset":0}}}')
    rows = {(r.topic, r.broker_name, r.queue_id): (r.min_offset, r.max_offset)
            for r in parse_topic_stats(body)}
    assert rows == {("T", "b", 2): (4, 9), ("T", "b", 0): (0, 1)}
    assert [r.last_update_timestamp for r in parse_topic_stats(body)] == [5, 0]
    with pytest.raises(ProtocolError, match=r"expected ':' \(at byte 59 "):
        parse_topic_stats(b'{"offsetTable":{{"brokerName":"b","queueId":2,"topic":"T"} {}}}')
    with pytest.raises(ProtocolError, match="no offsetTable"):
        parse_topic_stats(b'{"table":{}}')


def test_one_request_per_broker_gives_the_exact_offsets_of_1000_queues(cluster, unique_name):
    """2 brokers x 500 queues: one GET_TOPIC_STATS_INFO to each broker and no GET_MAX_OFFSET,
    and the offsets are those one GET_MAX_OFFSET / GET_MIN_OFFSET per queue gives."""
    topic = unique_name("Thousand")
    cluster.create_topic(topic, queues=500)
    for broker, qid, n in (("broker-a", 0, 3), ("broker-a", 499, 7), ("broker-b", 250, 2)):
        cluster.append(topic, broker, qid, [b"x"] * n)
    cluster.truncate(topic, "broker-a", 499, 4)
    counted = count_brokers(cluster)
    with Admin(cluster.namesrv_addr) as admin:
        queues = admin.queues(topic, refresh=True)
        assert len(queues) == 1000
        highs, lows = admin.offsets("max", queues), admin.offsets("min", queues)
        for c in counted.values():
            assert c.take() == Counter({STATS: 2})  # one for max, one for min
        single = {mq: admin.brokers.get_max_offset(admin.address(mq), mq) for mq in queues}
        single_low = {mq: admin.brokers.get_min_offset(admin.address(mq), mq) for mq in queues}
    assert highs == single and lows == single_low
    assert highs[MessageQueue(topic, "broker-a", 499)] == 7
    assert lows[MessageQueue(topic, "broker-a", 499)] == 4
    assert sum(highs.values()) == 12


def test_a_few_queues_of_a_wide_topic_are_asked_one_by_one(cluster, unique_name):
    """Two queues of 500: the whole table would cost the broker more than two lookups."""
    topic = unique_name("Few")
    cluster.create_topic(topic, queues=500, brokers=["broker-a"])
    counted = count_brokers(cluster)
    with Admin(cluster.namesrv_addr) as admin:
        queues = admin.queues(topic, refresh=True)[:2]
        assert admin.offsets("max", queues) == {mq: 0 for mq in queues}
    assert counted["broker-a"].take() == Counter({MAX: 2})


def test_a_refusing_broker_is_asked_per_queue_and_probed_again_later(cluster, unique_name):
    """A broker whose ACL refuses GET_TOPIC_STATS_INFO: its queues are looked up one by one,
    exact; it is not asked again until REPROBE_SECONDS have passed; the other broker keeps
    its one request."""
    topic = unique_name("Refused")
    cluster.create_topic(topic, queues=8)
    cluster.append(topic, "broker-a", 5, [b"x"] * 3)
    cluster.fail_next(1, ResponseCode.NO_PERMISSION, "no permission for GET_TOPIC_STATS_INFO",
                      request_codes=[STATS], broker="broker-a")
    counted = count_brokers(cluster)
    now = [1000.0]
    with Admin(cluster.namesrv_addr) as admin:
        admin.topic_stats._clock = lambda: now[0]
        queues = admin.queues(topic, refresh=True)
        first = admin.offsets("max", queues)
        assert first[MessageQueue(topic, "broker-a", 5)] == 3 and sum(first.values()) == 3
        # the refused request was answered by the fault rule, before the handler
        assert counted["broker-a"].take() == Counter({MAX: 8})
        assert counted["broker-b"].take() == Counter({STATS: 1})
        assert admin.offsets("max", queues) == first
        assert counted["broker-a"].take() == Counter({MAX: 8})
        now[0] += REPROBE_SECONDS
        assert admin.offsets("max", queues) == first
        assert counted["broker-a"].take() == Counter({STATS: 1})


def test_queues_the_table_leaves_out_are_asked_one_by_one(cluster, unique_name):
    """More read queues than write queues (4.9.8 lists the write queues), and a broker that
    does not have the topic yet (TOPIC_NOT_EXIST: asked per queue, not remembered)."""
    topic = unique_name("Shrunk")
    cluster.create_topic(topic, read_queues=6, write_queues=4, brokers=["broker-a"])
    cluster.append(topic, "broker-a", 5, [b"x"] * 2)
    counted = count_brokers(cluster)
    with Admin(cluster.namesrv_addr) as admin:
        queues = admin.queues(topic, refresh=True)
        highs = admin.offsets("max", queues)
        assert highs[MessageQueue(topic, "broker-a", 5)] == 2 and len(highs) == 6
        assert counted["broker-a"].take() == Counter({STATS: 1, MAX: 2})
        ghost = [MessageQueue(topic + "-ghost", "broker-b", q) for q in range(3)]
        address = cluster.brokers[1].addr
        answers = admin.topic_stats.queue_offsets("max", [(address, mq) for mq in ghost])
        assert answers == {mq: 0 for mq in ghost}
        assert counted["broker-b"].take() == Counter({STATS: 1, MAX: 3})
        assert not admin.topic_stats.refuses(address)


def test_the_proxy_remoting_port_refuses_it_and_lookups_fall_back(embedded_cluster_factory,
                                                                  unique_name):
    """A 5.1.4 proxy's remoting port: REQUEST_CODE_NOT_SUPPORTED, remark " request type 202
    not supported" (captured); the lookups through it go per queue. The proxy routes both
    brokers at its own address: the first lookup asks it once per broker, the next ones not."""
    cluster = embedded_cluster_factory(brokers=2, proxy_remoting=True)
    topic = unique_name("Proxied")
    cluster.create_topic(topic, queues=4)
    cluster.append(topic, "broker-b", 2, [b"x"] * 5)
    client = RawClient(cluster.proxy_remoting_addr)
    try:
        answer = client.request(STATS, {"topic": topic, "bname": "broker-a"})
    finally:
        client.close()
    assert (answer.code, answer.remark, answer.version) == (
        ResponseCode.REQUEST_CODE_NOT_SUPPORTED, " request type 202 not supported", 441)
    proxy = Counted(cluster.proxy_remoting)
    with Admin(cluster.proxy_remoting_addr) as admin:
        queues = admin.queues(topic, refresh=True)
        assert len(queues) == 8
        for _ in range(3):
            highs = admin.offsets("max", queues)
            assert highs[MessageQueue(topic, "broker-b", 2)] == 5 and sum(highs.values()) == 5
    codes = proxy.take()
    assert codes[STATS] == 2 and codes[MAX] == 24, json.dumps(codes)


def test_max_offsets_are_asked_every_50_ms_while_messages_arrive_else_at_the_interval(
        cluster, unique_name):
    """The driver's cache (clock replaced): 250 ms (the default) while nothing arrives, 50 ms
    for a second after a lookup that found a queue grown; each lookup is one table per
    broker."""
    from rocketmq_spark.source.offset_reader import ACTIVE_SECONDS, OffsetReader
    from rocketmq_spark.source.options import parse_source_options

    topic = unique_name("Hot")
    cluster.create_topic(topic, queues=4)
    options = parse_source_options({"nameServer": cluster.namesrv_addr, "subscribe": topic},
                                   streaming=True)
    assert options.offsets_refresh_interval_ms == 250
    counted = count_brokers(cluster)
    now = [100.0]

    def lookups_after(seconds: float) -> int:
        now[0] += seconds
        reader.max_offsets(queues)
        return sum(c.take()[STATS] for c in counted.values()) // 2  # one per broker

    with Admin(cluster.namesrv_addr) as admin:
        reader = OffsetReader(options, admin)
        reader.clock = lambda: now[0]
        queues = reader.discover().queues
        assert lookups_after(0) == 1
        assert [lookups_after(0.1), lookups_after(0.1), lookups_after(0.06)] == [0, 0, 1]
        cluster.append(topic, "broker-a", 1, [b"x"])
        assert lookups_after(0.1) == 0 and lookups_after(0.2) == 1  # idle: 250 ms
        assert reader.max_offsets(queues)[MessageQueue(topic, "broker-a", 1)] == 1
        cluster.append(topic, "broker-a", 1, [b"y"])
        assert lookups_after(0.06) == 1  # it grew: 50 ms
        assert reader.max_offsets(queues)[MessageQueue(topic, "broker-a", 1)] == 2
        assert [lookups_after(0.03), lookups_after(0.03)] == [0, 1]
        now[0] += ACTIVE_SECONDS
        assert [lookups_after(0), lookups_after(0.1), lookups_after(0.2)] == [1, 0, 1]


def test_a_stream_over_400_queues_is_exact_and_idles_on_one_table_per_broker(
        spark, cluster, unique_name, tmp_path):
    """A real stream (default options) over 2 x 200 queues reads every message exactly once,
    in queue order, before and after an idle spell; while idle, each broker sees
    GET_TOPIC_STATS_INFO and no per-queue offset lookup."""
    from source_helpers import assert_read_in_queue_order, ids_of, produce, reader, start_memory
    from waiting import wait_until

    topic = unique_name("Idle")
    cluster.create_topic(topic, queues=200)
    produce(cluster.namesrv_addr, topic, range(1000))
    counted = count_brokers(cluster)
    name = unique_name("idle").replace("-", "_")
    query = start_memory(reader(spark, cluster.namesrv_addr, topic,
                                startingOffsets="earliest"), name, str(tmp_path / "cp"))
    try:
        table = lambda: spark.table(name)  # noqa: E731
        wait_until(lambda: table().count() >= 1000, 120, "the first 1,000 rows")
        for c in counted.values():
            c.take()
        wait_until(lambda: all(c.codes[STATS] >= 3 for c in counted.values()), 60,
                   "three table lookups at each broker while idle")
        for name_, c in counted.items():
            idle = c.take()
            assert idle[MAX] == 0 and idle[int(RequestCode.GET_MIN_OFFSET)] == 0, (name_, idle)
        produce(cluster.namesrv_addr, topic, range(1000, 1400))
        wait_until(lambda: table().count() >= 1400, 120, "the 400 rows sent later")
        assert query.exception() is None
        rows = table()
        assert ids_of(rows.select("keys").collect()) == list(range(1400))
        assert_read_in_queue_order(rows, 400)
    finally:
        query.stop()
