#!/usr/bin/env python
"""Protocol benchmark: our client against Apache's C++ client, on the same embedded broker.

One run, one embedded broker (in its own process), one topic with 4 queues:

* send: N messages of 100 B with our Producer (batches, pipelined) and, into a second topic,
  the C++ Producer's ``send_sync`` (it has no working batch send; see the capture's README);
* pull: every message of the N-message topic, decoded to Arrow columns by our client, and the
  same messages through the C++ PullConsumer (each message's body fetched, so both sides
  deliver the payload).

Prints a table and writes JSON (``--json``). Run: ``.venv/bin/python ci/bench_protocol.py``.
The C++ client runs in a subprocess (ci/cpp_bench_peer.py) so its threads cannot disturb ours.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rocketmq_spark.client import Message, Producer, QueueRangeReader, ReadSettings  # noqa: E402
from rocketmq_spark.client.admin import Admin  # noqa: E402


def start_server(brokers: int = 1):
    proc = subprocess.Popen([sys.executable, "-m", "rocketmq_spark.embedded", "--brokers",
                             str(brokers)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("namesrv"):
            return proc, line.split()[1]
    proc.kill()
    raise RuntimeError("the embedded server did not print its address")


def cpp(args, timeout=3600) -> dict:
    out = subprocess.run([sys.executable, str(ROOT / "ci" / "cpp_bench_peer.py"), *args],
                         capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"cpp_peer {args[0]} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def our_send(namesrv: str, topic: str, n: int, size: int) -> float:
    """Batches of 512 messages, 16 batches in flight."""
    body = b"x" * size
    with Producer(namesrv) as producer:
        started = time.perf_counter()
        producer.send_many((Message(topic, body) for _ in range(n)), batch_size=512,
                           in_flight=16)
        return n / (time.perf_counter() - started)


def our_send_sync(namesrv: str, topic: str, n: int, size: int) -> float:
    """One message per request, waiting for each answer: what the C++ send_sync does."""
    body = b"x" * size
    with Producer(namesrv) as producer:
        started = time.perf_counter()
        for _ in range(n):
            producer.send(Message(topic, body))
        return n / (time.perf_counter() - started)


def our_pull(namesrv: str, topic: str, threads: int) -> tuple:
    with Admin(namesrv) as admin:
        queues = admin.queues(topic)
        highs = admin.offsets("max", queues)
        settings = ReadSettings(consumer_group="bench-ours")

        def read(mq):
            rows = 0
            for batch in QueueRangeReader(admin.brokers, admin.address, mq, 0, highs[mq],
                                          settings):
                rows += batch.num_rows
            return rows

        started = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            total = sum(pool.map(read, queues))
        elapsed = time.perf_counter() - started
    return total, total / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--cpp-send-messages", type=int, default=100_000,
                        help="messages sent one by one, by the C++ producer and by ours")
    parser.add_argument("--threads", type=int, default=1, help="our reader threads")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    server, namesrv = start_server()
    try:
        with Admin(namesrv) as admin:
            admin.create_topic("BenchTopic", queues=4)
            admin.create_topic("BenchCppSend", queues=4)
        print(f"embedded broker at {namesrv}; {args.messages:,} x {args.size} B messages",
              flush=True)
        ours_send = our_send(namesrv, "BenchTopic", args.messages, args.size)
        print(f"send, ours:  {ours_send:,.0f} msg/s (batched)", flush=True)
        ours_sync = our_send_sync(namesrv, "BenchCppSend", args.cpp_send_messages, args.size)
        print(f"send, ours:  {ours_sync:,.0f} msg/s (one by one)", flush=True)
        cpp_send = cpp(["produce", namesrv, "BenchCppSend", str(args.cpp_send_messages),
                        str(args.size)])
        cpp_send_rate = cpp_send["count"] / cpp_send["seconds"]
        print(f"send, C++:   {cpp_send_rate:,.0f} msg/s ({cpp_send['count']:,} messages)",
              flush=True)
        rows, ours_pull = our_pull(namesrv, "BenchTopic", args.threads)
        print(f"pull, ours:  {ours_pull:,.0f} msg/s ({rows:,} rows to Arrow columns)", flush=True)
        cpp_pull = cpp(["pull", namesrv, "BenchTopic", "bench-cpp"])
        cpp_pull_rate = cpp_pull["count"] / cpp_pull["seconds"]
        print(f"pull, C++:   {cpp_pull_rate:,.0f} msg/s ({cpp_pull['count']:,} messages)",
              flush=True)
    finally:
        server.terminate()
        server.wait(10)

    result = {
        "messages": args.messages, "size": args.size, "cpu_count": os.cpu_count(),
        "send_ours_msgs_per_s": ours_send, "send_cpp_msgs_per_s": cpp_send_rate,
        "send_ratio": ours_send / cpp_send_rate, "send_sync_ours_msgs_per_s": ours_sync,
        "send_sync_ratio": ours_sync / cpp_send_rate,
        "pull_ours_msgs_per_s": ours_pull, "pull_cpp_msgs_per_s": cpp_pull_rate,
        "pull_ratio": ours_pull / cpp_pull_rate, "pull_rows_ours": rows,
        "pull_rows_cpp": cpp_pull["count"],
    }
    print()
    print("| operation | ours (msg/s) | C++ client (msg/s) | ratio |")
    print("|---|---:|---:|---:|")
    print(f"| send 100 B, batched (ours) vs send_sync (C++) | {ours_send:,.0f} | "
          f"{cpp_send_rate:,.0f} | {result['send_ratio']:.1f}x |")
    print(f"| send 100 B, one by one, each acknowledged | {ours_sync:,.0f} | "
          f"{cpp_send_rate:,.0f} | {result['send_sync_ratio']:.1f}x |")
    print(f"| pull + decode 100 B | {ours_pull:,.0f} | {cpp_pull_rate:,.0f} | "
          f"{result['pull_ratio']:.1f}x |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    if rows != args.messages or cpp_pull["count"] != args.messages:
        raise SystemExit(f"row counts differ from {args.messages}: ours {rows}, "
                         f"C++ {cpp_pull['count']}")


if __name__ == "__main__":
    main()
