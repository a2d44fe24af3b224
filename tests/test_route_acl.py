"""Route data (§4: fastjson's bare integer keys, queue derivation) and ACL signing (§7.1, TV5)."""
from __future__ import annotations

import json
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketmq_spark.client.acl import Credentials, signed_content, verify
from rocketmq_spark.client.errors import ProtocolError
from rocketmq_spark.client.protocol.frame import RemotingCommand, decode_frame, encode_frame
from rocketmq_spark.client.protocol.route import (
    BrokerData, ClusterInfo, MessageQueue, QueueData, TopicRouteData, dumps_fastjson,
    loads_lenient, quote_bare_keys, split_address,
)

# ---------------------------------------------------------------- §4.3

QUIRK_CASE = '{"a":"x,{0:y}","m":{ -1 :"z"},"l":[{3:"q"}]}'

# §4.3's two forms of one route (master + slave).
ROUTE_BARE = (b'{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:10911",1:"127.0.0.1:10921"},'
              b'"brokerName":"broker-a","cluster":"DefaultCluster","enableActingMaster":false}],'
              b'"filterServerTable":{},"queueDatas":[{"brokerName":"broker-a","perm":6,'
              b'"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}]}')
ROUTE_STANDARD = ROUTE_BARE.replace(b'{0:"127.0.0.1:10911",1:',
                                    b'{"0":"127.0.0.1:10911","1":')


def test_the_reference_quirk_case_parses():
    assert loads_lenient(QUIRK_CASE) == {"a": "x,{0:y}", "m": {"-1": "z"}, "l": [{"3": "q"}]}


def test_quoting_leaves_strings_and_spacing_alone():
    assert quote_bare_keys(QUIRK_CASE) == '{"a":"x,{0:y}","m":{ "-1" :"z"},"l":[{"3":"q"}]}'


@pytest.mark.parametrize("text, expected", [
    pytest.param('{"k\\"{0:":{1:"v\\\\"}}', {'k"{0:': {"1": "v\\"}}, id="escaped-quotes"),
    pytest.param('{\n  0 : "a",\n\t12:"b"}', {"0": "a", "12": "b"}, id="whitespace"),
    pytest.param('{"a":[0,1,{2:[3,{4:5}]}]}', {"a": [0, 1, {"2": [3, {"4": 5}]}]},
                 id="numbers-in-arrays-untouched"),
    pytest.param('{"n":-1,"m":{-7:-8}}', {"n": -1, "m": {"-7": -8}}, id="negative"),
    pytest.param(b'{0:"\xc3\xbc{1:"}', {"0": "ü{1:"}, id="bytes-utf8"),
])
def test_bare_keys_are_quoted_only_where_keys_stand(text, expected):
    assert loads_lenient(text) == expected


JSON_LEAF = st.none() | st.booleans() | st.integers() | st.text(max_size=12)
JSON_VALUES = st.recursive(
    JSON_LEAF | st.sampled_from(["{0:", ",1:", '"', "\\", "{", "}"]),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.integers(-10 ** 6, 10 ** 6) | st.text(max_size=8), inner, max_size=4),
    max_leaves=20)


def with_string_keys(value):
    if isinstance(value, dict):
        return {str(k): with_string_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [with_string_keys(v) for v in value]
    return value


@settings(max_examples=200, deadline=None)
@given(JSON_VALUES)
def test_fastjson_non_standard_output_parses_back(value):
    """Bare integer keys anywhere, strings containing key-like text anywhere."""
    assert loads_lenient(dumps_fastjson(value, standard=False)) == with_string_keys(value)


@settings(max_examples=200, deadline=None)
@given(JSON_VALUES)
def test_quoting_leaves_standard_json_unchanged(value):
    text = json.dumps(with_string_keys(value))
    assert quote_bare_keys(text) == text


@pytest.mark.parametrize("data, position", [
    pytest.param(b'{0:"a"} x', 8, id="trailing-garbage"),
    pytest.param(b'{0:"a",1:"b",]', 13, id="position-in-the-received-text"),
    pytest.param('{"é":1,0:2,}'.encode(), 12, id="position-in-bytes"),
    pytest.param(b'{1.5:"a"}', 1, id="non-integer-key"),
    pytest.param(b'{"a":"\xff"}', 6, id="not-utf8"),
    pytest.param(b"[" * 100_000, 0, id="deep-nesting"),
])
def test_bodies_that_are_not_json_raise_protocol_error(data, position):
    with pytest.raises(ProtocolError) as info:
        loads_lenient(data)
    assert info.value.position == position


def test_reference_routes_parse_the_same_in_both_forms():
    bare, standard = TopicRouteData.from_json(ROUTE_BARE), TopicRouteData.from_json(ROUTE_STANDARD)
    assert bare == standard
    assert bare.broker_datas == [BrokerData("broker-a", {0: "127.0.0.1:10911",
                                                         1: "127.0.0.1:10921"})]
    assert bare.queue_datas == [QueueData("broker-a", 4, 4, 6, 0)]
    assert bare.broker("broker-a").master_addr == "127.0.0.1:10911"


@pytest.mark.parametrize("data", [
    b'[]', b'"route"', b'{"queueDatas":[{"brokerName":"a"}]}', b'{"queueDatas":["x"]}',
    b'{"brokerDatas":[{"brokerName":"a","brokerAddrs":{"x":"h:1"}}]}',
    b'{"brokerDatas":[{"brokerName":"a","brokerAddrs":[1]}]}',
    b'{"queueDatas":[{"brokerName":"a","readQueueNums":"many","writeQueueNums":1}]}',
])
def test_routes_with_missing_or_mistyped_fields_raise_protocol_error(data):
    with pytest.raises(ProtocolError):
        TopicRouteData.from_json(data)


# ---------------------------------------------------------------- genuine route bodies


def route_responses(capture, topic=None, version=None):
    """(request, response) pairs of successful GET_ROUTEINFO_BY_TOPIC calls."""
    pairs = []
    for response in capture.responses_to(105):
        request = capture.request_of(response)
        header = request["header"]
        if (response["header"]["code"] == 0 and topic in (None, header["extFields"]["topic"])
                and version in (None, header["version"])):
            pairs.append((request, response))
    return pairs


def test_route_bodies_for_version_63_have_bare_keys_and_parse(capture):
    pairs = route_responses(capture, "CapTopic", version=63)
    assert len(pairs) == 4
    for _, response in pairs:
        body = capture.body(response)
        assert b'{0:"' in body
        with pytest.raises(ValueError):
            json.loads(body)
        route = TopicRouteData.from_json(body)
        assert route.queue_datas == [QueueData("broker-a", 4, 4, 6, 0)]
        assert route.broker_datas == [BrokerData("broker-a", {0: "127.0.0.1:10911"},
                                                 "DefaultCluster")]
        assert route.readable_queues("CapTopic") == \
            [MessageQueue("CapTopic", "broker-a", i) for i in range(4)]
        assert route.writable_queues("CapTopic") == route.readable_queues("CapTopic")


def test_route_body_for_version_409_has_quoted_keys_and_parses(capture):
    ((request, response),) = route_responses(capture, "TBW102", version=409)
    body = capture.body(response)
    assert b'{"0":"' in body
    assert TopicRouteData.from_json(body) == TopicRouteData.from_json(json.dumps(json.loads(body)))
    route = TopicRouteData.from_json(body)
    assert route.queue_datas == [QueueData("broker-a", 4, 4, 7, 0)]
    assert route.broker("broker-a").broker_addrs == {0: "127.0.0.1:10911"}


def test_retry_topic_route_has_one_queue(capture):
    ((_, response),) = route_responses(capture, "%RETRY%CapPushGroup")
    route = TopicRouteData.from_json(capture.body(response))
    assert route.readable_queues("%RETRY%CapPushGroup") == \
        [MessageQueue("%RETRY%CapPushGroup", "broker-a", 0)]


def test_to_json_non_standard_reproduces_the_genuine_233_byte_body(capture):
    bodies = {capture.body(r) for _, r in route_responses(capture, version=63)}
    assert len(bodies) == 3  # CapTopic, %RETRY%CapPushGroup and TBW102 (perm 7)
    for body in bodies:
        assert len(body) == 233
        assert TopicRouteData.from_json(body).to_json(standard=False) == body


def test_to_json_standard_reproduces_the_genuine_browser_compatible_body(capture):
    ((_, response),) = route_responses(capture, "TBW102", version=409)
    body = capture.body(response)
    assert TopicRouteData.from_json(body).to_json(standard=True) == body


def test_both_genuine_forms_of_the_tbw102_route_mean_the_same(capture):
    ((_, bare),) = route_responses(capture, "TBW102", version=63)
    ((_, standard),) = route_responses(capture, "TBW102", version=409)
    assert b'{0:"' in capture.body(bare)
    assert TopicRouteData.from_json(capture.body(bare)) == \
        TopicRouteData.from_json(capture.body(standard))


def test_genuine_cluster_info_parses_and_re_encodes_byte_exact(capture):
    (response,) = capture.responses_to(106)
    body = capture.body(response)
    assert b'{0:"127.0.0.1:10911"}' in body
    info = ClusterInfo.from_json(body)
    assert info.broker_addr_table == {
        "broker-a": BrokerData("broker-a", {0: "127.0.0.1:10911"}, "DefaultCluster")}
    assert info.cluster_addr_table == {"DefaultCluster": ["broker-a"]}
    assert info.to_json() == body


def test_reference_route_re_encodes_in_both_forms():
    route = TopicRouteData.from_json(ROUTE_BARE)
    route.broker_datas[0].cluster = "DefaultCluster"
    expected = ROUTE_BARE.replace(b',"enableActingMaster":false', b"")
    assert route.to_json(standard=False) == expected
    assert route.to_json(standard=True) == expected.replace(b'{0:"127.0.0.1:10911",1:',
                                                            b'{"0":"127.0.0.1:10911","1":')


# ---------------------------------------------------------------- queue derivation (§4.4)


def route(*queue_datas, brokers=None) -> TopicRouteData:
    brokers = brokers if brokers is not None else {
        q.broker_name: {0: f"10.0.0.{i}:10911"} for i, q in enumerate(queue_datas)}
    return TopicRouteData(queue_datas=list(queue_datas),
                          broker_datas=[BrokerData(n, a) for n, a in brokers.items()])


def queue_ids(queues):
    return [(q.broker_name, q.queue_id) for q in queues]


@pytest.mark.parametrize("perm, readable, writable", [
    (6, True, True), (7, True, True), (4, True, False), (2, False, True), (0, False, False),
    (12, True, False), (1, False, False),
])
def test_permissions_decide_readable_and_writable_queues(perm, readable, writable):
    r = route(QueueData("b", 2, 2, perm))
    assert queue_ids(r.readable_queues("T")) == ([("b", 0), ("b", 1)] if readable else [])
    assert queue_ids(r.writable_queues("T")) == ([("b", 0), ("b", 1)] if writable else [])


def test_more_read_queues_than_write_queues():
    r = route(QueueData("b", 8, 4, 6))
    assert [q.queue_id for q in r.readable_queues("T")] == list(range(8))
    assert [q.queue_id for q in r.writable_queues("T")] == list(range(4))


def test_brokers_without_addresses_are_neither_readable_nor_writable():
    r = route(QueueData("listed", 2, 2, 6), QueueData("unlisted", 2, 2, 6),
              QueueData("empty", 2, 2, 6), brokers={"listed": {0: "h:1"}, "empty": {}})
    assert {q.broker_name for q in r.readable_queues("T")} == {"listed"}
    assert {q.broker_name for q in r.writable_queues("T")} == {"listed"}


def test_a_broker_with_only_a_slave_is_readable_but_not_writable():
    r = route(QueueData("b", 2, 2, 6), brokers={"b": {1: "h:2"}})
    assert len(r.readable_queues("T")) == 2 and r.writable_queues("T") == []
    assert r.broker("b").select_addr(0) == "h:2"


def test_queues_are_sorted_by_topic_broker_and_queue_id():
    r = route(QueueData("b-2", 2, 2, 6), QueueData("b-1", 3, 3, 6))
    assert queue_ids(r.readable_queues("T")) == [("b-1", 0), ("b-1", 1), ("b-1", 2), ("b-2", 0),
                                                 ("b-2", 1)]


@settings(max_examples=100, deadline=None)
@given(st.text(st.characters(blacklist_characters="/"), min_size=1),
       st.text(st.characters(blacklist_characters="/"), min_size=1), st.integers(-5, 10 ** 6))
def test_message_queue_keys_round_trip(topic, broker, queue_id):
    mq = MessageQueue(topic, broker, queue_id)
    assert mq.key == f"{topic}/{broker}/{queue_id}" == str(mq)
    assert MessageQueue.from_key(mq.key) == mq


@pytest.mark.parametrize("key", ["T/b", "T/b/x", "T/b/1/2", "", "T/b/"])
def test_malformed_queue_keys_raise_value_error(key):
    with pytest.raises(ValueError):
        MessageQueue.from_key(key)


@pytest.mark.parametrize("address, expected", [
    ("127.0.0.1:10911", ("127.0.0.1", 10911)), ("::1:10911", ("::1", 10911)),
    ("[fe80::1]:9876", ("fe80::1", 9876)), ("broker.example:8080", ("broker.example", 8080)),
])
def test_split_address_at_the_last_colon(address, expected):
    assert split_address(address) == expected


@pytest.mark.parametrize("address", ["localhost", "host:", "host:port", ""])
def test_split_address_rejects_addresses_without_a_port(address):
    with pytest.raises(ValueError):
        split_address(address)


# ---------------------------------------------------------------- ACL 1.0 signing (§7.1, TV5)

TV5 = bytes.fromhex("""
00 00 00 f1 00 00 00 ed 7b 22 63 6f 64 65 22 3a 31 35 2c 22 65 78 74 46 69 65 6c 64 73 22 3a 7b
22 63 6f 6e 73 75 6d 65 72 47 72 6f 75 70 22 3a 22 47 22 2c 22 74 6f 70 69 63 22 3a 22 54 22 2c
22 71 75 65 75 65 49 64 22 3a 22 30 22 2c 22 63 6f 6d 6d 69 74 4f 66 66 73 65 74 22 3a 22 31 22
2c 22 41 63 63 65 73 73 4b 65 79 22 3a 22 61 6b 22 2c 22 53 69 67 6e 61 74 75 72 65 22 3a 22 4a
45 31 58 43 6f 69 74 73 35 69 63 6c 4d 53 37 6f 56 51 6d 47 42 30 6f 68 66 73 3d 22 7d 2c 22 66
6c 61 67 22 3a 30 2c 22 6c 61 6e 67 75 61 67 65 22 3a 22 50 59 54 48 4f 4e 22 2c 22 6f 70 61 71
75 65 22 3a 32 2c 22 73 65 72 69 61 6c 69 7a 65 54 79 70 65 43 75 72 72 65 6e 74 52 50 43 22 3a
22 4a 53 4f 4e 22 2c 22 76 65 72 73 69 6f 6e 22 3a 34 30 39 7d""")
TV5_SIGNATURE = "JE1XCoits5iclMS7oVQmGB0ohfs="
SECRET = "s3cr3t-Sentinel-9f1e"


def tv5_fields() -> dict:
    return {"consumerGroup": "G", "topic": "T", "queueId": "0", "commitOffset": "1"}


def test_tv5_signature():
    signed = Credentials("ak", "sk").sign(tv5_fields())
    assert signed["AccessKey"] == "ak"
    assert signed["Signature"] == TV5_SIGNATURE


def test_tv5_signed_content_is_values_in_key_order():
    assert signed_content(dict(tv5_fields(), AccessKey="ak")) == b"ak1G0T"


def test_tv5_full_frame_is_byte_exact():
    cmd = RemotingCommand(code=15, ext_fields=Credentials("ak", "sk").sign(tv5_fields()), opaque=2)
    data = encode_frame(cmd)
    assert len(data) == 245 and data == TV5


def test_verify_accepts_tv5():
    cmd = decode_frame(TV5)
    assert verify(cmd.fields, cmd.body, "sk")


@pytest.mark.parametrize("field", ["consumerGroup", "topic", "queueId", "commitOffset",
                                   "AccessKey", "Signature"])
def test_verify_rejects_a_tampered_field(field):
    fields = decode_frame(TV5).fields
    fields[field] += "x"
    assert not verify(fields, b"", "sk")


def test_verify_rejects_added_or_removed_fields_and_a_wrong_secret():
    fields = decode_frame(TV5).fields
    assert not verify(dict(fields, extra="1"), b"", "sk")
    assert not verify({k: v for k, v in fields.items() if k != "topic"}, b"", "sk")
    assert not verify({k: v for k, v in fields.items() if k != "Signature"}, b"", "sk")
    assert not verify(fields, b"", "sK")


def test_verify_rejects_a_tampered_body():
    fields = Credentials("ak", "sk").sign(tv5_fields(), b'{"body":1}')
    assert verify(fields, b'{"body":1}', "sk")
    assert not verify(fields, b'{"body":2}', "sk")
    assert not verify(fields, b"", "sk")


def test_verify_answers_false_for_a_non_ascii_signature():
    assert not verify(dict(decode_frame(TV5).fields, Signature="JE1XCoits5iclMS7oVQmGB0ohfs€"),
                      b"", "sk")


def test_body_is_signed_after_the_values():
    assert signed_content({"b": "2", "a": "1"}, b"BODY") == b"12BODY"


def test_signature_and_unique_key_query_are_not_signed():
    assert signed_content({"a": "1", "Signature": "s", "_UNIQUE_KEY_QUERY": "q"}) == b"1"


def test_keys_sort_by_utf16_code_units_like_java():
    # U+10000 is the surrogate pair D800 DC00, which Java's TreeMap puts before U+FFFF.
    assert signed_content({"\uffff": "late", "\U00010000": "early"}) == b"earlylate"
    assert signed_content({"b": "3", "B": "1", "a": "2"}) == b"123"  # B < a < b


def test_resigning_replaces_the_old_signature():
    creds = Credentials("ak", "sk")
    fields = creds.sign(tv5_fields())
    assert creds.sign(dict(fields))["Signature"] == TV5_SIGNATURE


def test_security_token_is_added_and_signed():
    fields = Credentials("ak", "sk", security_token="tok").sign(tv5_fields())
    assert fields["SecurityToken"] == "tok"
    assert verify(fields, b"", "sk")
    assert not verify(dict(fields, SecurityToken="other"), b"", "sk")


@pytest.mark.parametrize("ak, sk", [("", "sk"), ("ak", ""), (None, "sk")])
def test_credentials_need_both_keys(ak, sk):
    with pytest.raises(ValueError):
        Credentials(ak, sk)


def test_secret_is_absent_from_repr_and_str():
    creds = Credentials("my-access-key", SECRET)
    for text in (repr(creds), str(creds), f"{creds}", f"{creds!r}", repr([creds]),
                 repr({"c": creds})):
        assert SECRET not in text
        assert "my-access-key" not in text  # the access key is a credential too


def test_secret_is_absent_from_a_signed_command_and_its_repr():
    creds = Credentials("ak", SECRET)
    cmd = RemotingCommand(code=15, ext_fields=creds.sign(tv5_fields()))
    assert SECRET.encode() not in encode_frame(cmd)
    assert SECRET not in repr(cmd) and cmd.fields["Signature"] not in repr(cmd)


def test_secret_is_absent_from_exception_text():
    bad_secret = SECRET + "\ud800"  # not encodable: construction must fail without echoing it
    with pytest.raises(ValueError) as info:
        Credentials("ak", bad_secret)
    for text in (str(info.value), repr(info.value), repr(info.value.args)):
        assert SECRET not in text
    assert info.value.__cause__ is None and info.value.__suppress_context__

    creds = Credentials("ak", SECRET)
    with pytest.raises(TypeError) as info:
        creds.sign({"queueId": 0})  # values must be strings
    assert SECRET not in str(info.value) and SECRET not in repr(info.value)


def test_pickled_credentials_still_sign_and_stay_hidden():
    creds = Credentials("ak", SECRET)
    copy = pickle.loads(pickle.dumps(creds))
    assert copy == creds and SECRET not in repr(copy)
    assert copy.sign(tv5_fields()) == creds.sign(tv5_fields())
