#!/usr/bin/env python
"""gRPC transport benchmark: sending through the 5.x proxy endpoint against remoting, one run.

One embedded cluster (its own process, with ``--grpc-proxy``), one topic of 4 queues; N
messages of 100 B sent by:

* ``remoting``: our Producer's ``send_many`` (batches of 256, pipelined): the reference;
* ``grpc``: GrpcProducer, one message per SendMessage call (the default: what Apache's proxy
  stores correctly), 64 calls in flight;
* ``grpc-fifo``: the same with a sharding key on every message (100 groups): a group's calls
  one after another;
* ``grpc-multi``: GrpcProducer with ``multi_message_calls`` (256 messages per call): what the
  transport could do against a proxy that kept each message's properties (Apache's does not).

Prints messages/s, the CPU per message of this process (the client) and of the embedded
server's process (brokers and proxy), and each rate as a ratio of the remoting rate. Client
and server share the machine's cores, and the embedded proxy is Python, so the gRPC rates are
bounded by the server too; the client CPU per message is the figure that carries over to a
real proxy (``ci/bench_grpc_encode.py`` splits out what building the requests costs).
Run: ``.venv/bin/python ci/bench_grpc.py [--messages N] [--json FILE]``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from embedded_process import start_embedded  # noqa: E402

from rocketmq_spark.client import Message, Producer  # noqa: E402
from rocketmq_spark.client.grpc import GrpcProducer  # noqa: E402

TOPIC = "BenchGrpc"


def start_server():
    proc, found = start_embedded(["--grpc-proxy", "--grpc-proxy-plaintext",
                                  "--topic", f"{TOPIC}:4"])
    return proc, found["namesrv"], found["proxy"]


def messages(n: int, keyed: bool = False):
    body = b"x" * 100
    return [Message(TOPIC, body, tags="bench", keys=f"k{i}",
                    sharding_key=f"g{i % 100}" if keyed else None) for i in range(n)]


SERVER = []  # the embedded server's psutil.Process


def process_cpu(process: psutil.Process) -> float:
    """User + system CPU seconds of ``process`` (all its threads)."""
    times = process.cpu_times()
    return times.user + times.system


def timed(fn):
    """(messages, wall seconds, client CPU seconds, server CPU seconds) of ``fn()``."""
    s0 = process_cpu(SERVER[0])
    t0, c0 = time.perf_counter(), time.process_time()
    count = fn()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return count, wall, cpu, process_cpu(SERVER[0]) - s0


def run_remoting(namesrv: str, n: int):
    with Producer(namesrv) as p:
        p.send_many(messages(100))  # routes and connections
        batch = messages(n)
        return timed(lambda: sum(1 for _ in p.send_many(batch)) and n)


def run_grpc(endpoint: str, n: int, keyed: bool = False, multi: bool = False, chunk: int = 256):
    with GrpcProducer(endpoint, tls=False, multi_message_calls=multi, send_timeout=60) as p:
        p.send(messages(10))
        batch = messages(n, keyed)

        def go():
            futures = [p.send_async(batch[i:i + chunk]) for i in range(0, n, chunk)]
            return sum(len(f.result(120)) for f in futures)
        return timed(go)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    proc, namesrv, proxy = start_server()
    SERVER.append(psutil.Process(proc.pid))
    rows = {}
    try:
        n = args.messages
        rows["remoting"] = run_remoting(namesrv, n)
        rows["grpc"] = run_grpc(proxy, n)
        rows["grpc-fifo"] = run_grpc(proxy, n, keyed=True)
        rows["grpc-multi"] = run_grpc(proxy, n, multi=True)
    finally:
        proc.terminate()
        proc.wait(30)
    base = rows["remoting"][0] / rows["remoting"][1]
    out = {}
    print(f"{'transport':<12} {'messages':>9} {'seconds':>8} {'msg/s':>9} "
          f"{'client us/msg':>13} {'server us/msg':>13} {'ratio':>6}")
    for name, (count, wall, cpu, server_cpu) in rows.items():
        rate = count / wall
        out[name] = {"messages": count, "seconds": wall, "rate": rate, "client_cpu": cpu,
                     "server_cpu": server_cpu, "ratio_to_remoting": rate / base}
        print(f"{name:<12} {count:>9} {wall:>8.2f} {rate:>9.0f} {cpu / count * 1e6:>13.1f} "
              f"{server_cpu / count * 1e6:>13.1f} {rate / base:>6.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
