"""Stored messages (§5): TV3/TV4/TV6, the record layout, compression, corruption, properties,
message ids and the HashMap order a genuine broker stores properties in."""
from __future__ import annotations

import ipaddress
import os
import re
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketmq_spark.client.errors import MessageDecodeError, ProtocolError
from rocketmq_spark.client.protocol.properties import (
    decode_properties, encode_properties, java_hashmap_order, java_string_hash,
    split_tags_expression,
)
from rocketmq_spark.client.protocol.frame import RemotingCommand, decode_frame, encode_frame
from rocketmq_spark.client.protocol.message import (
    MAGIC_V1, MAGIC_V2, BatchEntry, UniqKeyFactory, compress_body, decode_batch,
    decode_message, decode_messages, decompress_body, encode_batch, encode_stored_message,
    new_uniq_key, offset_msg_id, pack_host, parse_offset_msg_id, record_layout, unpack_host,
)

# ---------------------------------------------------------------- published vectors (§11)

TV3 = bytes.fromhex("""
00 00 00 65 da a3 20 a7 58 93 2a ac 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
00 00 01 00 00 00 00 00 00 00 01 8b cf e5 68 00 7f 00 00 01 00 00 d4 31 00 00 01 8b cf e5 68 7b
7f 00 00 01 00 00 2a 9f 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 02 68 69 01 54 00 07 54 41
47 53 01 61 02""")
# Legacy form (4.9.1 ... 5.1.4 writers): totalSize 100, properties without the final \x02.
TV3_LEGACY = b"\x00\x00\x00\x64" + TV3[4:92] + b"\x00\x06TAGS\x01a"

TV4 = bytes.fromhex("""
00 00 01 38 00 00 00 cf 7b 22 63 6f 64 65 22 3a 30 2c 22 65 78 74 46 69 65 6c 64 73 22 3a 7b 22
73 75 67 67 65 73 74 57 68 69 63 68 42 72 6f 6b 65 72 49 64 22 3a 22 30 22 2c 22 6e 65 78 74 42
65 67 69 6e 4f 66 66 73 65 74 22 3a 22 31 22 2c 22 6d 69 6e 4f 66 66 73 65 74 22 3a 22 30 22 2c
22 6d 61 78 4f 66 66 73 65 74 22 3a 22 31 22 7d 2c 22 66 6c 61 67 22 3a 31 2c 22 6c 61 6e 67 75
61 67 65 22 3a 22 4a 41 56 41 22 2c 22 6f 70 61 71 75 65 22 3a 31 2c 22 72 65 6d 61 72 6b 22 3a
22 46 4f 55 4e 44 22 2c 22 73 65 72 69 61 6c 69 7a 65 54 79 70 65 43 75 72 72 65 6e 74 52 50 43
22 3a 22 4a 53 4f 4e 22 2c 22 76 65 72 73 69 6f 6e 22 3a 34 37 39 7d 00 00 00 65 da a3 20 a7 58
93 2a ac 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 01 00 00 00 00 00 00
00 01 8b cf e5 68 00 7f 00 00 01 00 00 d4 31 00 00 01 8b cf e5 68 7b 7f 00 00 01 00 00 2a 9f 00
00 00 00 00 00 00 00 00 00 00 00 00 00 00 02 68 69 01 54 00 07 54 41 47 53 01 61 02""")

TV6 = bytes.fromhex("00 00 00 1f 00 00 00 00 00 00 00 00 00 00 00 00"
                    "00 00 00 02 68 69 00 07 54 41 47 53 01 61 02")
TV6_LEGACY = b"\x00\x00\x00\x1e" + TV6[4:22] + b"\x00\x06TAGS\x01a"

TV3_OFFSET_MSG_ID = "7F00000100002A9F0000000000000100"

TV3_FIELDS = dict(topic="T", queue_id=0, queue_offset=0, physical_offset=256, body=b"hi",
                  flag=0, sys_flag=0, born_timestamp=1700000000000, born_host="127.0.0.1:54321",
                  store_timestamp=1700000000123, store_host="127.0.0.1:10911",
                  reconsume_times=0, prepared_transaction_offset=0)

INT32 = st.integers(-2 ** 31, 2 ** 31 - 1)
INT64 = st.integers(-2 ** 63, 2 ** 63 - 1)
BIG_BODY = ("%05d," * 1000 % tuple(range(1000))).encode()  # the capture's 6,000-byte body


def stored(**fields) -> bytes:
    """encode_stored_message with TV3's values as defaults."""
    values = dict(TV3_FIELDS, properties="TAGS\x01a\x02")
    values.update(fields)
    return encode_stored_message(**values)


def decode_error(data: bytes, **kwargs) -> MessageDecodeError:
    with pytest.raises(MessageDecodeError) as info:
        decode_messages(data, **kwargs)
    err = info.value
    assert isinstance(err, ProtocolError) and err.where == "pull body"
    assert 0 <= err.position < len(data)
    return err


# ---------------------------------------------------------------- TV3


@pytest.mark.parametrize("record, size", [(TV3, 101), (TV3_LEGACY, 100)],
                         ids=["5.2+", "legacy"])
def test_tv3_decodes_to_its_published_fields(record, size):
    msg, end = decode_message(record)
    assert end == size
    for name, value in TV3_FIELDS.items():
        assert getattr(msg, name) == value, name
    assert msg.properties == {"TAGS": "a"} and msg.tags == "a"
    assert msg.store_size == size and msg.magic == MAGIC_V1
    assert msg.body_crc == 0x58932AAC == zlib.crc32(b"hi") & 0x7FFFFFFF
    assert msg.offset_msg_id == TV3_OFFSET_MSG_ID == msg.msg_id
    assert msg.stored_body == b"hi" and not msg.compressed


def test_encode_stored_message_reproduces_tv3_both_forms():
    assert stored(properties="TAGS\x01a\x02") == TV3
    assert stored(properties="TAGS\x01a") == TV3_LEGACY
    assert stored(properties=encode_properties({"TAGS": "a"})) == TV3
    assert stored(properties=encode_properties({"TAGS": "a"}, trailing_separator=False)) \
        == TV3_LEGACY


def test_record_layout_of_tv3_matches_the_published_offsets():
    (total, magic, sys_flag, born_len, store_len, body_pos, body_len, topic_pos, topic_len,
     props_pos, props_len) = record_layout(TV3, 0, len(TV3))
    assert (total, magic, sys_flag, born_len, store_len) == (101, MAGIC_V1, 0, 8, 8)
    assert (body_pos, body_len) == (88, 2)       # bodyLength at 84
    assert (topic_pos, topic_len) == (91, 1)     # topicLength at 90
    assert (props_pos, props_len) == (94, 7)     # propertiesLength at 92


def test_consecutive_records_decode_in_order():
    second = stored(queue_offset=1, physical_offset=357, body=b"second")
    messages = decode_messages(TV3 + second + TV3_LEGACY)
    assert [m.queue_offset for m in messages] == [0, 1, 0]
    assert [m.body for m in messages] == [b"hi", b"second", b"hi"]
    assert [m.store_size for m in messages] == [101, len(second), 100]


def test_an_empty_pull_body_holds_no_messages():
    assert decode_messages(b"") == []


# ---------------------------------------------------------------- TV4


def test_tv4_pull_response_decodes_then_its_body():
    cmd = decode_frame(TV4)
    assert cmd.is_response and (cmd.code, cmd.opaque, cmd.flag) == (0, 1, 1)
    assert (cmd.language, cmd.version, cmd.remark) == ("JAVA", 479, "FOUND")
    assert cmd.ext_fields == {"suggestWhichBrokerId": "0", "nextBeginOffset": "1",
                              "minOffset": "0", "maxOffset": "1"}
    assert cmd.body == TV3
    (msg,) = decode_messages(cmd.body)
    assert msg.body == b"hi" and msg.queue_offset == 0 and msg.tags == "a"


def test_tv4_encodes_byte_exact():
    cmd = RemotingCommand(code=0, flag=1, opaque=1, language="JAVA", version=479, remark="FOUND",
                          ext_fields={"suggestWhichBrokerId": "0", "nextBeginOffset": "1",
                                      "minOffset": "0", "maxOffset": "1"}, body=TV3)
    assert encode_frame(cmd) == TV4


# ---------------------------------------------------------------- TV6 batches


@pytest.mark.parametrize("data, props", [(TV6, "TAGS\x01a\x02"), (TV6_LEGACY, "TAGS\x01a")],
                         ids=["5.2+", "legacy"])
def test_tv6_batch_element_encodes_and_decodes(data, props):
    assert encode_batch([BatchEntry(body=b"hi", properties=props)]) == data
    (entry,) = decode_batch(data)
    assert entry == BatchEntry(body=b"hi", properties=props, flag=0)
    assert decode_properties(entry.properties) == {"TAGS": "a"}


@settings(max_examples=100, deadline=None)
@given(st.lists(st.builds(BatchEntry, body=st.binary(max_size=100), properties=st.text(max_size=30),
                          flag=INT32), max_size=6))
def test_batches_round_trip(entries):
    assert decode_batch(encode_batch(entries)) == entries


@pytest.mark.parametrize("data, position", [
    pytest.param(TV6[:-1], 0, id="truncated"),
    pytest.param(TV6[:10], 0, id="shorter-than-an-entry"),
    pytest.param(b"\xff\xff\xff\xfd" + TV6[4:], 0, id="negative-total"),
    pytest.param(TV6[:16] + b"\xff\xff\xff\xfd" + TV6[20:], 0, id="negative-body-length"),
    pytest.param(TV6[:16] + b"\x00\x00\x00\x20" + TV6[20:], 0, id="body-overruns"),
    pytest.param(TV6[:22] + b"\x00\x09" + TV6[24:], 22, id="properties-length-wrong"),
    pytest.param(TV6[:24] + b"\xff" + TV6[25:], 24, id="properties-not-utf8"),
    pytest.param(TV6 + TV6[:25], 31, id="second-entry-cut"),
])
def test_corrupt_batches_raise_message_decode_error(data, position):
    with pytest.raises(MessageDecodeError) as info:
        decode_batch(data)
    assert info.value.position == position


# ---------------------------------------------------------------- round trips


@st.composite
def host_addresses(draw) -> str:
    ip = draw(st.ip_addresses())
    port = draw(st.integers(0, 65535))
    return f"{ip}:{port}" if ip.version == 4 else f"[{ip}]:{port}"


PROPS = st.dictionaries(
    st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=["Cs"]),
            min_size=1, max_size=12),
    st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=["Cs"]),
            min_size=1, max_size=20),
    max_size=5)


@st.composite
def stored_messages(draw) -> dict:
    return dict(
        topic=draw(st.text(min_size=1, max_size=40) | st.text("ab%|_-", min_size=120,
                                                               max_size=300)),
        queue_id=draw(INT32), queue_offset=draw(INT64), physical_offset=draw(INT64),
        body=draw(st.binary(max_size=300)), flag=draw(INT32),
        sys_flag=draw(INT32) & ~0x31,  # compression has its own test; host bits follow hosts
        born_timestamp=draw(INT64), born_host=draw(host_addresses()),
        store_timestamp=draw(INT64), store_host=draw(host_addresses()),
        reconsume_times=draw(INT32), prepared_transaction_offset=draw(INT64),
        props=draw(PROPS), trailing=draw(st.booleans()))


@settings(max_examples=200, deadline=None)
@given(stored_messages())
def test_stored_messages_round_trip(fields):
    props, trailing = fields.pop("props"), fields.pop("trailing")
    record = encode_stored_message(properties=encode_properties(props, trailing), **fields)
    msg, end = decode_message(record)
    assert end == len(record) == msg.store_size
    born_v6 = ":" in fields["born_host"].rpartition(":")[0]
    store_v6 = ":" in fields["store_host"].rpartition(":")[0]
    expected_sys_flag = fields["sys_flag"] | (0x10 if born_v6 else 0) | (0x20 if store_v6 else 0)
    for name, value in fields.items():
        if name != "sys_flag":
            assert getattr(msg, name) == value, name
    assert msg.sys_flag == expected_sys_flag
    assert msg.properties == props
    assert msg.body_crc == zlib.crc32(fields["body"]) & 0x7FFFFFFF
    long_topic = len(fields["topic"].encode()) > 127
    assert msg.magic == (MAGIC_V2 if long_topic else MAGIC_V1)
    assert len(record) == (91 + long_topic + 12 * born_v6 + 12 * store_v6 + len(fields["body"])
                           + len(fields["topic"].encode())
                           + len(encode_properties(props, trailing).encode()))
    assert parse_offset_msg_id(msg.offset_msg_id) == (fields["store_host"],
                                                      fields["physical_offset"])


def test_ipv6_hosts_set_their_sysflag_bits_and_widen_the_record():
    v4 = stored()
    born6 = stored(born_host="[2001:db8::1]:54321")
    store6 = stored(store_host="[::1]:10911")
    both = stored(born_host="[2001:db8::1]:54321", store_host="[::1]:10911")
    assert (len(born6), len(store6), len(both)) == (len(v4) + 12, len(v4) + 12, len(v4) + 24)
    assert [decode_message(r)[0].sys_flag for r in (v4, born6, store6, both)] == [0, 0x10, 0x20,
                                                                                  0x30]
    msg = decode_message(both)[0]
    assert (msg.born_host, msg.store_host) == ("[2001:db8::1]:54321", "[::1]:10911")
    assert len(msg.offset_msg_id) == 56
    assert msg.offset_msg_id.startswith("0" * 31 + "1" + "00002A9F")


def test_topics_over_127_bytes_use_magic_v2_and_a_two_byte_length():
    topic = "%RETRY%" + "g" * 121  # 128 bytes
    record = stored(topic=topic)
    assert struct.unpack_from(">i", record, 4)[0] == MAGIC_V2
    layout = record_layout(record, 0, len(record))
    assert struct.unpack_from(">h", record, layout[7] - 2)[0] == 128
    msg = decode_message(record)[0]
    assert msg.topic == topic and msg.magic == MAGIC_V2
    assert struct.unpack_from(">i", stored(topic="t" * 127), 4)[0] == MAGIC_V1


def test_magic_v2_also_decodes_short_topics():
    record = stored(magic=MAGIC_V2)
    assert len(record) == len(TV3) + 1
    assert decode_message(record)[0].topic == "T"


def test_empty_bodies_and_properties_round_trip():
    msg = decode_message(stored(body=b"", properties=""))[0]
    assert (msg.body, msg.properties, msg.body_crc) == (b"", {}, 0)


def test_non_ascii_topic_and_properties_round_trip():
    msg = decode_message(stored(topic="主题-ü", properties="KEYS\x01ключ\x02TAGS\x01タグ"))[0]
    assert msg.topic == "主题-ü" and msg.properties == {"KEYS": "ключ", "TAGS": "タグ"}


def test_crc_is_checked_but_can_be_skipped():
    record = bytearray(stored(queue_offset=42))
    body_pos = record_layout(record, 0, len(record))[5]
    record[body_pos] ^= 0x01
    err = decode_error(bytes(record))
    assert err.position == 8 and err.queue_offset == 42
    assert "CRC" in str(err) and "queue offset 42" in str(err)
    assert decode_messages(bytes(record), verify_crc=False)[0].body == b"ii"


def test_crc_error_in_a_later_record_names_its_position_in_the_body():
    record = bytearray(stored(queue_offset=7, body=b"zz"))
    record[8:12] = b"\x00\x00\x00\x01"
    err = decode_error(TV3 + bytes(record))
    assert err.position == len(TV3) + 8 and err.queue_offset == 7


def test_crc_uses_only_31_bits():
    body = next(bytes([i]) * 3 for i in range(256) if zlib.crc32(bytes([i]) * 3) & 0x80000000)
    msg = decode_message(stored(body=body))[0]
    assert msg.body_crc == zlib.crc32(body) & 0x7FFFFFFF


# ---------------------------------------------------------------- compression (§5.4)


@pytest.mark.parametrize("kind, sys_flag", [(0, 0x001), (1, 0x101), (2, 0x201), (3, 0x301)],
                         ids=["zlib-legacy", "lz4", "zstd", "zlib"])
def test_compressed_bodies_are_stored_as_given_and_inflate_on_decode(kind, sys_flag):
    data, bits = compress_body(BIG_BODY, kind)
    assert bits == sys_flag
    assert len(data) < len(BIG_BODY)
    msg = decode_message(stored(body=data, sys_flag=bits))[0]
    assert msg.body == BIG_BODY and msg.stored_body == data
    assert msg.compressed and msg.sys_flag == sys_flag
    assert msg.body_crc == zlib.crc32(data) & 0x7FFFFFFF  # over the compressed bytes
    assert decode_message(stored(body=data, sys_flag=bits), decompress=False)[0].body == data


def test_compressed_formats_are_the_documented_ones():
    assert compress_body(b"x" * 100, 1)[0][:4] == b"\x04\x22\x4d\x18"  # LZ4 frame magic
    assert compress_body(b"x" * 100, 2)[0][:4] == b"\x28\xb5\x2f\xfd"  # zstd frame magic
    for kind in (0, 3):
        assert zlib.decompress(compress_body(b"x" * 100, kind)[0]) == b"x" * 100


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=2000), st.sampled_from([0, 1, 2, 3]))
def test_compression_round_trips(body, kind):
    data, bits = compress_body(body, kind)
    assert decompress_body(data, bits) == body


@pytest.mark.parametrize("kind", [0, 1, 2, 3])
@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage"])
def test_bodies_that_do_not_inflate_raise_message_decode_error(kind, damage):
    data, bits = compress_body(BIG_BODY, kind)
    bad = {"truncated": data[:len(data) // 2], "empty": b"", "garbage": b"\x00garbage" * 4}
    record = stored(body=bad[damage], sys_flag=bits, queue_offset=9)
    err = decode_error(record)
    assert err.position == record_layout(record, 0, len(record))[5]
    assert "inflate" in str(err) and err.queue_offset == 9


@pytest.mark.parametrize("kind", [4, 5, 6, 7])
def test_unknown_compression_types_raise_message_decode_error(kind):
    record = stored(body=zlib.compress(b"x"), sys_flag=0x1 | kind << 8)
    assert f"compression type {kind}" in str(decode_error(record))


# ---------------------------------------------------------------- corruption


def patched(record: bytes, offset: int, fmt: str, value) -> bytes:
    out = bytearray(record)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


@pytest.mark.parametrize("data, position, words", [
    pytest.param(TV3[:90], 0, "too few", id="buffer-shorter-than-a-record"),
    pytest.param(TV3[:-1], 0, "totalSize 101", id="record-cut-short"),
    pytest.param(patched(TV3, 4, ">I", 0xCBD43194), 4, "magic", id="blank-magic"),
    pytest.param(patched(TV3, 4, ">I", 0), 4, "magic", id="zero-magic"),
    pytest.param(patched(TV3, 0, ">i", 102), 0, "totalSize 102", id="total-too-big"),
    pytest.param(patched(TV3, 0, ">i", 90), 0, "totalSize 90", id="total-below-minimum"),
    pytest.param(patched(TV3, 0, ">i", -1), 0, "totalSize -1", id="total-negative"),
    pytest.param(patched(TV3, 0, ">i", 100) + b"\x02", 92, "properties length 7",
                 id="total-too-small"),
    pytest.param(patched(TV3, 84, ">i", 50), 84, "body length 50", id="body-overruns"),
    pytest.param(patched(TV3, 84, ">i", -1), 84, "body length -1", id="body-negative"),
    pytest.param(patched(TV3, 90, ">b", 9), 90, "topic length 9", id="topic-overruns"),
    pytest.param(patched(TV3, 90, ">b", -128), 90, "topic length -128", id="topic-negative"),
    pytest.param(patched(TV3, 92, ">h", 8), 92, "properties length 8", id="properties-overrun"),
    pytest.param(patched(TV3, 92, ">h", 6), 92, "properties length 6", id="properties-short"),
    pytest.param(patched(TV3, 92, ">h", -1), 92, "properties length -1",
                 id="properties-negative"),
    pytest.param(patched(TV3, 36, ">i", 0x30), 0, "fixed part", id="v6-bits-on-a-v4-record"),
    pytest.param(patched(TV3, 91, ">B", 0xFF), 91, "topic is not UTF-8", id="topic-not-utf8"),
    pytest.param(patched(TV3, 96, ">B", 0xFF), 96, "properties are not UTF-8",
                 id="properties-not-utf8"),
    pytest.param(TV3 + b"\x00\x00", 101, "too few", id="trailing-bytes"),
])
def test_corrupt_records_raise_message_decode_error_at_the_fault(data, position, words):
    err = decode_error(data, verify_crc=False)
    assert err.position == position
    assert words in str(err)


DAMAGE_RECORDS = [TV3, stored(body=b"x" * 40, born_host="[::1]:1", magic=MAGIC_V2),
                  stored(body=compress_body(b"y" * 50, 2)[0], sys_flag=0x201)]
# What each of DAMAGE_RECORDS holds: (topic, body, properties, born host), bodies inflated.
DAMAGE_RECORD_FIELDS = [("T", b"hi", {"TAGS": "a"}, "127.0.0.1:54321"),
                        ("T", b"x" * 40, {"TAGS": "a"}, "[::1]:1"),
                        ("T", b"y" * 50, {"TAGS": "a"}, "127.0.0.1:54321")]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_damaged_pull_bodies_give_messages_or_message_decode_errors(data):
    """The records before the first damaged byte decode as they were; anything else is a
    MessageDecodeError placed at or after the start of the first damaged or cut record."""
    body = bytearray(b"".join(DAMAGE_RECORDS))
    damaged_at = []
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(body) - 1))
        body[i] = data.draw(st.integers(0, 255))
        damaged_at.append(i)
    ends = [sum(map(len, DAMAGE_RECORDS[:i])) for i in range(1, len(DAMAGE_RECORDS) + 1)]
    cut = data.draw(st.sampled_from(ends) | st.integers(0, len(body)))  # whole records or not
    verify_crc = data.draw(st.booleans())
    spoiled_from = min(damaged_at + [cut])
    intact, start = [], 0
    for record in DAMAGE_RECORDS:
        if start + len(record) > spoiled_from:
            break
        intact.append(start)
        start += len(record)
    try:
        messages = decode_messages(bytes(body[:cut]), verify_crc=verify_crc)
    except MessageDecodeError as err:
        assert err.where == "pull body" and start <= err.position < cut
        assert f"(at byte {err.position} of the pull body" in str(err)
        return
    assert len(messages) >= len(intact)
    assert [(m.topic, m.body, m.properties, m.born_host) for m in messages[:len(intact)]] \
        == DAMAGE_RECORD_FIELDS[:len(intact)]


# ---------------------------------------------------------------- properties (§5.3)


def test_properties_decode_both_trailing_forms_alike():
    assert decode_properties("TAGS\x01a\x02KEYS\x01k1 k2") == \
        decode_properties("TAGS\x01a\x02KEYS\x01k1 k2\x02") == {"TAGS": "a", "KEYS": "k1 k2"}


def test_properties_with_an_empty_name_or_value_are_dropped():
    assert decode_properties("EMPTY\x01\x02\x01orphan\x02KEYS\x01k\x02") == {"KEYS": "k"}


def test_later_duplicate_properties_win():
    assert decode_properties("UNIQ_KEY\x01A\x02TAGS\x01t\x02UNIQ_KEY\x01B") == \
        {"UNIQ_KEY": "B", "TAGS": "t"}


def test_the_first_separator_splits_name_and_value():
    assert decode_properties("K\x01a\x01b") == {"K": "a\x01b"}


def test_property_items_shorter_than_three_characters_are_skipped():
    assert decode_properties("ab\x02a\x01\x02x\x01y") == {"x": "y"}
    assert decode_properties("") == {}


def test_encode_properties_writes_both_forms():
    props = {"KEYS": "k", "TAGS": "a"}
    assert encode_properties(props) == "KEYS\x01k\x02TAGS\x01a\x02"
    assert encode_properties(props, trailing_separator=False) == "KEYS\x01k\x02TAGS\x01a"
    assert encode_properties({}) == ""


@pytest.mark.parametrize("props", [{"a\x01": "v"}, {"k": "v\x02"}, {"k\x02": "v"}])
def test_encode_properties_rejects_separators(props):
    with pytest.raises(ValueError):
        encode_properties(props)


@settings(max_examples=100, deadline=None)
@given(PROPS, st.booleans())
def test_properties_round_trip(props, trailing):
    assert decode_properties(encode_properties(props, trailing)) == props


# ---------------------------------------------------------------- hosts and message ids (§5.5)


def test_offset_msg_id_of_the_published_example():
    host, is_v6 = pack_host("127.0.0.1:10911")
    assert not is_v6
    assert offset_msg_id(host, 256) == TV3_OFFSET_MSG_ID
    assert parse_offset_msg_id(TV3_OFFSET_MSG_ID) == ("127.0.0.1:10911", 256)


@settings(max_examples=100, deadline=None)
@given(host_addresses(), INT64)
def test_offset_msg_ids_round_trip(address, offset):
    host, is_v6 = pack_host(address)
    assert len(host) == (20 if is_v6 else 8)
    assert unpack_host(host) == address
    msg_id = offset_msg_id(host, offset)
    assert re.fullmatch(r"[0-9A-F]{56}" if is_v6 else r"[0-9A-F]{32}", msg_id)
    assert parse_offset_msg_id(msg_id) == (address, offset)


def test_pack_host_accepts_ipv6_with_or_without_brackets():
    assert pack_host("[::1]:10911") == pack_host("::1:10911")
    assert pack_host("::1:10911") == (ipaddress.ip_address("::1").packed
                                      + struct.pack(">i", 10911), True)


@pytest.mark.parametrize("msg_id", ["", "7F000001", "7F00000100002A9F00000000000001", "XYZ"])
def test_malformed_offset_msg_ids_raise_value_error(msg_id):
    with pytest.raises(ValueError):
        parse_offset_msg_id(msg_id)


def test_uniq_keys_are_unique_32_hex_characters():
    keys = [new_uniq_key() for _ in range(70_000)]  # more than the 16-bit counter holds
    assert len(set(keys)) == len(keys)
    assert all(re.fullmatch(r"[0-9A-F]{32}", k) for k in keys)


def test_uniq_keys_carry_ip_and_pid():
    key = UniqKeyFactory("10.1.2.3")()
    assert key[:8] == "0A010203"
    assert key[8:12] == f"{os.getpid() & 0xFFFF:04X}"


def test_separate_uniq_key_factories_do_not_collide():
    a, b = UniqKeyFactory(), UniqKeyFactory()
    assert not {a() for _ in range(100)} & {b() for _ in range(100)}


# ---------------------------------------------------------------- Java hashes and HashMap order


def java_hash_oracle(text: str) -> int:
    """§9.5 spelled out over UTF-16 code units."""
    units = struct.unpack(f">{len(text.encode('utf-16-be')) // 2}H", text.encode("utf-16-be"))
    h = 0
    for unit in units:
        h = (31 * h + unit) % 2 ** 32
    return h - 2 ** 32 if h >= 2 ** 31 else h


def test_java_string_hash_of_the_published_examples():
    assert java_string_hash("a") == 97
    assert java_string_hash("TagA") == 2598919
    assert java_string_hash("") == 0


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30))
def test_java_string_hash_follows_utf16_code_units(text):
    assert java_string_hash(text) == java_hash_oracle(text)


def test_java_string_hash_wraps_to_negative_ints():
    text = "polygenelubricants"  # famous for hashing to Integer.MIN_VALUE in Java
    assert java_string_hash(text) == java_hash_oracle(text) == -2 ** 31


def test_hashmap_order_of_the_stored_properties_in_the_capture_examples():
    assert java_hashmap_order(["KEYS", "TAGS", "UNIQ_KEY", "CLUSTER"]) == \
        ["KEYS", "UNIQ_KEY", "CLUSTER", "TAGS"]
    assert java_hashmap_order(["KEYS", "TAGS", "UNIQ_KEY", "color", "CLUSTER"]) == \
        ["color", "KEYS", "UNIQ_KEY", "CLUSTER", "TAGS"]


def test_hashmap_order_keeps_insertion_order_within_a_bucket():
    assert java_string_hash("Aa") == java_string_hash("BB")  # Java's classic collision
    assert java_hashmap_order(["Aa", "BB"]) == ["Aa", "BB"]
    assert java_hashmap_order(["BB", "Aa"]) == ["BB", "Aa"]


def test_hashmap_order_ignores_repeated_keys():
    assert java_hashmap_order(["TAGS", "KEYS", "TAGS"]) == java_hashmap_order(["TAGS", "KEYS"])


def test_hashmap_order_reproduces_every_stored_message_of_the_capture(capture):
    """The broker parses the sent properties into a HashMap, drops WAIT, adds CLUSTER and writes
    the map back: the stored order is the HashMap's order of those keys."""
    sent_order = {}
    for record in capture.frames:
        header = record["header"]
        if record["rpc"] == "request" and header["code"] == 10:
            text = header["extFields"]["properties"]
            items = [item.split("\x01", 1) for item in text.split("\x02") if item]
            props = dict(items)
            if "UNIQ_KEY" in props:
                sent_order[props["UNIQ_KEY"]] = [k for k, _ in items if k != "WAIT"] + ["CLUSTER"]
    checked = set()
    for response in capture.responses_to(11):
        body = capture.body(response)
        pos = 0
        while pos < len(body):
            layout = record_layout(body, pos, len(body))
            props_pos, props_len = layout[9], layout[10]
            text = body[props_pos:props_pos + props_len].decode()
            stored_keys = [item.split("\x01", 1)[0] for item in text.split("\x02")]
            uniq = dict(item.split("\x01", 1) for item in text.split("\x02")).get("UNIQ_KEY")
            if uniq is not None:
                assert stored_keys == java_hashmap_order(sent_order[uniq]), stored_keys
                checked.add(uniq)
            pos += layout[0]
    assert len(checked) == 12  # every single send of the capture (the batch has no UNIQ_KEY)


# ---------------------------------------------------------------- tag expressions


@pytest.mark.parametrize("expression, tags", [
    ("*", []), ("", []), (None, []), ("  *  ", []), ("TagA", ["TagA"]),
    ("a || b", ["a", "b"]), (" a ||  || b ||", ["a", "b"]),
])
def test_split_tags_expression(expression, tags):
    assert split_tags_expression(expression) == tags
