"""The embedded broker's C answer to transactional frames (native/embedded/rmq_serve_tx.c)
against the Python path it stands in for (embedded/send.py, embedded/transactions.py), over
real sockets.

One scenario, run twice on a broker with the same port and data directory layout, once with the
C path and once without: pipelined half sends (JSON and ROCKETMQ headers, several topics and
queues, tags, keys, user properties, the compressed flag), then pipelined END_TRANSACTION
frames (commit, rollback, unknown, wrong group, wrong offset, not found, a second commit, two-way
ones), plain sends and pulls in between, then a check pass. Store time is a counter and the
client's address is pinned, so both runs must leave the same bytes: the commit log file, every
consume queue (records, tag codes, store times) and every answer.
"""
from __future__ import annotations

import itertools
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest

from rocketmq_spark.client.protocol.frame import FrameDecoder, RemotingCommand, encode_frame
from rocketmq_spark.client.protocol.message import parse_offset_msg_id
from rocketmq_spark.embedded import EmbeddedCluster, accelerator
from waiting import wait_until

SEND_V2, PULL, END_TRANSACTION, GET_MAX_OFFSET = 310, 11, 37, 30
JSON, ROCKETMQ = 0, 1
COMMIT, ROLLBACK, UNKNOWN = 8, 12, 0
PEER = "10.1.2.3:4567"  # the client's address as both brokers see it
TOPICS = {"TxA": 4, "TxB": 2, "TxC": 3}


def _frame(code: int, fields: Dict[str, str], body: bytes = b"", ser: int = JSON,
           oneway: bool = False, opaque: int = 0) -> bytes:
    cmd = RemotingCommand(code=code, ext_fields=fields, body=body, flag=2 if oneway else 0,
                          opaque=opaque, language="JAVA", version=399, serialize_type=ser)
    return encode_frame(cmd)


def _half_props(i: int, group: str) -> str:
    props = f"TRAN_MSG\x01true\x02PGROUP\x01{group}\x02UNIQ_KEY\x01UNIQ{i:028X}\x02"
    if i % 3 == 0:
        props += f"TAGS\x01tag{i % 2}\x02"
    if i % 4 == 1:
        props += f"KEYS\x01key-{i} other-{i}\x02"
    if i % 5 == 2:
        props += f"userProp\x01v{i}\x02zz\x01{'x' * i}\x02"
    return props + "WAIT\x01true\x02"


def _send_fields(i: int, topic: str, queue_id: int, props: str, group: str = "PG1",
                 sys_flag: int = 0) -> Dict[str, str]:
    return {"a": group, "b": topic, "c": "TBW102", "d": "4", "e": str(queue_id), "f": str(sys_flag),
            "g": str(1799999990000 + i), "h": str(i % 3), "i": props, "j": "0", "k": "false",
            "m": "false"}


class Conn:
    """A raw socket: frames out in one write, answers back as their exact bytes."""

    def __init__(self, addr: str):
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def exchange(self, frames: List[bytes], answers: int, pieces: int = 1) -> List[bytes]:
        """Send the frames (in ``pieces`` writes cut mid-frame, a moment apart) and read
        ``answers`` answers."""
        data = b"".join(frames)
        cut = len(data) // pieces + 7
        for at in range(0, len(data), cut):
            if at:
                time.sleep(0.05)
            self.sock.sendall(data[at:at + cut])
        out = []
        while len(out) < answers:
            while len(self.buf) >= 4 and len(self.buf) >= 4 + struct.unpack(">i", self.buf[:4])[0]:
                n = 4 + struct.unpack(">i", self.buf[:4])[0]
                out.append(self.buf[:n])
                self.buf = self.buf[n:]
            if len(out) < answers:
                data = self.sock.recv(1 << 20)
                assert data, "broker closed the connection"
                self.buf += data
        return out

    def close(self) -> None:
        self.sock.close()


def _decode(frame: bytes) -> RemotingCommand:
    cmds = FrameDecoder().feed(frame)
    assert len(cmds) == 1
    return cmds[0]


def start_broker(data_dir: Path, port: int, fast: bool, topics: Dict[str, int],
                 connections: int, transaction_timeout: int):
    """A started one-broker cluster (the C path on or off) whose store time is a counter, with
    ``topics`` made and ``connections`` raw connections the broker sees as from PEER."""
    cluster = EmbeddedCluster(brokers=1, data_dir=data_dir, broker_ports=[port],
                              transaction_check_interval=3600,
                              transaction_timeout=transaction_timeout)
    cluster.start()
    try:
        broker = cluster._brokers[0]
        log, real_append = broker.store.commit_log, broker.store.commit_log.append

        def counted(data):  # how many appends (the C path makes one per chunk)
            log.appends = getattr(log, "appends", 0) + 1
            return real_append(data)
        log.append = counted
        server = broker.server
        if not fast:
            broker.fast_paths.transactions = None
        clock = itertools.count(1800000000000, 7)
        broker.store.now = lambda: next(clock)
        for topic, queues in topics.items():
            cluster.create_topic(topic, queues)
        conns = [Conn(broker.addr) for _ in range(connections)]
        wait_until(lambda: len(server.connections) >= connections, 5,
                   f"{connections} connections at the server")
        for c in server.connections:
            c.peer = PEER
    except BaseException:
        cluster.stop()
        raise
    return cluster, broker, conns


def scenario(data_dir: Path, port: int, fast: bool) -> dict:
    """Run the scenario on a fresh broker; returns everything it stored and answered."""
    cluster, broker, conns = start_broker(data_dir, port, fast, TOPICS, 2, 1)
    try:
        opaque = itertools.count(1)
        answers: List[bytes] = []

        # the first half send and END_TRANSACTION create the system topics (Python path)
        first = conns[0].exchange([_frame(SEND_V2, _send_fields(
            50, "TxA", 0, _half_props(50, "PG1")), b"first", opaque=next(opaque))], 1)
        answers += first
        f = _decode(first[0]).fields
        answers += conns[0].exchange([_frame(END_TRANSACTION, {
            "producerGroup": "PG1", "tranStateTableOffset": f["queueOffset"],
            "commitLogOffset": str(parse_offset_msg_id(f["msgId"])[1]),
            "commitOrRollback": "8", "msgId": f["msgId"]}, opaque=next(opaque))], 1)

        # half sends, pipelined, both serializations on both connections
        sends = []
        for i in range(26):
            topic = "TxA" if i % 3 else "TxB"
            qid = i % TOPICS[topic]
            if i == 25:  # never ended: the real queue is taken (empty) all the same
                topic, qid = "TxC", 2
            ser = ROCKETMQ if i % 2 else JSON
            group = "PG1" if i % 5 else "PG2"
            sys_flag = 1 if i % 7 == 3 else 0  # the compressed flag (body stored as given)
            body = (b"\x00body-%d-" % i) * (1 + i % 4)
            sends.append((i % 2, _frame(SEND_V2, _send_fields(
                i, topic, qid, _half_props(i, group), group, sys_flag), body, ser,
                opaque=next(opaque)), group))
        handles = []
        for side in (0, 1):
            mine = [s for s in sends if s[0] == side]
            got = conns[side].exchange([f for _, f, _ in mine], len(mine), pieces=1 + 2 * side)
            answers += got
            for (_, _, group), frame in zip(mine, got):
                resp = _decode(frame)
                assert resp.code == 0, resp.remark
                handles.append({"group": group, "queueOffset": resp.fields["queueOffset"],
                                "commitLogOffset": parse_offset_msg_id(resp.fields["msgId"])[1],
                                "msgId": resp.fields["msgId"]})

        def end(h, kind, group=None, oneway=True, ser=JSON, table=None, phys=None):
            fields = {"producerGroup": group or h["group"],
                      "tranStateTableOffset": str(h["queueOffset"] if table is None else table),
                      "commitLogOffset": str(h["commitLogOffset"] if phys is None else phys),
                      "commitOrRollback": str(kind), "fromTransactionCheck": "false",
                      "msgId": h["msgId"], "transactionId": h["msgId"]}
            return _frame(END_TRANSACTION, fields, b"", ser, oneway, next(opaque))

        def barrier(ser=JSON):  # answered after everything before it
            return _frame(GET_MAX_OFFSET, {"topic": "TxA", "queueId": "1"}, b"", ser,
                          opaque=next(opaque))
        # END_TRANSACTION, pipelined: the common ones, a second commit, two-way ones
        frames = []
        for n, h in enumerate(handles[:18]):
            kind = ROLLBACK if n % 6 == 5 else COMMIT
            frames.append(end(h, kind, ser=ROCKETMQ if n % 2 else JSON))
        frames.append(end(handles[0], COMMIT))                      # a second commit
        frames.append(end(handles[20], COMMIT, oneway=False, ser=ROCKETMQ))
        frames.append(end(handles[21], ROLLBACK, oneway=False))
        answers += conns[0].exchange(frames, 2)
        # every unusual kind (the Python path answers them)
        frames = [end(handles[18], UNKNOWN),                        # nothing happens
                  end(handles[19], COMMIT, group="OTHER", oneway=False),
                  end(handles[19], COMMIT, table=999, oneway=False, ser=ROCKETMQ),
                  end(handles[19], COMMIT, phys=12345, oneway=False),
                  end(handles[22], 5, oneway=False)]                # commitOrRollback wrong
        answers += conns[0].exchange(frames, 4)
        # a chunk the C path starts and Python finishes
        plain = "TAGS\x01p\x02UNIQ_KEY\x01PLAIN0000\x02WAIT\x01true\x02"
        frames = [end(handles[23], COMMIT, ser=ROCKETMQ),
                  _frame(SEND_V2, _send_fields(99, "TxA", 2, plain), b"plain", JSON,
                         opaque=next(opaque)),
                  barrier()]
        answers += conns[0].exchange(frames, 2)
        # the other connection: the rest, then a pull of what was committed
        frames = [end(h, COMMIT) for h in handles[19:20]]
        frames.append(_frame(PULL, {"consumerGroup": "G", "topic": "TxA", "queueId": "1",
                                    "queueOffset": "0", "maxMsgNums": "32", "sysFlag": "4",
                                    "commitOffset": "0", "suspendTimeoutMillis": "0",
                                    "subVersion": "0", "subscription": "*"},
                             ser=ROCKETMQ, opaque=next(opaque)))
        frames.append(barrier(ROCKETMQ))
        answers += conns[1].exchange(frames, 2)
        # one write: half sends to several queues, then END_TRANSACTIONs of them (the C path
        # stores a chunk's records together: an END must find a half of its own chunk) and of
        # a half stored before, commits into three queues interleaved with rollbacks
        store = broker.store

        def same_shape(i, topic, qid):  # records of equal size: offsets known in advance
            props = (f"TRAN_MSG\x01true\x02PGROUP\x01PG1\x02UNIQ_KEY\x01SAME{i:04d}\x02"
                     f"TAGS\x01t{i % 2}\x02")
            return _frame(SEND_V2, _send_fields(i, topic, qid, props), b"same-%04d" % i,
                          ROCKETMQ if i % 2 else JSON, opaque=next(opaque))
        size0 = store.commit_log.size
        probe = conns[1].exchange([same_shape(0, "TxA", 3)], 1)[0]
        answers.append(probe)
        probe = _decode(probe)
        record_size = store.commit_log.size - size0
        first_q, first_phys = store.queue("RMQ_SYS_TRANS_HALF_TOPIC", 0).max_offset, \
            store.commit_log.size
        prefix = probe.fields["msgId"][:-16]
        chunk = [("TxB", 1), ("TxA", 2), ("TxC", 0), ("TxA", 2), ("TxB", 0)]
        frames = [same_shape(k + 1, t, q) for k, (t, q) in enumerate(chunk)]
        mine = [{"group": "PG1", "queueOffset": first_q + k,
                 "commitLogOffset": first_phys + k * record_size,
                 "msgId": f"{prefix}{first_phys + k * record_size:016X}"}
                for k in range(len(chunk))]
        stored_before = {"group": "PG1", "queueOffset": probe.fields["queueOffset"],
                         "commitLogOffset": parse_offset_msg_id(probe.fields["msgId"])[1],
                         "msgId": probe.fields["msgId"]}
        frames += [end(mine[2], COMMIT, ser=ROCKETMQ), end(mine[0], COMMIT),
                   end(mine[4], ROLLBACK), end(stored_before, COMMIT),
                   end(mine[1], COMMIT, oneway=False, ser=ROCKETMQ), end(mine[3], COMMIT),
                   barrier()]
        answers += conns[1].exchange(frames, len(chunk) + 2)
        asked = cluster.check_transactions()
        for c in conns:
            c.close()
        store = broker.store
        queues = {f"{t}/{q}": (bytes(cq._buf), list(cq._ends), list(cq._tags), list(cq._times))
                  for (t, q), cq in sorted(store.queues.items())}
        stats = dict(broker.fast_paths.transaction_stats)
        appends = store.commit_log.appends
    finally:
        cluster.stop()
    return {"answers": answers, "queues": queues, "asked": asked, "stats": stats,
            "appends": appends,
            "log": (data_dir / "broker-a" / "commitlog").read_bytes(),
            "config": (data_dir / "broker-a" / "config.json").read_text()}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _native_tx_available() -> bool:
    return accelerator.native_function("serve_tx") is not None


needs_c_path = pytest.mark.skipif(not _native_tx_available(), reason="no C path: the extension "
                                  "lacks serve_tx or ROCKETMQ_SPARK_PURE_PYTHON is set")


def both_ways(run, tmp_path: Path):
    """``run`` (a scenario) without the C path, then with it, on the same port."""
    port = _free_port()
    return run(tmp_path / "slow", port, fast=False), run(tmp_path / "fast", port, fast=True)


@needs_c_path
def test_c_path_stores_and_answers_what_the_python_path_does(tmp_path):
    slow, fast = both_ways(scenario, tmp_path)
    # the C path really took frames of both kinds (else this test compares Python to itself)
    assert slow["stats"].get("frames", 0) == 0
    assert fast["stats"] == {"frames": 61, "sends": 32, "ends": 29}
    # and stored each chunk's records in one append (the Python path: one per record)
    assert fast["appends"] < slow["appends"] / 3, (fast["appends"], slow["appends"])
    assert [a.hex() for a in fast["answers"]] == [a.hex() for a in slow["answers"]]
    assert fast["queues"].keys() == slow["queues"].keys()
    for key in slow["queues"]:
        assert fast["queues"][key] == slow["queues"][key], key
    assert fast["log"] == slow["log"]
    assert fast["config"] == slow["config"]
    assert fast["asked"] == slow["asked"] == 4  # the half messages nobody ended


@needs_c_path
def test_c_path_reads_the_store_clock_as_broker_store_now(tmp_path):
    """With the store's own clock (no test clock on it) the C path reads it in C
    (native/embedded/rmq_serve_tx.c store_now): never behind ``last_store_timestamp``, the
    wall clock otherwise, ``last_store_timestamp`` kept up to date."""
    cluster, broker, (conn,) = start_broker(tmp_path, _free_port(), True, {"TxA": 2}, 1, 3600)
    try:
        store = broker.store
        del store.now  # BrokerStore.now again
        opaque = itertools.count(1)

        def send(i):
            return _frame(SEND_V2, _send_fields(i, "TxA", i % 2, _half_props(i, "PG1")),
                          b"clock-%d" % i, opaque=next(opaque))
        conn.exchange([send(0)], 1)  # the half topic is made in Python

        def times():
            return [t for q in store.queues.values() for t in q._times]
        ahead = int(time.time() * 1000) + 10 ** 6
        store.last_store_timestamp = ahead  # a clock that went back: the store time does not
        seen = len(times())
        conn.exchange([send(i) for i in range(1, 6)], 5)
        assert times()[seen:] == [ahead] * 5
        assert store.last_store_timestamp == ahead
        store.last_store_timestamp = 0
        seen = len(times())
        before = int(time.time() * 1000)
        conn.exchange([send(i) for i in range(6, 11)], 5)
        after = int(time.time() * 1000)
        got = times()[seen:]
        assert len(got) == 5 and before <= got[0] and got == sorted(got) and got[-1] <= after
        assert store.last_store_timestamp == got[-1]
        assert broker.fast_paths.transaction_stats["sends"] == 10
    finally:
        conn.close()
        cluster.stop()


if __name__ == "__main__":  # python tests/test_embedded_tx_fast.py DIR PORT fast|slow OUT
    import pickle
    result = scenario(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "fast")
    Path(sys.argv[4]).write_bytes(pickle.dumps(result))
