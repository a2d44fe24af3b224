"""Replay the genuine RocketMQ 4.9.8 capture against the embedded server.

Every request the C++ client (and mqadmin, which created CapTopic with 4 queues) sent in
``frames.jsonl`` is sent again, byte for byte, in capture order, on one connection per captured
connection, to a one-broker embedded cluster. Each answer must have the genuine answer's shape:
code, remark, language/version, the ext-field keys in the genuine order and their values, route
and cluster bodies byte-identical (up to the broker's port), and pulls with the same statuses,
offsets and stored records (up to timestamps, hosts and the port inside message ids). Requests the
genuine broker left unanswered (long polls parked at shutdown) must stay unanswered.
"""
from __future__ import annotations

import json
import time
from typing import Dict, List

import pytest

from rocketmq_spark.client.protocol.message import decode_messages, parse_offset_msg_id
from rocketmq_spark.embedded import EmbeddedCluster
from raw_client import RawClient

GENUINE_BROKER = "127.0.0.1:10911"
REPLAYED_KINDS = ("cpp-client", "mqadmin")
NOTIFY = 40


def _split_records(body: bytes, msgs) -> List[bytes]:
    out, pos = [], 0
    for m in msgs:
        out.append(body[pos:pos + m.store_size])
        pos += m.store_size
    return out


def _compare_pull_bodies(seq, genuine: bytes, ours: bytes, broker_addr: str,
                         hosts: Dict[str, str], problems: List[str]) -> None:
    """``hosts`` maps the genuine client addresses to the replaying connections' addresses."""
    g_msgs = decode_messages(genuine, decompress=False)
    o_msgs = decode_messages(ours, decompress=False)
    if len(g_msgs) != len(o_msgs):
        problems.append(f"seq {seq}: {len(o_msgs)} messages, genuine {len(g_msgs)}")
        return
    for g_rec, o_rec, g, o in zip(_split_records(genuine, g_msgs), _split_records(ours, o_msgs),
                                  g_msgs, o_msgs):
        for field in ("topic", "queue_id", "queue_offset", "physical_offset", "sys_flag", "flag",
                      "stored_body", "body_crc", "store_size", "born_timestamp",
                      "reconsume_times", "prepared_transaction_offset", "magic"):
            if getattr(g, field) != getattr(o, field):
                problems.append(f"seq {seq} offset {g.queue_offset}: {field} "
                                f"{getattr(o, field)!r} != genuine {getattr(g, field)!r}")
        if list(g.properties.items()) != list(o.properties.items()):
            problems.append(f"seq {seq} offset {g.queue_offset}: properties "
                            f"{list(o.properties.items())} != genuine {list(g.properties.items())}")
        born_host = hosts.get(g.born_host)
        if o.store_host != broker_addr or o.born_host != born_host:
            problems.append(f"seq {seq}: hosts {o.born_host} -> {o.store_host}, expected "
                            f"{born_host} -> {broker_addr}")
        # with bornHost, storeTimestamp and storeHost (bytes 48..72) normalised, the records
        # are byte-identical: same layout, CRC, offsets and property bytes in the same order
        if g_rec[:48] + o_rec[48:72] + g_rec[72:] != o_rec:
            problems.append(f"seq {seq} offset {g.queue_offset}: record bytes differ beyond "
                            "hosts and store time")


def _compare_ext(seq, code_name, genuine: Dict[str, str], ours: Dict[str, str], broker_addr,
                 problems: List[str]) -> None:
    if list(genuine) != list(ours):
        problems.append(f"seq {seq} ({code_name}): ext keys {list(ours)} != genuine "
                        f"{list(genuine)}")
        return
    for key, g_value in genuine.items():
        o_value = ours[key]
        if key == "msgId":
            g_addr, g_off = parse_offset_msg_id(g_value)
            o_addr, o_off = parse_offset_msg_id(o_value)
            if g_off != o_off or o_addr != broker_addr:
                problems.append(f"seq {seq}: msgId {o_value} ({o_addr}, {o_off}) vs genuine "
                                f"{g_value} ({g_addr}, {g_off})")
        elif o_value != g_value:
            problems.append(f"seq {seq} ({code_name}): {key}={o_value!r}, genuine {g_value!r}")


@pytest.fixture(scope="module")
def replay(capture):
    """Run the replay once; returns (problems, cluster facts) for the tests below."""
    frames = capture.frames
    problems: List[str] = []
    notes: Dict[int, List] = {}
    with EmbeddedCluster(brokers=1) as cluster:
        broker_addr = cluster.broker("broker-a").addr
        clients: Dict[int, RawClient] = {}
        hosts: Dict[str, str] = {}  # genuine client address -> replaying client address
        parked = []
        try:
            for rec in frames:
                if rec["client_kind"] not in REPLAYED_KINDS or rec["rpc"] == "response" \
                        or not rec["dir"].startswith("client->"):
                    continue
                conn = rec["conn"]
                if conn not in clients:
                    addr = cluster.namesrv_addr if rec["port"] == 9876 else broker_addr
                    clients[conn] = RawClient(addr)
                    local = clients[conn].sock.getsockname()
                    hosts[f"127.0.0.1:{rec['client_port']}"] = f"{local[0]}:{local[1]}"
                client = clients[conn]
                header = rec["header"]
                fut = client.send_frame(capture.frame_bytes(rec), header["opaque"],
                                        expect_answer=rec["rpc"] == "request")
                genuine = capture.by_seq.get(rec.get("response_seq")) if rec.get(
                    "response_seq") is not None else None
                if genuine is None:
                    if header["code"] == 11:
                        parked.append((rec["seq"], fut))  # the genuine broker held these
                    else:
                        fut.result(5)  # answered after the genuine connection had closed
                    continue
                try:
                    ours = fut.result(5)
                except Exception as exc:
                    problems.append(f"seq {rec['seq']} {rec['code_name']}: no answer ({exc!r})")
                    continue
                _check_answer(rec, genuine, ours, broker_addr, hosts, problems)
                notes[conn] = list(client.server_requests)
            time.sleep(0.3)
            for seq, fut in parked:
                if fut.done():
                    problems.append(f"seq {seq}: a long poll the genuine broker parked was "
                                    f"answered: {fut.result()!r}")
            offsets = {q: cluster.consumer_offset("CapPushGroup", "CapTopic", "broker-a", q)
                       for q in range(4)}
            notified = {conn: [(c.code, c.flag, c.language, c.version, c.ext_fields)
                               for c in client.server_requests] for conn, client in clients.items()}
        finally:
            for client in clients.values():
                client.close()
    return problems, offsets, notified, len(clients)


def _check_answer(rec, genuine, ours, broker_addr, hosts, problems):
    seq = rec["seq"]
    g = genuine["header"]
    name = rec["code_name"]
    if ours.code != g["code"]:
        problems.append(f"seq {seq} {name}: code {ours.code} ({ours.remark!r}) != genuine "
                        f"{g['code']} ({g.get('remark')!r})")
        return
    if ours.remark != g.get("remark"):
        problems.append(f"seq {seq} {name}: remark {ours.remark!r} != genuine {g.get('remark')!r}")
    if (ours.flag, ours.language, ours.version, ours.opaque) != (
            g["flag"], g["language"], g["version"], g["opaque"]):
        problems.append(f"seq {seq} {name}: header {ours!r} differs from genuine {g}")
    if ("extFields" in g) != (ours.ext_fields is not None):
        problems.append(f"seq {seq} {name}: extFields present={ours.ext_fields is not None}, "
                        f"genuine {'extFields' in g}")
    elif "extFields" in g:
        _compare_ext(seq, name, {k: str(v) for k, v in g["extFields"].items()}, ours.ext_fields,
                     broker_addr, problems)
    g_body = bytes.fromhex(genuine["body_hex"])
    if rec["header"]["code"] == 11:
        _compare_pull_bodies(seq, g_body, ours.body, broker_addr, hosts, problems)
    else:
        expected = g_body.replace(GENUINE_BROKER.encode(), broker_addr.encode())
        if ours.body != expected:
            problems.append(f"seq {seq} {name}: body {ours.body[:300]!r} != genuine "
                            f"{expected[:300]!r}")


def test_replay_matches_genuine_answers(replay):
    problems, _, _, connections = replay
    assert connections == 8  # conns 0,1 (mqadmin) and 3..8 (C++ client)
    assert not problems, "\n".join(problems)


def test_replay_commits_the_push_consumers_offsets(replay):
    _, offsets, _, _ = replay
    assert offsets == {0: 4, 1: 3, 2: 3, 3: 3}


def test_replay_notifies_consumer_groups(replay):
    _, _, notified, _ = replay
    # genuine: one NOTIFY after CapPullGroup's heartbeat (conn 6); the push consumer's two
    # concurrent heartbeats raced into two notifications, a sequential replay gets one
    assert notified[6] == [(NOTIFY, 2, "JAVA", 409, {"consumerGroup": "CapPullGroup"})]
    assert notified[8]
    assert all(n == (NOTIFY, 2, "JAVA", 409, {"consumerGroup": "CapPushGroup"})
               for n in notified[8])
    for conn in (0, 1, 3, 4, 5, 7):
        assert notified[conn] == []


def test_capture_has_what_the_replay_relies_on(capture):
    kinds = {r["client_kind"] for r in capture.frames}
    assert {"cpp-client", "mqadmin"} <= kinds
    cpp_requests = [r for r in capture.frames if r["client_kind"] == "cpp-client"
                    and r["rpc"] == "request"]
    assert len(cpp_requests) == 69
    route = capture.by_seq[11]
    assert route["body_len"] == 233 and b"{0:" in bytes.fromhex(route["body_hex"])
    assert json.loads(capture.by_seq[10]["header_text"])["version"] == 63
