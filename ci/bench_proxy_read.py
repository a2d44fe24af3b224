#!/usr/bin/env python
"""spark.read through a 5.x proxy's remoting port against the direct broker path, one run.

One embedded cluster in its own process (``--proxy-remoting``, two brokers, default caps: 32
messages / 256 KiB per pull), one topic of 4 queues per broker filled with N messages of 100 B
without a client. One SparkSession (``local[2]``, UI off). The same bounded read (earliest to
latest, every column) is written to Spark's ``noop`` sink with ``nameServer`` naming the name
server (``direct``: pulls go to each broker) and then the proxy's remoting port (``proxy``:
every request goes to the proxy, which forwards it to the broker over its own connection and
relays the answer), alternating, ``--rounds`` times each after one warm-up of each. Prints
rows/s per path (the median round), the proxy's rate as a ratio of the direct one, and the
embedded server's CPU seconds per round (brokers and proxy share its process, so the proxy's
relaying shows there). On a busy machine the ratio is the figure that matters.

Run: ``.venv/bin/python ci/bench_proxy_read.py [--messages N] [--rounds R] [--json FILE]``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from embedded_process import start_embedded  # noqa: E402

TOPIC = "BenchProxyRead"


def start_server(messages: int):
    proc, found = start_embedded(["--brokers", "2", "--proxy-remoting", "--topic", f"{TOPIC}:4",
                                  "--fill", f"{TOPIC}:{messages}:100"], timeout=600)
    return proc, found["namesrv"], found["proxy-remoting"]


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def read_once(spark, address: str, server: psutil.Process) -> dict:
    df = spark.read.format("rocketmq").option("nameServer", address) \
        .option("subscribe", TOPIC).load()
    s0, t0 = cpu_seconds(server), time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return {"seconds": time.perf_counter() - t0, "server_cpu": cpu_seconds(server) - s0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--messages", type=int, default=400_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    proc, namesrv, proxy = start_server(args.messages)
    server = psutil.Process(proc.pid)
    try:
        from pyspark.sql import SparkSession

        spark = (SparkSession.builder.master("local[2]").appName("bench-proxy-read")
                 .config("spark.ui.enabled", "false").config("spark.driver.memory", "4g")
                 .config("spark.ui.showConsoleProgress", "false")
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        paths = {"direct": namesrv, "proxy": proxy}
        for address in paths.values():  # warm-up: workers, connections, routes
            read_once(spark, address, server)
        rounds = {name: [] for name in paths}
        for _ in range(args.rounds):
            for name, address in paths.items():
                rounds[name].append(read_once(spark, address, server))
        result = {"messages": args.messages, "rounds": args.rounds, "paths": {}}
        for name, runs in rounds.items():
            seconds = statistics.median(r["seconds"] for r in runs)
            result["paths"][name] = {
                "rows_per_s": args.messages / seconds, "seconds": [r["seconds"] for r in runs],
                "server_cpu_s": statistics.median(r["server_cpu"] for r in runs)}
        result["proxy_over_direct"] = (result["paths"]["proxy"]["rows_per_s"]
                                       / result["paths"]["direct"]["rows_per_s"])
        spark.stop()
    finally:
        proc.terminate()
        proc.wait(30)
    for name, p in result["paths"].items():
        print(f"{name:7s} {p['rows_per_s']:>12,.0f} rows/s  (median of "
              f"{', '.join(f'{s:.2f}' for s in p['seconds'])} s; server CPU "
              f"{p['server_cpu_s']:.2f} s a round)")
    print(f"proxy / direct: {result['proxy_over_direct']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
