#!/usr/bin/env python
"""What building a SendMessageRequest costs: the generated protobuf classes (what the producer
uses: ``convert.message_fields`` built in place by ``send_calls.build_request``, then
serialized) against protobuf bytes written by hand (what
``client/grpc/wire.py`` did until the generated classes replaced it; kept here, and only here,
as the reference of the measurement).

Two shapes, 100-byte bodies with a tag and a key, as ``ci/bench_grpc.py`` sends them:

* ``one-message call``: the request of a call carrying one message (the producer's default),
  built and serialized: the cost per call;
* ``256-message call``: one request of 256 messages, per message (``multi_message_calls``).

Both encoders' bytes are parsed back and compared before timing. Compare the difference with
the client CPU per message that ``ci/bench_grpc.py`` prints for ``grpc`` (one call per message):
that is the share of the whole call the choice of encoder decides.
Run: ``.venv/bin/python ci/bench_grpc_encode.py [--messages N] [--rounds R]``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable, List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rocketmq_spark.client import Message  # noqa: E402
from rocketmq_spark.client.grpc import convert  # noqa: E402
from rocketmq_spark.client.grpc import definition_pb2 as definition  # noqa: E402
from rocketmq_spark.client.grpc import service_pb2 as service  # noqa: E402
from rocketmq_spark.client.grpc.send_calls import build_request  # noqa: E402
from rocketmq_spark.client.protocol.message import new_uniq_key  # noqa: E402

TOPIC = "BenchGrpc"


# --------------------------------------------------------------- the hand-written reference


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field (``tag``: the field number << 3 | 2, one byte here)."""
    n = len(payload)
    return tag + (bytes((n,)) if n < 0x80 else _varint(n)) + payload


class HandWritten:
    """wire.py's encoder for the messages this benchmark sends (tag, keys, no properties,
    NORMAL): the per-send parts (topic, born host and time) encoded once."""

    def __init__(self, topic: str, born_host: str, now_ms: int):
        seconds, ms = divmod(now_ms, 1000)
        born = b"\x08" + _varint(seconds) + (b"\x10" + _varint(ms * 1_000_000) if ms else b"")
        self._topic = _field(b"\x0a", _field(b"\x12", topic.encode()))
        self._tail = (b"\x28" + _varint(definition.IDENTITY) + b"\x30"
                      + _varint(definition.NORMAL) + _field(b"\x3a", born)
                      + _field(b"\x42", born_host.encode()))

    def message(self, message: Message) -> bytes:
        keys = message.keys
        system = _field(b"\x0a", message.tags.encode()) if message.tags else b""
        for key in ([keys] if isinstance(keys, str) else keys or ()):
            system += _field(b"\x12", key.encode())
        system += _field(b"\x1a", (message.uniq_key or new_uniq_key()).encode()) + self._tail
        return self._topic + _field(b"\x1a", system) + _field(b"\x22", bytes(message.body))

    @staticmethod
    def request(messages: List[bytes]) -> bytes:
        return b"".join(_field(b"\x0a", m) for m in messages)


# --------------------------------------------------------------------------------- timing


def per_message_us(fn: Callable[[], int], rounds: int) -> float:
    """CPU microseconds per message, the best of ``rounds`` runs of ``fn`` (which returns how
    many messages it encoded). CPU time, not wall time: other processes on the machine do not
    count."""
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        count = fn()
        best = min(best, (time.process_time() - start) / count * 1e6)
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    messages = [Message(TOPIC, b"x" * 100, tags="bench", keys=f"k{i}")
                for i in range(args.messages)]
    now_ms = int(time.time() * 1000)
    host = convert.BORN_HOST

    def generated_calls() -> int:
        for m in messages:
            build_request((convert.message_fields(m, "", now_ms),)).SerializeToString()
        return len(messages)

    def hand_written_calls() -> int:
        writer = HandWritten(TOPIC, host, now_ms)
        for m in messages:
            writer.request([writer.message(m)])
        return len(messages)

    def generated_batches() -> int:
        for i in range(0, len(messages), 256):
            build_request(convert.message_fields(m, "", now_ms)
                          for m in messages[i:i + 256]).SerializeToString()
        return len(messages)

    def hand_written_batches() -> int:
        writer = HandWritten(TOPIC, host, now_ms)
        for i in range(0, len(messages), 256):
            writer.request([writer.message(m) for m in messages[i:i + 256]])
        return len(messages)

    sample = Message(TOPIC, b"x" * 100, tags="bench", keys="k", uniq_key="ID")
    writer = HandWritten(TOPIC, host, now_ms)
    assert service.SendMessageRequest.FromString(writer.request([writer.message(sample)])) == \
        build_request([convert.message_fields(sample, "", now_ms)])

    rows = [("one-message call", generated_calls, hand_written_calls),
            ("256-message call", generated_batches, hand_written_batches)]
    print(f"{'request':<18} {'generated CPU us/msg':>21} {'hand-written CPU us/msg':>24} "
          f"{'difference':>11}")
    for name, generated, hand_written in rows:
        ours = per_message_us(generated, args.rounds)
        reference = per_message_us(hand_written, args.rounds)
        print(f"{name:<18} {ours:>21.2f} {reference:>24.2f} {ours - reference:>+11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
