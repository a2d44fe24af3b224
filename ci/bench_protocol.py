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

Secured connections (``--security plain,acl,tls,acl+tls``, or ``--acl`` / ``--tls`` for one
mode): our reader only (no send, no C++ client), in every mode named, in one run, against two
embedded brokers filled without a client: one serving TLS permissively (plain and TLS on one
port), one that also requires ACL signatures. Per mode: msg/s, our CPU-s per 1M messages and
CPU µs per pull, for the native loop and (``--python-pull``) the pure-Python one, which is what
ACL and TLS reads took before the native loop could sign and speak TLS; the broker's CPU is
reported apart (with ACL the embedded broker answers pulls in Python, so its rate, not ours,
bounds msg/s there). ``--rounds`` repeats the modes, interleaved.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import psutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rocketmq_spark.client import (  # noqa: E402
    ClientConfig, Message, Producer, QueueRangeReader, ReadSettings, make_tls_context,
)
from rocketmq_spark.client.acl import Credentials  # noqa: E402
from rocketmq_spark.client.admin import Admin  # noqa: E402




def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def start_server(brokers: int = 1, max_count: int = 32, max_bytes: int = 256 * 1024,
                 extra=(), wait: float = 30):
    proc = subprocess.Popen([sys.executable, "-m", "rocketmq_spark.embedded", "--brokers",
                             str(brokers), "--max-transfer-count", str(max_count),
                             "--max-transfer-bytes", str(max_bytes), *extra],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    deadline = time.monotonic() + wait
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
             native: bool = True, config: ClientConfig = None, with_pulls: bool = False
             ) -> tuple:
    """(rows, msg/s, CPU seconds of this process) for reading every queue of ``topic``
    (and the number of pulls answered, with ``with_pulls``)."""
    with Admin(namesrv, config=config) as admin:
        queues = admin.queues(topic)
        highs = admin.offsets("max", queues)
        settings = ReadSettings(consumer_group="bench-ours", max_msg_nums=pull_batch_size,
                                native=native)
        paths, pulls = set(), []

        def read(mq):
            rows = 0
            reader = QueueRangeReader(admin.brokers, admin.address, mq, 0, highs[mq], settings)
            for batch in reader:
                rows += batch.num_rows
            paths.add(reader.path)
            pulls.append(reader.pulls)
            return rows

        started, cpu = time.perf_counter(), own_cpu()
        with ThreadPoolExecutor(threads) as pool:
            total = sum(pool.map(read, queues))
        elapsed, cpu = time.perf_counter() - started, own_cpu() - cpu
    if paths != {"native" if native else "python"}:
        raise SystemExit(f"expected the {'native' if native else 'python'} loop, ran {paths}")
    if with_pulls:
        return total, total / elapsed, cpu, sum(pulls)
    return total, total / elapsed, cpu


def our_loop_only(namesrv: str, topic: str, pull_batch_size: int, config: ClientConfig
                  ) -> tuple:
    """(rows, msg/s, CPU seconds, pulls) of the native pull loop alone over every queue of
    ``topic``, one after another: requests, signatures, TLS, framing and headers, but the
    bodies are dropped (``clear()``) instead of decoded."""
    from rocketmq_spark.client.read.native_pull import make_puller
    from rocketmq_spark.client.read.native_pull_driver import PULL_RESPONSE, run_puller
    from rocketmq_spark.client.pull import PullRequest

    with Admin(namesrv, config=config) as admin:
        queues = admin.queues(topic)
        highs = admin.offsets("max", queues)
        total = pulls = 0
        started, cpu = time.perf_counter(), own_cpu()
        for mq in queues:
            conn = admin.brokers.remoting.connection(admin.address(mq, 0, False))
            request = PullRequest("bench-ours", topic, mq.queue_id, 0,
                                  broker_name=mq.broker_name, max_msg_nums=pull_batch_size)
            puller = make_puller(conn, request, highs[mq], 16, False, 0)
            if puller is None:
                raise SystemExit("--loop-only needs the native pull loop")
            offset = 0
            while offset < highs[mq]:
                reason, offset, _ = run_puller(conn, puller, offset, 10.0, 32768, 8 << 20)
                if reason == PULL_RESPONSE:
                    raise SystemExit(f"unexpected answer at {mq.key} {offset}")
                puller.clear()
            total += highs[mq]
            pulls += puller.pulls
        elapsed, cpu = time.perf_counter() - started, own_cpu() - cpu
    return total, total / elapsed, cpu, pulls


SECURITY_MODES = ("plain", "acl", "tls", "acl+tls")
BENCH_AK, BENCH_SK = "bench-access", "bench-secret-key"


def security_matrix(args, modes) -> None:
    """Our reader over plain, ACL-signed, TLS and ACL+TLS connections, in one run."""
    fill = ["--topic", "BenchTopic:4", "--fill", f"BenchTopic:{args.messages}:{args.size}",
            "--tls", "permissive"]
    caps = dict(max_count=args.max_transfer_count, max_bytes=args.max_transfer_bytes,
                wait=600)
    need_acl = any("acl" in m for m in modes)
    need_plain = any("acl" not in m for m in modes)
    servers = {}
    try:
        if need_plain:
            servers["open"] = start_server(extra=fill, **caps)
        if need_acl:
            servers["acl"] = start_server(extra=fill + ["--acl", f"{BENCH_AK}:{BENCH_SK}"],
                                          **caps)
        print(f"{args.messages:,} x {args.size} B messages in 4 queues per broker; per-pull "
              f"caps {args.max_transfer_count} messages / {args.max_transfer_bytes:,} B; "
              f"maxMsgNums {args.pull_batch_size}; modes {', '.join(modes)}", flush=True)
        loops = [("native", True)] + ([("python", False)] if args.python_pull else [])
        if args.loop_only:
            loops = [("loop", True)]
        results = {}
        for round_ in range(args.rounds):
            for mode in modes:
                proc, namesrv = servers["acl" if "acl" in mode else "open"]
                config = ClientConfig(
                    credentials=Credentials(BENCH_AK, BENCH_SK) if "acl" in mode else None,
                    tls=make_tls_context(verify=False) if "tls" in mode else None)
                for loop, native in loops:
                    broker_cpu = process_cpu(proc.pid)
                    if loop == "loop":
                        rows, rate, cpu, pulls = our_loop_only(namesrv, "BenchTopic",
                                                               args.pull_batch_size, config)
                    else:
                        rows, rate, cpu, pulls = our_pull(namesrv, "BenchTopic",
                                                          args.threads, args.pull_batch_size,
                                                          native, config, with_pulls=True)
                    broker_cpu = process_cpu(proc.pid) - broker_cpu
                    if rows != args.messages:
                        raise SystemExit(f"{mode}/{loop}: read {rows} rows, not "
                                         f"{args.messages}")
                    row = {"mode": mode, "loop": loop, "round": round_ + 1,
                           "msgs_per_s": rate, "cpu_per_1M": cpu * 1e6 / rows,
                           "cpu_us_per_pull": cpu * 1e6 / pulls, "pulls": pulls,
                           "broker_cpu_per_1M": broker_cpu * 1e6 / rows}
                    results.setdefault((mode, loop), []).append(row)
                    print(f"round {round_ + 1} {mode:8s} {loop:6s}: {rate:10,.0f} msg/s, "
                          f"{row['cpu_per_1M']:.2f} CPU-s per 1M, "
                          f"{row['cpu_us_per_pull']:.1f} µs per pull ({pulls:,} pulls); "
                          f"broker {row['broker_cpu_per_1M']:.2f} CPU-s per 1M", flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(10)
    print()
    print("| connection | loop | msg/s | our CPU-s / 1M msgs | our CPU µs / pull | "
          "embedded broker CPU-s / 1M |")
    print("|---|---|---:|---:|---:|---:|")
    for (mode, loop), rows in results.items():
        def span(key, fmt):
            values = sorted(r[key] for r in rows)
            return (fmt.format(values[0]) if len(values) == 1 else
                    fmt.format(values[0]) + "–" + fmt.format(values[-1]))
        print(f"| {mode} | {loop} | {span('msgs_per_s', '{:,.0f}')} | "
              f"{span('cpu_per_1M', '{:.2f}')} | {span('cpu_us_per_pull', '{:.1f}')} | "
              f"{span('broker_cpu_per_1M', '{:.2f}')} |")
    if args.python_pull and not args.loop_only:
        print()
        print("| connection | CPU per pull, Python loop / native loop (median of rounds) |")
        print("|---|---:|")
        for mode in modes:
            def median(loop):
                values = sorted(r["cpu_us_per_pull"] for r in results[(mode, loop)])
                return values[len(values) // 2]
            print(f"| {mode} | {median('python') / median('native'):.1f}x |")
    if args.json:
        args.json.write_text(json.dumps([r for rows in results.values() for r in rows],
                                        indent=2))


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
    parser.add_argument("--security", metavar="MODES",
                        help="our reader only, over secured connections: comma-separated "
                             f"modes of {', '.join(SECURITY_MODES)}, all in one run")
    parser.add_argument("--acl", action="store_true",
                        help="with --tls: --security acl+tls; alone: --security acl")
    parser.add_argument("--tls", action="store_true",
                        help="with --acl: --security acl+tls; alone: --security tls")
    parser.add_argument("--loop-only", action="store_true",
                        help="with --security: time the native pull loop alone (bodies "
                             "dropped, not decoded) instead of the reader")
    parser.add_argument("--rounds", type=int, default=1,
                        help="with --security: times each mode is read (interleaved)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.acl or args.tls:
        single = "+".join(m for m, on in (("acl", args.acl), ("tls", args.tls)) if on)
        args.security = ",".join(filter(None, [args.security, single]))
    if args.security:
        modes = [m.strip() for m in args.security.split(",") if m.strip()]
        unknown = sorted(set(modes) - set(SECURITY_MODES))
        if unknown:
            parser.error(f"--security: unknown mode(s) {', '.join(unknown)}; "
                         f"use {', '.join(SECURITY_MODES)}")
        security_matrix(args, modes)
        return

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
