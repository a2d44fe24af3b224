"""Pure pieces of the gRPC transport: the proxy's queue rule, the signature, endpoints, status
mapping, the proto subset against the official client's field numbers."""
from __future__ import annotations

import hashlib
import hmac
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from hypothesis import given, strategies as st

from rocketmq_spark.client.acl import Credentials
from rocketmq_spark.client.errors import ProxyAuthError, ProxyError, RequestTimeout
from rocketmq_spark.client.grpc import auth, definition_pb2 as definition, service_pb2 as service
from rocketmq_spark.client.grpc.endpoints import parse_endpoints
from rocketmq_spark.client.grpc.queue_choice import consistent_hash
from rocketmq_spark.client.grpc.status import check, rpc_error, status_error
from rocketmq_spark.client.responses import is_transient

ROOT = Path(__file__).resolve().parent.parent


@given(st.integers(-(2 ** 31), 2 ** 31 - 1), st.integers(1, 200))
def test_consistent_hash_moves_keys_only_to_the_new_bucket(key, n):
    a, b = consistent_hash(key, n), consistent_hash(key, n + 1)
    assert 0 <= a < n and (b == a or b == n)


def test_consistent_hash_spreads_keys():
    counts = [0] * 8
    for k in range(8000):
        counts[consistent_hash(k * 7919, 8)] += 1
    assert min(counts) > 800


def test_signature_round_trip_and_format():
    creds = Credentials("AK1", "secret-xyz", security_token="tok")
    md = dict(auth.request_metadata("client-1", "ns", "v", creds, now=0))
    assert md[auth.DATE_TIME] == "19700101T000000Z"
    assert md[auth.SESSION_TOKEN] == "tok" and md[auth.CLIENT_ID] == "client-1"
    expected = hmac.new(b"secret-xyz", b"19700101T000000Z", hashlib.sha1).hexdigest()
    assert md[auth.AUTHORIZATION] == ("MQv2-HMAC-SHA1 Credential=AK1, "
                                      f"SignedHeaders=x-mq-date-time, Signature={expected}")
    assert auth.verify_metadata(md, {"AK1": "secret-xyz"}) == "AK1"
    with pytest.raises(auth.AuthFailure) as info:
        auth.verify_metadata(md, {"AK1": "other"})
    assert "secret-xyz" not in str(info.value) and "AK1" not in str(info.value)
    assert auth.AUTHORIZATION not in dict(auth.request_metadata("c", "", "v"))


def test_endpoints():
    e = parse_endpoints("10.0.0.1:8081;10.0.0.2:8081")
    assert e.target == "ipv4:10.0.0.1:8081,10.0.0.2:8081" and e.scheme == definition.IPv4
    assert parse_endpoints("proxy.example:8081").target == "dns:proxy.example:8081"
    assert parse_endpoints("[::1]:8081").target == "ipv6:[::1]:8081"
    for bad in ("", "host", "host:0", "a:1;b:2", "10.0.0.1:1;name:2"):
        with pytest.raises(ValueError, match="endpoints"):
            parse_endpoints(bad)


def test_status_mapping():
    check(definition.Status(code=definition.OK), "X", "p:1")
    busy = status_error(definition.Status(code=definition.TOO_MANY_REQUESTS,
                                          message="slow down"), "X", "p:1")
    assert isinstance(busy, ProxyError) and is_transient(busy) and "TOO_MANY_REQUESTS" in str(busy)
    refused = status_error(definition.Status(code=definition.UNAUTHORIZED,
                                             message="User:AK9 is not found"), "X", "p:1")
    assert isinstance(refused, ProxyAuthError) and not is_transient(refused)
    assert "AK9" not in str(refused)
    bad = status_error(definition.Status(code=definition.ILLEGAL_TOPIC), "X", "p:1")
    assert not is_transient(bad)

    class Failed(grpc.RpcError):
        def __init__(self, code, details=""):
            self._code, self._details = code, details

        def code(self):
            return self._code

        def details(self):
            return self._details

    assert isinstance(rpc_error(Failed(grpc.StatusCode.DEADLINE_EXCEEDED), "X", "p:1", 2.0),
                      RequestTimeout)
    assert is_transient(rpc_error(Failed(grpc.StatusCode.UNAVAILABLE), "X", "p:1", 2.0))
    assert not is_transient(rpc_error(Failed(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                             "Received message larger than max"), "X", "p", 1))
    assert isinstance(rpc_error(Failed(grpc.StatusCode.UNAUTHENTICATED), "X", "p", 1),
                      ProxyAuthError)


OFFICIAL_NUMBERS = r'''
import json, sys
from rocketmq.grpc_protocol import definition_pb2, service_pb2
out = {}
for mod in (definition_pb2, service_pb2):
    for name, m in mod.DESCRIPTOR.message_types_by_name.items():
        out[name] = {f.name: [f.number, f.type] for f in m.fields}
    for name, e in mod.DESCRIPTOR.enum_types_by_name.items():
        out[name] = {v.name: v.number for v in e.values}
svc = service_pb2.DESCRIPTOR.services_by_name["MessagingService"]
out["MessagingService"] = {m.name: [m.input_type.name, m.output_type.name] for m in svc.methods}
print(json.dumps(out))
'''


@pytest.mark.skipif(not (ROOT / ".venv-grpc-peer" / ".installed-5.1.2").exists(),
                    reason="needs .venv-grpc-peer (ci/setup.sh)")
def test_our_proto_subset_matches_the_official_clients_numbers():
    import json

    proc = subprocess.run([str(ROOT / ".venv-grpc-peer" / "bin" / "python"), "-c",
                           OFFICIAL_NUMBERS], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    official = json.loads(proc.stdout)
    checked = 0
    for mod in (definition, service):
        for name, m in mod.DESCRIPTOR.message_types_by_name.items():
            for f in m.fields:
                assert official[name][f.name] == [f.number, f.type], (name, f.name)
                checked += 1
        for name, e in mod.DESCRIPTOR.enum_types_by_name.items():
            for v in e.values:
                assert official[name][v.name] == v.number, (name, v.name)
    ours = service.DESCRIPTOR.services_by_name["MessagingService"]
    for method in ours.methods:
        assert official["MessagingService"][method.name] == [method.input_type.name,
                                                             method.output_type.name]
    assert checked > 100


def test_our_modules_coexist_with_another_copy_of_the_package():
    """Our descriptors live in a private pool: a process that also registers
    apache.rocketmq.v2 in the default pool (as the official client does) still imports ours."""
    code = (
        "from google.protobuf import descriptor_pb2, descriptor_pool\n"
        "from rocketmq_spark.client.grpc import definition_pb2, service_pb2\n"
        "fd = descriptor_pb2.FileDescriptorProto.FromString(\n"
        "    definition_pb2.DESCRIPTOR.serialized_pb)\n"
        "fd.name = 'definition.proto'\n"
        "descriptor_pool.Default().Add(fd)\n"
        "import importlib, rocketmq_spark.client.grpc.producer\n"
        "print(service_pb2.SendMessageRequest(messages=[definition_pb2.Message(body=b'x')])\n"
        "      .ByteSize())\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "5"


# ----------------------------------------------------------------------------- requests

_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


@given(body=st.binary(min_size=1, max_size=300), tags=st.one_of(st.none(), _text),
       keys=st.one_of(st.none(), _text, st.lists(_text, max_size=3)),
       props=st.dictionaries(_text, _text, max_size=3), group=st.one_of(st.none(), _text),
       delay=st.integers(0, 18), namespace=_text, now_ms=st.integers(0, 2 ** 42),
       topic=st.text("abcXYZ_-%|09", min_size=1, max_size=20))
def test_a_request_carries_every_field_of_the_message(body, tags, keys, props, group, delay,
                                                      namespace, now_ms, topic):
    from rocketmq_spark.client import Message
    from rocketmq_spark.client.grpc import convert
    from rocketmq_spark.client.grpc.send_calls import build_request

    if group and delay:
        delay = 0
    m = Message(topic, body, tags=tags, keys=keys, properties=props, sharding_key=group or None,
                delay_level=delay, uniq_key="ID-1")
    sent = service.SendMessageRequest.FromString(build_request(
        [convert.message_fields(m, namespace, now_ms)]).SerializeToString()).messages[0]
    system = sent.system_properties
    assert (sent.topic.name, sent.topic.resource_namespace, sent.body) == (topic, namespace, body)
    assert dict(sent.user_properties) == props
    assert (system.tag if system.HasField("tag") else None) == (tags or None)
    expected_keys = [] if not keys else [keys] if isinstance(keys, str) else keys
    assert list(system.keys) == expected_keys
    assert (system.message_id, system.body_encoding, system.born_host) == \
        ("ID-1", definition.IDENTITY, convert.BORN_HOST)
    assert system.born_timestamp.ToMilliseconds() == now_ms
    kind = definition.FIFO if group else definition.DELAY if delay else definition.NORMAL
    assert system.message_type == kind
    assert (system.message_group if system.HasField("message_group") else None) == \
        (group or None)
    assert (system.delivery_timestamp.ToMilliseconds()
            if system.HasField("delivery_timestamp") else None) == \
        (now_ms + convert.DELAY_LEVEL_SECONDS[delay - 1] * 1000 if delay else None)


def test_message_fields_refuse_what_the_5x_api_cannot_carry():
    from rocketmq_spark.client import Message
    from rocketmq_spark.client.grpc import convert

    with pytest.raises(ValueError, match="flag"):
        convert.message_fields(Message("T", b"x", flag=1), "", 0)
    with pytest.raises(ValueError, match="both"):
        convert.message_fields(Message("T", b"x", sharding_key="g", delay_level=1), "", 0)
    with pytest.raises(ValueError, match="delay_level must be 1-18"):
        convert.message_fields(Message("T", b"x", delay_level=19), "", 0)
    fresh = convert.message_fields(Message("T", b"x"), "", 0)["system_properties"]
    assert fresh["message_id"]


def test_a_send_becomes_one_call_per_message_fifo_ones_last_in_their_groups_queues():
    from rocketmq_spark.client import Message
    from rocketmq_spark.client.grpc.queue_choice import queue_for_group
    from rocketmq_spark.client.grpc.routes import TopicRoute
    from rocketmq_spark.client.grpc.send_calls import plan_calls
    from rocketmq_spark.client.protocol.route import MessageQueue

    queues = [MessageQueue("T", "broker-a", i) for i in range(4)]
    route = TopicRoute(queues, frozenset(), 0.0)
    messages = [Message("T", b"m0", uniq_key="id0"),
                Message("T", b"m1", sharding_key="g", uniq_key="id1"),
                Message("T", b"m2", tags="t2", uniq_key="id2")]
    calls = plan_calls(messages, route, "", False, None)
    assert [(c.group, list(c.context.indexes), list(c.context.message_ids)) for c in calls] == \
        [(None, [0], ["id0"]), (None, [2], ["id2"]), ("g", [1], ["id1"])]
    assert [[m.body for m in c.request.messages] for c in calls] == [[b"m0"], [b"m2"], [b"m1"]]
    assert calls[0].context.queue.queue_id == -1
    assert calls[2].context.queue == queue_for_group(queues, "g")

    packed = plan_calls(messages, route, "ns", True, None)
    assert [(c.group, list(c.context.indexes)) for c in packed] == [(None, [0, 2]), ("g", [1])]
    assert [(m.body, m.system_properties.tag, m.system_properties.message_id,
             m.topic.resource_namespace) for m in packed[0].request.messages] == \
        [(b"m0", "", "id0", "ns"), (b"m2", "t2", "id2", "ns")]


OFFICIAL_PARSE = r'''
import json, sys
from rocketmq.grpc_protocol import service_pb2
out = []
for line in sys.stdin:
    r = service_pb2.SendMessageRequest.FromString(bytes.fromhex(line.strip()))
    for m in r.messages:
        s = m.system_properties
        out.append({"topic": [m.topic.resource_namespace, m.topic.name],
                    "body": m.body.hex(), "props": dict(m.user_properties),
                    "tag": s.tag if s.HasField("tag") else None, "keys": list(s.keys),
                    "id": s.message_id, "encoding": s.body_encoding, "type": s.message_type,
                    "born": s.born_timestamp.ToMilliseconds(), "host": s.born_host,
                    "group": s.message_group if s.HasField("message_group") else None,
                    "deliver": s.delivery_timestamp.ToMilliseconds()
                               if s.HasField("delivery_timestamp") else None})
print(json.dumps(out))
'''


@pytest.mark.skipif(not (ROOT / ".venv-grpc-peer" / ".installed-5.1.2").exists(),
                    reason="needs .venv-grpc-peer (ci/setup.sh)")
def test_the_official_client_reads_our_requests():
    import json

    from rocketmq_spark.client import Message
    from rocketmq_spark.client.grpc import convert
    from rocketmq_spark.client.grpc.send_calls import build_request

    now = 1_700_000_000_123
    messages = [Message("Orders", "body ✓".encode(), tags="created", keys=["k1", "k 2"],
                        properties={"region": "eu", "ü": "ß"}, uniq_key="A1"),
                Message("Orders", b"\x00" * 300, sharding_key="customer-9", uniq_key="A2"),
                Message("Orders", b"x", delay_level=3, uniq_key="A3")]
    lines = "\n".join(build_request([convert.message_fields(m, "ns1", now)])
                      .SerializeToString().hex() for m in messages)
    proc = subprocess.run([str(ROOT / ".venv-grpc-peer" / "bin" / "python"), "-c",
                           OFFICIAL_PARSE], input=lines, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    common = {"topic": ["ns1", "Orders"], "encoding": definition.IDENTITY, "born": now,
              "host": convert.BORN_HOST}
    assert seen == [
        dict(common, body="body ✓".encode().hex(), props={"region": "eu", "ü": "ß"},
             tag="created", keys=["k1", "k 2"], id="A1", type=definition.NORMAL, group=None,
             deliver=None),
        dict(common, body="00" * 300, props={}, tag=None, keys=[], id="A2", type=definition.FIFO,
             group="customer-9", deliver=None),
        dict(common, body="78", props={}, tag=None, keys=[], id="A3", type=definition.DELAY,
             group=None, deliver=now + 10_000)]


def test_call_metadata_signs_once_a_second_and_numbers_each_call():
    creds = Credentials("AK1", "secret-xyz", security_token="tok")
    clock = [100.2]
    source = auth.CallMetadata("client-1", "ns", "v", creds, clock=lambda: clock[0])
    first, second = dict(source()), dict(source())
    expected = dict(auth.request_metadata("client-1", "ns", "v", creds, now=100.7))
    for md in (first, second):
        assert {k: v for k, v in md.items() if k != auth.REQUEST_ID} == \
            {k: v for k, v in expected.items() if k != auth.REQUEST_ID}
        assert auth.verify_metadata(md, {"AK1": "secret-xyz"}) == "AK1"
    assert first[auth.REQUEST_ID] != second[auth.REQUEST_ID]
    clock[0] = 101.0
    later = dict(source())
    assert later[auth.DATE_TIME] == "19700101T000141Z" != first[auth.DATE_TIME]
    assert auth.verify_metadata(later, {"AK1": "secret-xyz"}) == "AK1"
    assert "secret-xyz" not in repr(source()) and auth.AUTHORIZATION not in dict(
        auth.CallMetadata("c", "", "v")())


def test_dispatcher_bounds_calls_in_flight_and_keeps_each_group_in_order():
    """The dispatcher alone, on a real event loop, with calls that answer after a random
    pause: never more than max_in_flight at once, a group's calls one at a time in order,
    a failed call fails its group's later calls instead of letting them overtake it."""
    import asyncio
    import random

    from rocketmq_spark.client.errors import ClientClosed
    from rocketmq_spark.client.grpc.dispatch import Call, Dispatcher

    rng = random.Random(7)
    running, peak, started, outcomes = set(), [0], [], {}

    async def invoke(call):
        running.add(call.context)
        peak[0] = max(peak[0], len(running))
        if call.group is not None:
            assert not any(c[0] == call.group for c in running - {call.context})
        started.append(call.context)
        await asyncio.sleep(rng.random() / 500)
        running.discard(call.context)
        if call.context == ("g1", 13):
            raise RuntimeError("refused")
        return [call.context]

    def done(call, results, error):
        outcomes[call.context] = error if error is not None else results

    async def main():
        dispatcher = Dispatcher(5, invoke)
        calls = [Call(b"", f"g{i % 3}" if i % 4 else None, done, (f"g{i % 3}" if i % 4 else
                                                                  None, i)) for i in range(60)]
        dispatcher.submit(calls[:30])
        dispatcher.submit(calls[30:])
        while len(outcomes) < 60:
            await asyncio.sleep(0.01)
        assert dispatcher.in_flight == 0
        dispatcher.close("closed for the test")
        late = Call(b"", None, done, (None, 99))
        dispatcher.submit([late])
        assert isinstance(outcomes[(None, 99)], ClientClosed)
        return calls

    calls = asyncio.run(main())
    assert peak[0] == 5
    for group in ("g0", "g1", "g2"):
        mine = [c.context for c in calls if c.group == group]
        order = [c for c in started if c[0] == group]
        if group == "g1":
            failed = mine.index(("g1", 13))
            assert order == mine[:failed + 1]  # nothing of g1 started after the failure
            assert all(isinstance(outcomes[c], RuntimeError) for c in mine[failed:])
            assert all(outcomes[c] == [c] for c in mine[:failed])
        else:
            assert order == mine and all(outcomes[c] == [c] for c in mine)
