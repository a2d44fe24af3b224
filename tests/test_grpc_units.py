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
from rocketmq_spark.client.grpc import auth, definition_pb2 as pb, service_pb2 as spb
from rocketmq_spark.client.grpc.endpoints import parse_endpoints
from rocketmq_spark.client.grpc.queue_choice import consistent_hash
from rocketmq_spark.client.grpc.status import check, rpc_error, status_error
from rocketmq_spark.client.pull import is_transient

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
    assert e.target == "ipv4:10.0.0.1:8081,10.0.0.2:8081" and e.scheme == pb.IPv4
    assert parse_endpoints("proxy.example:8081").target == "dns:proxy.example:8081"
    assert parse_endpoints("[::1]:8081").target == "ipv6:[::1]:8081"
    for bad in ("", "host", "host:0", "a:1;b:2", "10.0.0.1:1;name:2"):
        with pytest.raises(ValueError, match="endpoints"):
            parse_endpoints(bad)


def test_status_mapping():
    check(pb.Status(code=pb.OK), "X", "p:1")
    busy = status_error(pb.Status(code=pb.TOO_MANY_REQUESTS, message="slow down"), "X", "p:1")
    assert isinstance(busy, ProxyError) and is_transient(busy) and "TOO_MANY_REQUESTS" in str(busy)
    refused = status_error(pb.Status(code=pb.UNAUTHORIZED, message="User:AK9 is not found"),
                           "X", "p:1")
    assert isinstance(refused, ProxyAuthError) and not is_transient(refused)
    assert "AK9" not in str(refused)
    bad = status_error(pb.Status(code=pb.ILLEGAL_TOPIC), "X", "p:1")
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
    for mod in (pb, spb):
        for name, m in mod.DESCRIPTOR.message_types_by_name.items():
            for f in m.fields:
                assert official[name][f.name] == [f.number, f.type], (name, f.name)
                checked += 1
        for name, e in mod.DESCRIPTOR.enum_types_by_name.items():
            for v in e.values:
                assert official[name][v.name] == v.number, (name, v.name)
    ours = spb.DESCRIPTOR.services_by_name["MessagingService"]
    for method in ours.methods:
        assert official["MessagingService"][method.name] == [method.input_type.name,
                                                             method.output_type.name]
    assert checked > 100


def test_our_modules_coexist_with_another_copy_of_the_package():
    """Our descriptors live in a private pool: a process that also registers
    apache.rocketmq.v2 in the default pool (as the official client does) still imports ours."""
    code = (
        "from google.protobuf import descriptor_pb2, descriptor_pool\n"
        "from rocketmq_spark.client.grpc import definition_pb2 as d, service_pb2 as s\n"
        "fd = descriptor_pb2.FileDescriptorProto.FromString(d.DESCRIPTOR.serialized_pb)\n"
        "fd.name = 'definition.proto'\n"
        "descriptor_pool.Default().Add(fd)\n"
        "import importlib, rocketmq_spark.client.grpc.producer\n"
        "print(s.SendMessageRequest(messages=[d.Message(body=b'x')]).ByteSize())\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "5"
