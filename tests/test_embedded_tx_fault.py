"""A Python error in the middle of a run of the embedded broker's C transactional path
(native/embedded/rmq_serve_tx.c): the frame is answered SYSTEM_ERROR as the Python path's dispatch
answers it, the frames around it are served, and the connection stays open.

The fault (the commit log's append raising OSError) cannot be produced for real, so the
append of a live broker's store is patched: it raises for the bytes of one message (its body),
wherever they come, since the C path appends a chunk's records in one call (a failing one
stores nothing, and the C path stores the chunk again a record at a time, where the append of
that message's record raises as in the Python path). The same scenario runs with and without
the C path and must leave the same answers and the same commit log. Store time is one value:
the C path's second pass reads the clock again, which a clock counting calls would show."""
from __future__ import annotations

import itertools
from pathlib import Path

from rocketmq_spark.client.protocol.codes import ResponseCode
from rocketmq_spark.client.protocol.message import parse_offset_msg_id
from test_embedded_tx_fast import (
    END_TRANSACTION, JSON, ROCKETMQ, SEND_V2, _decode, _frame, _half_props, _send_fields,
    both_ways, needs_c_path, start_broker,
)

COMMIT = 8


def scenario(data_dir: Path, port: int, fast: bool) -> dict:
    cluster, broker, (conn,) = start_broker(data_dir, port, fast, {"TxA": 2}, 1, 3600)
    try:
        opaque = itertools.count(1)

        def send(i, ser=ROCKETMQ):
            return _frame(SEND_V2, _send_fields(i, "TxA", i % 2, _half_props(i, "PG1")),
                          b"body-%d" % i, ser, opaque=next(opaque))

        def end(resp, oneway):
            f = resp.fields
            return _frame(END_TRANSACTION, {
                "producerGroup": "PG1", "tranStateTableOffset": f["queueOffset"],
                "commitLogOffset": str(parse_offset_msg_id(f["msgId"])[1]),
                "commitOrRollback": str(COMMIT), "fromTransactionCheck": "false",
                "msgId": f["msgId"]}, b"", ROCKETMQ, oneway, next(opaque))

        # the system topics exist before the C path may take anything
        answers = conn.exchange([send(0)], 1)
        answers += conn.exchange([end(_decode(answers[0]), True), send(1)], 1)

        broker.store.now = lambda: 1800000000000
        log = broker.store.commit_log
        real_append, calls, failing = log.append, [], [b"body-3"]

        def append(data):
            calls.append(len(data))
            if failing[0] in bytes(data):
                raise OSError("injected: the disk is full")
            return real_append(data)
        log.append = append
        # four half sends in one write, the second fails (both serializations)
        got = conn.exchange([send(i, JSON if i % 2 else ROCKETMQ) for i in range(2, 6)], 4)
        answers += got
        ok = [_decode(a) for a in got if _decode(a).code == 0]
        # three END_TRANSACTIONs in one write (two-way), the second one's commit fails (the
        # committed record carries the body of half message 4)
        failing[0] = b"body-4"
        answers += conn.exchange([end(r, False) for r in ok], 3)
        log.append = real_append
        # the connection still serves
        answers += conn.exchange([send(9)], 1)
        conn.close()
        stats = dict(broker.fast_paths.transaction_stats)
        commit_log = (data_dir / "broker-a" / "commitlog").read_bytes()
    finally:
        cluster.stop()
    return {"answers": answers, "stats": stats, "log": commit_log, "calls": len(calls)}


@needs_c_path
def test_a_store_error_mid_run_is_answered_system_error(tmp_path):
    slow, fast = both_ways(scenario, tmp_path)
    assert slow["stats"].get("frames", 0) == 0
    # the C path took the frames around the failing ones
    assert fast["stats"]["sends"] >= 4 and fast["stats"]["ends"] >= 2, fast["stats"]
    cmds = [_decode(a) for a in fast["answers"]]
    codes = [c.code for c in cmds]
    assert codes == [0, 0, 0, ResponseCode.SYSTEM_ERROR, 0, 0, 0, ResponseCode.SYSTEM_ERROR, 0,
                     0], codes
    assert cmds[3].remark == cmds[7].remark == "OSError: injected: the disk is full"
    assert [a.hex() for a in fast["answers"]] == [a.hex() for a in slow["answers"]]
    assert fast["log"] == slow["log"]
    assert slow["calls"] == 9  # 4 half sends + 5 records of the ends, one per call, 2 failing
