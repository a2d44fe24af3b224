"""Message ids that Apache's tools can look up: ``mqadmin queryMsgByUniqueKey`` and the
dashboard call ``MQAdminImpl.queryMessageByUniqKey``, which reads a time out of bytes 10-13 of
the id (``MessageClientIDSetter.getNearlyTimeFromID``) and asks every broker of the topic for
QUERY_MESSAGE in ``[that time - 1 s, Long.MAX_VALUE]``. Below, the same lookup (the Java logic
re-written on the test side) against the embedded broker over real sockets, with ids the sink
wrote from a real Spark ``df.write``; and the broker's QUERY_MESSAGE / VIEW_MESSAGE_BY_ID
answers, read from 4.9.8's ``QueryMessageProcessor``, ``DefaultMessageStore.queryMessage``
and ``IndexService`` (apache/rocketmq, broker/ and store/; read from source, not run).
"""
from __future__ import annotations

import hashlib
from datetime import datetime, timedelta, timezone
from typing import List, Optional
from zoneinfo import ZoneInfo

import json
import logging
import os

import pytest

from raw_client import RawClient
from source_helpers import produce
from rocketmq_spark.client.protocol.codes import ResponseCode
from rocketmq_spark.client.protocol.message import MessageExt, decode_messages
from rocketmq_spark.sink.batch_time import batch_created_ms
from rocketmq_spark.sink.ids import LEAD_MS, TaskIdentity, message_id, message_ids, month_span

QUERY_MESSAGE, VIEW_MESSAGE_BY_ID = 12, 33
LONG_MAX = (1 << 63) - 1
DAY_MS = 86_400_000
ZONES = ["UTC", "Etc/GMT+12", "Pacific/Kiritimati", "America/New_York", "Asia/Shanghai",
         "Europe/Berlin"]


def nearly_time_from_id(msg_id: str, now_ms: int, zone: str) -> int:
    """``MessageClientIDSetter.getNearlyTimeFromID`` as a JVM in ``zone`` computes it at
    ``now_ms``: bytes 10-13 are ms since the month start (Calendar, local time); when that
    lands at or after now, the previous month's start is used."""
    span = int.from_bytes(bytes.fromhex(msg_id)[10:14], "big")
    tz = ZoneInfo(zone)
    now = datetime.fromtimestamp(now_ms / 1000, tz)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    start_ms = int(start.timestamp() * 1000)
    if start_ms + span >= now_ms:
        prev = (start - timedelta(days=1)).replace(day=1)  # Calendar.add(MONTH, -1) from day 1
        start_ms = int(prev.replace(tzinfo=tz).timestamp() * 1000)
    return start_ms + span


def query_by_uniq_key(brokers: List[RawClient], topic: str, uniq_key: str, now_ms: int,
                      zone: str = "UTC") -> Optional[MessageExt]:
    """``MQAdminImpl.queryMessageByUniqKey``: QUERY_MESSAGE to every broker with the unique-key
    flag, window [nearly time - 1000, Long.MAX_VALUE]; the first message whose id is the key."""
    begin = nearly_time_from_id(uniq_key, now_ms, zone) - 1000
    found = []
    for raw in brokers:
        answer = raw.request(QUERY_MESSAGE, {
            "topic": topic, "key": uniq_key, "maxNum": "32", "beginTimestamp": str(begin),
            "endTimestamp": str(LONG_MAX), "_UNIQUE_KEY_QUERY": "true"})
        if answer.code == ResponseCode.SUCCESS:
            found += [m for m in decode_messages(answer.body)
                      if m.properties.get("UNIQ_KEY") == uniq_key]
        else:
            assert answer.code == ResponseCode.QUERY_NOT_FOUND, answer.remark
    return found[0] if found else None


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp() * 1000)


# ------------------------------------------------------------------ the time in bytes 10-13


@pytest.mark.parametrize("created", ["2026-10-31T23:59:59", "2026-11-01T00:00:30",
                                     "2026-11-01T12:59:59", "2026-11-01T13:00:01",
                                     "2026-12-31T20:00:00", "2026-03-01T05:00:00",
                                     "2026-11-17T09:30:00"])
@pytest.mark.parametrize("zone", ZONES)
def test_bytes_10_to_13_decode_java_way_to_at_most_a_day_before_creation(created, zone):
    """Java decodes the id's time in its own zone: at or before the creation time (the search
    window must start before the message), within 13 h + the zone's distance east of UTC-12,
    when the tool runs in the following 25 days (Java's own ids decode right for less than a
    month: the shortest month less the zones' 27 h); also across month and year ends."""
    t = ms(created)
    mid = message_id(TaskIdentity("job", "tok", None, 0, t), 5)
    for later_ms in (1000, 3_600_000, DAY_MS, 10 * DAY_MS, 25 * DAY_MS):
        decoded = nearly_time_from_id(mid, t + later_ms, zone)
        assert t - LEAD_MS - 14 * 3_600_000 - 1000 <= decoded <= t, (created, zone, later_ms)


def test_the_time_bytes_are_what_a_java_producer_in_utc_minus_12_writes():
    t = ms("2026-11-01T12:00:00")  # 2026-10-31T23:00 in UTC-13: still October
    assert month_span(t) == ms("2026-10-31T23:00:00") - ms("2026-10-01T00:00:00")
    mid = message_id(TaskIdentity("stream", "q", 3, 1, t), 7)
    assert mid[20:28] == f"{month_span(t):08X}"


def test_ids_stay_stable_and_distinct_by_place():
    t = ms("2026-11-17T09:30:00")
    a = TaskIdentity("stream", "query-1", 7, 2, t)
    assert message_id(a, 10) == message_id(TaskIdentity("stream", "query-1", 7, 2, t), 10)
    assert message_ids(a, 10, 3).to_pylist() == [message_id(a, r) for r in (10, 11, 12)]
    assert len({message_id(TaskIdentity("stream", "query-1", b, p, t), r)
                for b in range(3) for p in range(3) for r in range(3)}) == 27
    assert bytes.fromhex(message_id(a, 0x0102A3B4))[6:10] == bytes.fromhex("0102A3B4")


def old_layout_id(identity: TaskIdentity, row: int) -> str:
    """The ids before: 24 hex of a BLAKE2b digest, then the row number in 8."""
    parts = [identity.kind, identity.scope,
             "" if identity.batch_id is None else str(identity.batch_id), str(identity.partition)]
    digest = hashlib.blake2b("\x00".join(parts).encode(), digest_size=12).hexdigest().upper()
    return f"{digest}{row:08X}"


def test_the_old_ids_decode_to_a_time_after_the_message():
    """The old ids' bytes 10-13 are digest: for this task they decode (UTC, a week after the
    write) to a time after the message was stored, so the tools' window misses it."""
    t = ms("2026-11-17T09:30:00")
    identity = TaskIdentity("stream", "query-1", 0, 2, t)
    old = old_layout_id(identity, 0)
    assert nearly_time_from_id(old, t + 7 * DAY_MS, "UTC") - 1000 > t
    assert nearly_time_from_id(message_id(identity, 0), t + 7 * DAY_MS, "UTC") <= t


# ------------------------------------------------------------------ ids the sink wrote


def test_ids_written_by_df_write_are_found_by_query_msg_by_unique_key(spark, cluster,
                                                                      unique_name):
    """Real Spark ``df.write`` on 4 partitions, then Java's lookup of each partition's first
    id, as the tool would run it any time in the next 25 days (and in several zones): found
    every time, and VIEW_MESSAGE_BY_ID at the found message's physical offset serves it. With
    the old ids (digest in bytes 10-13) the window starts after the message for most of
    those times and the lookup comes back empty."""
    topic = unique_name("IdLookup")
    cluster.create_topic(topic, queues=4)
    (spark.range(400, numPartitions=4).selectExpr("concat('body-', id) AS body")
     .write.format("rocketmq").mode("append").option("nameServer", cluster.namesrv_addr)
     .option("topic", topic).save())
    rows = (spark.read.format("rocketmq").option("nameServer", cluster.namesrv_addr)
            .option("subscribe", topic).load().select("body", "msgId").collect())
    assert len(rows) == 400
    by_body = {bytes(r.body).decode(): r.msgId for r in rows}
    firsts = [by_body[f"body-{i}"] for i in (0, 100, 200, 300)]  # row 0 of each partition
    brokers = [RawClient(b.addr) for b in cluster.brokers]
    try:
        for uniq in firsts:
            now = int(datetime.now(timezone.utc).timestamp() * 1000)
            msg = query_by_uniq_key(brokers, topic, uniq, now)
            assert msg is not None, uniq
            stored = msg.store_timestamp
            for day in range(0, 26):
                for zone in ZONES:
                    later = stored + day * DAY_MS + 3_600_000
                    got = query_by_uniq_key(brokers, topic, uniq, later, zone)
                    assert got is not None and got.body == msg.body, (uniq, day, zone)
            views = [raw.request(VIEW_MESSAGE_BY_ID, {"offset": str(msg.physical_offset)})
                     for raw in brokers]
            served = [decode_messages(v.body)[0] for v in views
                      if v.code == ResponseCode.SUCCESS]
            assert any(m.properties.get("UNIQ_KEY") == uniq for m in served)
    finally:
        for raw in brokers:
            raw.close()


def test_a_micro_batch_s_ids_carry_spark_s_batch_timestamp(spark, cluster, unique_name,
                                                          tmp_path):
    """A stream's ids carry ``batchTimestampMs`` of ``offsets/<batchId>`` (what Spark reads
    back when it replays the batch), and Java's lookup finds them."""
    source, sink = unique_name("IdStreamIn"), unique_name("IdStreamOut")
    cluster.create_topic(source, queues=2)
    cluster.create_topic(sink, queues=2)
    produce(cluster.namesrv_addr, source, range(50))
    checkpoint = str(tmp_path / "cp")
    query = (spark.readStream.format("rocketmq").option("nameServer", cluster.namesrv_addr)
             .option("subscribe", source).option("startingOffsets", "earliest").load()
             .selectExpr("body").writeStream.format("rocketmq")
             .option("nameServer", cluster.namesrv_addr).option("topic", sink)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    assert query.awaitTermination(240), "the query did not finish"
    assert query.exception() is None, query.exception()
    logs = [(tmp_path / "cp" / "offsets" / name).read_text().splitlines()[1]
            for name in os.listdir(tmp_path / "cp" / "offsets") if name.isdigit()]
    batch_times = {json.loads(line)["batchTimestampMs"] for line in logs}
    ids = [r.msgId for r in spark.read.format("rocketmq")
           .option("nameServer", cluster.namesrv_addr).option("subscribe", sink).load()
           .select("msgId").collect()]
    assert len(ids) == 50
    times = {i[20:28] for i in ids}  # the rows came in one micro-batch (not always batch 0)
    assert len(times) == 1
    batch_ms = next(t for t in batch_times if f"{month_span(t):08X}" in times)
    brokers = [RawClient(b.addr) for b in cluster.brokers]
    try:
        for uniq in ids[:3]:
            assert query_by_uniq_key(brokers, sink, uniq, batch_ms + 5 * DAY_MS) is not None
    finally:
        for raw in brokers:
            raw.close()


def test_the_batch_time_comes_from_the_offset_log_or_else_the_run_start(tmp_path, caplog):
    offsets = tmp_path / "offsets"
    offsets.mkdir()
    (offsets / "3").write_text('v1\n{"batchWatermarkMs":0,"batchTimestampMs":1764000000123,'
                               '"conf":{}}\n{"x":1}\n')
    assert batch_created_ms(str(tmp_path), 3, 42) == 1764000000123
    assert batch_created_ms(tmp_path.as_uri(), 3, 42) == 1764000000123
    with caplog.at_level(logging.WARNING):
        assert batch_created_ms(str(tmp_path), 4, 42) == 42
        assert batch_created_ms(None, 3, 42) == 42
        assert batch_created_ms("nosuchscheme://nn/cp", 3, 42) == 42
    assert sum("cannot read batchTimestampMs" in r.getMessage() for r in caplog.records) <= 1


# ------------------------------------------------------------------ the broker's answers


def send(raw: RawClient, topic: str, body: bytes, props: str):
    answer = raw.request(310, {"a": "test-producer", "b": topic, "c": "TBW102", "d": "4",
                               "e": "0", "f": "0", "g": str(int(datetime.now().timestamp()
                                                                 * 1000)),
                               "h": "0", "i": props, "j": "0", "k": "false", "m": "false"},
                         body)
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    return answer


def test_query_message_answers_as_4_9_8(cluster, topic):
    """QueryMessageProcessor.queryMessage / DefaultMessageStore.queryMessage (4.9.8): keys and
    UNIQ_KEY are found; outside [begin, end] is QUERY_NOT_FOUND with 'can not find message,
    maybe time range not correct' and both indexLastUpdate fields 0; a found answer carries
    the stored messages and the newest indexed message's time and physical offset; a missing
    header field is SYSTEM_ERROR naming it; VIEW_MESSAGE_BY_ID at no message's offset is
    SYSTEM_ERROR 'can not find message by the offset, N'."""
    addr = cluster.brokers[0].addr
    with RawClient(addr) as raw:
        sep, kv = "\x02", "\x01"
        for i in range(3):
            send(raw, topic, b"m%d" % i,
                 f"KEYS{kv}order-{i} shared{sep}UNIQ_KEY{kv}ID{i:030d}{sep}")
        now = int(datetime.now(timezone.utc).timestamp() * 1000)

        def query(key, begin=0, end=LONG_MAX, max_num="32", **extra):
            fields = {"topic": topic, "key": key, "maxNum": max_num,
                      "beginTimestamp": str(begin), "endTimestamp": str(end), **extra}
            return raw.request(QUERY_MESSAGE, fields)

        by_key = query("order-1")
        assert by_key.code == ResponseCode.SUCCESS and by_key.remark is None
        assert [m.body for m in decode_messages(by_key.body)] == [b"m1"]
        assert int(by_key.ext_fields["indexLastUpdateTimestamp"]) >= now - 60_000
        assert int(by_key.ext_fields["indexLastUpdatePhyoffset"]) > 0
        shared = query("shared")
        assert [m.body for m in decode_messages(shared.body)] == [b"m0", b"m1", b"m2"]
        assert [m.body for m in decode_messages(query("shared", max_num="2").body)] == \
            [b"m1", b"m2"]  # the index gives the newest entries first
        uniq = query(f"ID{2:030d}", _UNIQUE_KEY_QUERY="true", max_num="0")
        assert [m.body for m in decode_messages(uniq.body)] == [b"m2"]  # maxNum becomes 32
        for missing in (query("order-1", begin=now + 60_000), query("order-1", end=now - 600_000),
                        query("no-such-key")):
            assert missing.code == ResponseCode.QUERY_NOT_FOUND
            assert missing.remark == "can not find message, maybe time range not correct"
            assert missing.ext_fields == {"indexLastUpdateTimestamp": "0",
                                          "indexLastUpdatePhyoffset": "0"}
        bad = raw.request(QUERY_MESSAGE, {"topic": topic, "maxNum": "1", "beginTimestamp": "0",
                                          "endTimestamp": "1"})
        assert bad.code == ResponseCode.SYSTEM_ERROR and "<key> is null" in bad.remark
        first = decode_messages(shared.body)[0]
        view = raw.request(VIEW_MESSAGE_BY_ID, {"offset": str(first.physical_offset)})
        assert view.code == ResponseCode.SUCCESS and decode_messages(view.body)[0].body == b"m0"
        nowhere = raw.request(VIEW_MESSAGE_BY_ID, {"offset": str(first.physical_offset + 1)})
        assert nowhere.code == ResponseCode.SYSTEM_ERROR
        assert nowhere.remark == f"can not find message by the offset, {first.physical_offset + 1}"
