#!/usr/bin/env python
"""Protocol benchmark: our client against Apache's C++ client, on the same embedded broker.

One run, one embedded broker (in its own process), one topic with 4 queues:

* send: N messages of 100 B with our Producer (batches, pipelined) and, into a second topic,
  the C++ Producer's ``send_sync`` (it has no working batch send; see the capture's README);
* pull: every message of the N-message topic, decoded to Arrow columns by our client, and the
  same messages through the C++ PullConsumer (each message's body fetched, so both sides
  deliver the payload).

The broker serves pulls at a genuine broker's default caps, 32 messages / 256 KiB a pull
(``--max-transfer-count`` / ``--max-transfer-bytes``; a genuine broker serves 8 / 64 KiB from
disk). Besides the rates, each side's CPU seconds per million messages are measured (ours: this
process over the timed read, getrusage; the C++ client: its process over its timed loop, every
thread of the library included), and so is the embedded broker's own CPU during each pull phase
(/proc), reported separately: it shares the machine's cores with both clients. There is no
genuine Java broker here: the embedded broker stands in for it.

Prints a table and writes JSON (``--json``). Run: ``.venv/bin/python ci/bench_protocol.py``.
The C++ client runs in a subprocess (ci/cpp_bench_peer.py) so its threads cannot disturb ours.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rocketmq_spark.client import Message, Producer, QueueRangeReader, ReadSettings  # noqa: E402
from rocketmq_spark.client.admin import Admin  # noqa: E402


CLK = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def start_server(brokers: int = 1, max_count: int = 32, max_bytes: int = 256 * 1024):
    proc = subprocess.Popen([sys.executable, "-m", "rocketmq_spark.embedded", "--brokers",
                             str(brokers), "--max-transfer-count", str(max_count),
                             "--max-transfer-bytes", str(max_bytes)],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
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


def our_pull(namesrv: str, topic: str, threads: int, pull_batch_size: int = 32,
             native: bool = True) -> tuple:
    """(rows, msg/s, CPU seconds of this process) for reading every queue of ``topic``."""
    with Admin(namesrv) as admin:
        queues = admin.queues(topic)
        highs = admin.offsets("max", queues)
        settings = ReadSettings(consumer_group="bench-ours", max_msg_nums=pull_batch_size,
                                native=native)

        def read(mq):
            rows = 0
            for batch in QueueRangeReader(admin.brokers, admin.address, mq, 0, highs[mq],
                                          settings):
                rows += batch.num_rows
            return rows

        started, cpu = time.perf_counter(), own_cpu()
        with ThreadPoolExecutor(threads) as pool:
            total = sum(pool.map(read, queues))
        elapsed, cpu = time.perf_counter() - started, own_cpu() - cpu
    return total, total / elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--cpp-send-messages", type=int, default=100_000,
                        help="messages sent one by one, by the C++ producer and by ours")
    parser.add_argument("--threads", type=int, default=1, help="our reader threads")
    parser.add_argument("--max-transfer-count", type=int, default=32,
                        help="the broker's per-pull message cap (genuine default 32)")
    parser.add_argument("--max-transfer-bytes", type=int, default=256 * 1024,
                        help="the broker's per-pull byte cap (genuine default 256 KiB)")
    parser.add_argument("--pull-batch-size", type=int, default=32,
                        help="our maxMsgNums (the C++ PullConsumer asks for 32)")
    parser.add_argument("--python-pull", action="store_true",
                        help="also time our pure-Python pull loop (the fallback)")
    parser.add_argument("--skip-send", action="store_true", help="pull figures only")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    server, namesrv = start_server(max_count=args.max_transfer_count,
                                   max_bytes=args.max_transfer_bytes)
    try:
        with Admin(namesrv) as admin:
            admin.create_topic("BenchTopic", queues=4)
            admin.create_topic("BenchCppSend", queues=4)
        print(f"embedded broker at {namesrv}; {args.messages:,} x {args.size} B messages; "
              f"per-pull caps {args.max_transfer_count} messages / "
              f"{args.max_transfer_bytes:,} B", flush=True)
        result: dict = {
            "messages": args.messages, "size": args.size, "cpu_count": os.cpu_count(),
            "max_transfer_count": args.max_transfer_count,
            "max_transfer_bytes": args.max_transfer_bytes,
            "pull_batch_size": args.pull_batch_size,
        }
        if args.skip_send:
            our_send(namesrv, "BenchTopic", args.messages, args.size)  # the data, untimed
        else:
            ours_send = our_send(namesrv, "BenchTopic", args.messages, args.size)
            print(f"send, ours:  {ours_send:,.0f} msg/s (batched)", flush=True)
            ours_sync = our_send_sync(namesrv, "BenchCppSend", args.cpp_send_messages,
                                      args.size)
            print(f"send, ours:  {ours_sync:,.0f} msg/s (one by one)", flush=True)
            cpp_send = cpp(["produce", namesrv, "BenchCppSend", str(args.cpp_send_messages),
                            str(args.size)])
            cpp_send_rate = cpp_send["count"] / cpp_send["seconds"]
            print(f"send, C++:   {cpp_send_rate:,.0f} msg/s ({cpp_send['count']:,} messages)",
                  flush=True)
            result.update({
                "send_ours_msgs_per_s": ours_send, "send_cpp_msgs_per_s": cpp_send_rate,
                "send_ratio": ours_send / cpp_send_rate,
                "send_sync_ours_msgs_per_s": ours_sync,
                "send_sync_ratio": ours_sync / cpp_send_rate,
            })
        pulls = [("ours", True)] + ([("ours_python", False)] if args.python_pull else [])
        for name, native in pulls:
            broker_cpu = process_cpu(server.pid)
            rows, rate, cpu = our_pull(namesrv, "BenchTopic", args.threads,
                                       args.pull_batch_size, native)
            broker_cpu = process_cpu(server.pid) - broker_cpu
            print(f"pull, {name}:  {rate:,.0f} msg/s ({rows:,} rows to Arrow columns), "
                  f"{cpu * 1e6 / rows:.2f} CPU-s per 1M messages; broker "
                  f"{broker_cpu * 1e6 / rows:.2f}", flush=True)
            result.update({f"pull_{name}_msgs_per_s": rate, f"pull_{name}_rows": rows,
                           f"pull_{name}_cpu_per_1M": cpu * 1e6 / rows,
                           f"pull_{name}_broker_cpu_per_1M": broker_cpu * 1e6 / rows})
        broker_cpu = process_cpu(server.pid)
        cpp_pull = cpp(["pull", namesrv, "BenchTopic", "bench-cpp"])
        broker_cpu = process_cpu(server.pid) - broker_cpu
        cpp_rows = cpp_pull["count"]
        cpp_pull_rate = cpp_rows / cpp_pull["seconds"]
        print(f"pull, C++:   {cpp_pull_rate:,.0f} msg/s ({cpp_rows:,} messages), "
              f"{cpp_pull['cpu'] * 1e6 / cpp_rows:.2f} CPU-s per 1M messages; broker "
              f"{broker_cpu * 1e6 / cpp_rows:.2f}", flush=True)
    finally:
        server.terminate()
        server.wait(10)

    result.update({
        "pull_cpp_msgs_per_s": cpp_pull_rate, "pull_rows_cpp": cpp_rows,
        "pull_cpp_cpu_per_1M": cpp_pull["cpu"] * 1e6 / cpp_rows,
        "pull_cpp_broker_cpu_per_1M": broker_cpu * 1e6 / cpp_rows,
        "pull_ratio": result["pull_ours_msgs_per_s"] / cpp_pull_rate,
    })
    result["pull_cpu_ratio"] = result["pull_ours_cpu_per_1M"] / result["pull_cpp_cpu_per_1M"]
    print()
    print("| operation | ours (msg/s) | C++ client (msg/s) | ratio |")
    print("|---|---:|---:|---:|")
    if not args.skip_send:
        print(f"| send 100 B, batched (ours) vs send_sync (C++) | {ours_send:,.0f} | "
              f"{cpp_send_rate:,.0f} | {result['send_ratio']:.1f}x |")
        print(f"| send 100 B, one by one, each acknowledged | {ours_sync:,.0f} | "
              f"{cpp_send_rate:,.0f} | {result['send_sync_ratio']:.1f}x |")
    print(f"| pull + decode {args.size} B, caps {args.max_transfer_count} / "
          f"{args.max_transfer_bytes:,} B a pull | {result['pull_ours_msgs_per_s']:,.0f} | "
          f"{cpp_pull_rate:,.0f} | {result['pull_ratio']:.1f}x (target ≥ 5x) |")
    print(f"| pull, client CPU-s per 1M messages | {result['pull_ours_cpu_per_1M']:.2f} | "
          f"{result['pull_cpp_cpu_per_1M']:.2f} | {result['pull_cpu_ratio']:.2f} "
          f"(target ≤ 0.125) |")
    print(f"| pull, embedded broker CPU-s per 1M messages served | "
          f"{result['pull_ours_broker_cpu_per_1M']:.2f} | "
          f"{result['pull_cpp_broker_cpu_per_1M']:.2f} | – |")
    if args.python_pull:
        print(f"| pull, our pure-Python loop (fallback): msg/s, CPU-s per 1M | "
              f"{result['pull_ours_python_msgs_per_s']:,.0f}, "
              f"{result['pull_ours_python_cpu_per_1M']:.2f} | | "
              f"{result['pull_ours_python_msgs_per_s'] / cpp_pull_rate:.1f}x |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    counts = [result[k] for k in result if k.startswith("pull_") and k.endswith("_rows")]
    if any(c != args.messages for c in counts + [cpp_rows]):
        raise SystemExit(f"row counts differ from {args.messages}: ours {counts}, "
                         f"C++ {cpp_rows}")


if __name__ == "__main__":
    main()
