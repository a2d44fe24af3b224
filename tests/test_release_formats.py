"""Formats and answers that changed from 4.9.8 to 5.1.4, held to the genuine 5.1.4 capture
(captures/rocketmq-5.1.4-proxy-remoting: the name server's and the broker's answers to the
proxy): the embedded server under ``release="5.1"`` gives them, under the default 4.9.8's."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rocketmq_spark.client.admin import Admin
from rocketmq_spark.client.protocol.codes import RequestCode, ResponseCode
from rocketmq_spark.client.protocol.route import MessageQueue
from raw_client import RawClient

CAPTURE = Path("/work/shared/captures/rocketmq-5.1.4-proxy-remoting/frames.jsonl")
if not CAPTURE.exists():
    CAPTURE = Path(__file__).resolve().parents[2] / "shared" / "captures" / \
        "rocketmq-5.1.4-proxy-remoting" / "frames.jsonl"
pytestmark = pytest.mark.skipif(not CAPTURE.exists(), reason="the 5.1.4 capture is absent")
GENUINE_BROKER = b"127.0.0.1:30911"


@pytest.fixture(scope="module")
def frames():
    with CAPTURE.open() as f:
        return {json.loads(line)["seq"]: json.loads(line) for line in f}


@pytest.fixture(params=["4.9", "5.1"])
def one_broker(request, embedded_cluster_factory):
    cluster = embedded_cluster_factory(brokers=1, release=request.param)
    cluster.create_topic("CapNormalT", 4)
    cluster.create_topic("CapFifoT", 4)
    return cluster


def _ask(addr: str, code: int, ext=None):
    client = RawClient(addr)
    try:
        return client.request(code, ext or {}, version=441)
    finally:
        client.close()


def test_route_and_cluster_info_bodies(one_broker, frames):
    """5.x's BrokerData carries ``enableActingMaster``: the name server's route (seq 2) and
    cluster info (seq 75) are byte for byte the genuine 5.1.4 ones, the broker's address aside;
    4.9.8's have no such field."""
    ours_addr = one_broker.brokers[0].addr.encode()
    route = _ask(one_broker.namesrv_addr, RequestCode.GET_ROUTEINFO_BY_TOPIC,
                 {"topic": "CapNormalT"})
    info = _ask(one_broker.namesrv_addr, RequestCode.GET_BROKER_CLUSTER_INFO)
    genuine_route = bytes.fromhex(frames[2]["body_hex"]).replace(GENUINE_BROKER, ours_addr)
    genuine_info = bytes.fromhex(frames[75]["body_hex"]).replace(GENUINE_BROKER, ours_addr)
    if one_broker.options.at_least("5.1"):
        assert route.body == genuine_route
        assert info.body == genuine_info
    else:
        assert route.body == genuine_route.replace(b',"enableActingMaster":false', b"")
        assert info.body == genuine_info.replace(b',"enableActingMaster":false', b"")


def test_an_empty_queue_has_no_committed_offset_from_5_1(one_broker, frames):
    """QUERY_CONSUMER_OFFSET of a group without an offset: 5.1.4 answers 0 only when message 0
    is there (checkInMemByConsumeOffset) and QUERY_NOT_FOUND for an empty queue (seq 298);
    4.9.8 answers 0 for an empty queue too."""
    addr = one_broker.brokers[0].addr
    one_broker.append("CapFifoT", one_broker.brokers[0].name, 2, [b"x"])
    ask = {"consumerGroup": "CapOrderG", "topic": "CapFifoT"}
    empty = _ask(addr, RequestCode.QUERY_CONSUMER_OFFSET, dict(ask, queueId="0"))
    filled = _ask(addr, RequestCode.QUERY_CONSUMER_OFFSET, dict(ask, queueId="2"))
    refused = _ask(addr, RequestCode.QUERY_CONSUMER_OFFSET,
                   dict(ask, queueId="2", setZeroIfNotFound="false"))
    assert (filled.code, filled.fields.get("offset")) == (ResponseCode.SUCCESS, "0")
    if one_broker.options.at_least("5.1"):
        genuine = json.loads(frames[298]["header_text"])
        assert (empty.code, empty.remark) == (genuine["code"], genuine["remark"])
        assert (refused.code, refused.remark) == (
            ResponseCode.QUERY_NOT_FOUND,
            "Not found, do not set to zero, maybe this group boot first")
    else:
        assert (empty.code, empty.fields.get("offset")) == (ResponseCode.SUCCESS, "0")


def test_the_client_reads_no_committed_offset_on_5_1(one_broker):
    """What the source sees (its lookup sends setZeroIfNotFound=false, as Java's 5.x client
    may): no committed offset is "none" on 5.1.4 (QUERY_NOT_FOUND, not an error), 0 on 4.9.8
    for an empty queue (the field is unknown there)."""
    with Admin(one_broker.namesrv_addr) as admin:
        queue = MessageQueue("CapFifoT", one_broker.brokers[0].name, 0)
        found = admin.offsets("committed", [queue], group="NoSuchGroup")
    assert found[queue] == (None if one_broker.options.at_least("5.1") else 0)


def test_the_client_reads_every_genuine_5_1_4_pull_answer(frames):
    """Each PULL_MESSAGE answer of the capture (the 5.1.4 broker's, relayed by the proxy):
    statuses and offsets read, FOUND bodies decoded with their CRCs checked; the proxy's
    refusal (seq 907) raises its code and remark."""
    from rocketmq_spark.client.errors import ResponseError
    from rocketmq_spark.client.protocol.frame import decode_payload
    from rocketmq_spark.client.protocol.message import decode_messages
    from rocketmq_spark.client.pull import PullStatus, pull_result

    statuses, messages = [], 0
    for f in frames.values():
        if f.get("request_code_name") != "PULL_MESSAGE" or f["rpc"] != "response":
            continue
        header = f["header_text"].encode()
        cmd = decode_payload(len(header).to_bytes(4, "big") + header
                             + bytes.fromhex(f["body_hex"]))
        if f["header"]["code"] == ResponseCode.VERSION_NOT_SUPPORTED:
            with pytest.raises(ResponseError, match="doesn't have field bname"):
                pull_result(cmd)
            continue
        result = pull_result(cmd)
        statuses.append(result.status)
        assert result.next_begin_offset == int(f["header"]["extFields"]["nextBeginOffset"])
        if result.status is PullStatus.FOUND:
            found = decode_messages(result.body)
            assert found and all(m.queue_offset < result.next_begin_offset for m in found)
            messages += len(found)
    assert statuses.count(PullStatus.FOUND) == 44 and messages == 56


def test_the_client_reads_genuine_5_1_4_check_backs(frames):
    """The 5.1.4 broker's CHECK_TRANSACTION_STATE (seq 752-758, with 5.x's ``bname``) and the
    proxy's relay of them (seq 759-768, without it): offsets, ids and the re-stored half
    message with its properties are read."""
    from rocketmq_spark.client.protocol.frame import decode_payload
    from rocketmq_spark.client.txn.transaction import parse_check_request

    checks = [f for f in frames.values() if f["rpc"] in ("request", "oneway")
              and f["header"]["code"] == RequestCode.CHECK_TRANSACTION_STATE]
    assert len(checks) == 14
    for f in checks:
        header = f["header_text"].encode()
        cmd = decode_payload(len(header).to_bytes(4, "big") + header
                             + bytes.fromhex(f["body_hex"]))
        ext = f["header"]["extFields"]
        request = parse_check_request("proxy", cmd)
        assert request.queue_offset == int(ext["tranStateTableOffset"])
        assert request.commit_log_offset == int(ext["commitLogOffset"])
        assert request.uniq_key == ext["msgId"] == request.transaction_id
        assert request.message is not None and request.group in ("CapTxG", "CapRawTxG")
        assert request.properties["TRANSACTION_CHECK_TIMES"] == "1"
