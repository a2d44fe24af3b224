#!/usr/bin/env python
"""Memory stays bounded: the peak RSS of Spark's Python workers reading a huge range in one go.

For each size in ``--sizes`` (1,000,000 and 10,000,000 messages of ``--size`` (100) bytes), a
fresh embedded broker (``python -m rocketmq_spark.embedded``, its own process, the genuine
default caps of 32 messages / 256 KiB a pull unless ``--max-transfer-count`` says otherwise)
holds a topic of ``--queues`` (4) queues filled by the server itself; a fresh Spark session
(``local[2]``) reads all of it as ONE batch, without any row limit: ``spark.read`` into the
``noop`` sink, and a stream with ``Trigger.AvailableNow`` and no ``maxMessagesPerTrigger``
(batch 0 pins the start, batch 1 reads everything) into ``noop``. One partition per queue, so
each task reads a quarter of the topic.

Measured: the peak resident set (``VmHWM`` from /proc, sampled every 50 ms so that workers
that exit are counted too) of every Python process Spark started under its JVM (the forked
workers and their daemon), the largest one reported, plus the peak of their sum. Target: the
10M read within 1.2x of the 1M read.

    .venv/bin/python ci/bench_memory.py [--sizes 1000000,10000000] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List

import psutil

CI = Path(__file__).resolve().parent
sys.path.insert(0, str(CI))
from bench_session import ROOT, make_spark  # noqa: E402
from bench_processes import start_server, stop_server  # noqa: E402

TOPIC = "BenchMemory"


def _peak_and_rss(process: psutil.Process) -> Dict[str, int]:
    """The process's own peak resident set (``VmHWM``, which psutil does not report) and its
    current one, in KiB; empty once it has exited."""
    out = {}
    try:
        with open(f"/proc/{process.pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmHWM", "VmRSS"):
                    out[key] = int(value.split()[0])
    except (OSError, ValueError):
        pass
    return out


def _python_workers(jvm: int) -> List[psutil.Process]:
    """Python processes descending from this benchmark's Spark JVM (the pyspark daemon and
    the workers it forks), not those of other Spark applications on the machine."""
    found = []
    try:
        descendants = psutil.Process(jvm).children(recursive=True)
    except psutil.Error:
        return found
    for process in descendants:
        try:
            cmd = " ".join(process.cmdline())
        except psutil.Error:
            continue
        if "pyspark.daemon" in cmd or "pyspark.worker" in cmd:
            found.append(process)
    return found


class PeakSampler:
    """Samples the workers' VmHWM (their own peak) and the sum of their VmRSS."""

    def __init__(self, jvm: int, interval: float = 0.05):
        self.jvm = jvm
        self.interval = interval
        self.peaks: Dict[int, int] = {}
        self.peak_sum = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0
            for process in _python_workers(self.jvm):
                status = _peak_and_rss(process)
                if "VmHWM" in status:
                    pid = process.pid
                    self.peaks[pid] = max(self.peaks.get(pid, 0), status["VmHWM"])
                    total += status.get("VmRSS", 0)
            self.peak_sum = max(self.peak_sum, total)
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def measure(size: int, args) -> dict:
    started = time.monotonic()
    server, namesrv = start_server(
        "--topic", f"{TOPIC}:{args.queues}", "--fill", f"{TOPIC}:{size}:{args.size}",
        "--max-transfer-count", str(args.max_transfer_count),
        "--max-transfer-bytes", str(args.max_transfer_bytes), timeout=3600)
    filled = time.monotonic() - started
    out = {"messages": size, "fill_s": round(filled, 1)}
    try:
        spark = make_spark()
        try:
            options = {"nameServer": namesrv, "subscribe": TOPIC}
            warm = spark.read.format("rocketmq").options(**options) \
                .option("endingOffsets", json.dumps({f"{TOPIC}/broker-a/{q}": 1
                                                     for q in range(args.queues)})).load()
            warm.write.format("noop").mode("overwrite").save()  # workers started, pools warm
            for mode in ("batch", "stream"):
                with PeakSampler(spark.sparkContext._gateway.proc.pid) as sampler:
                    t0 = time.monotonic()
                    if mode == "batch":
                        spark.read.format("rocketmq").options(**options).load() \
                            .write.format("noop").mode("overwrite").save()
                        rows = size
                    else:
                        query = (spark.readStream.format("rocketmq").options(**options)
                                 .option("startingOffsets", "earliest").load()
                                 .writeStream.format("noop").trigger(availableNow=True)
                                 .option("checkpointLocation", tempfile.mkdtemp(
                                     prefix="bench-memory-"))
                                 .start())
                        query.awaitTermination()
                        rows = sum(p["numInputRows"] for p in query.recentProgress)
                    seconds = time.monotonic() - t0
                assert rows == size, (mode, rows, size)
                out[mode] = {"seconds": round(seconds, 1),
                             "rows_per_s": round(size / seconds),
                             "peak_worker_rss_mib": round(max(sampler.peaks.values()) / 1024, 1),
                             "peak_total_rss_mib": round(sampler.peak_sum / 1024, 1),
                             "workers": len(sampler.peaks)}
                print(f"{size:>11,} messages, {mode}: {out[mode]}", flush=True)
        finally:
            spark.stop()
    finally:
        stop_server(server)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="1000000,10000000")
    p.add_argument("--size", type=int, default=100, help="body bytes")
    p.add_argument("--queues", type=int, default=4)
    p.add_argument("--max-transfer-count", type=int, default=32)
    p.add_argument("--max-transfer-bytes", type=int, default=256 * 1024)
    p.add_argument("--json")
    args = p.parse_args()
    results = [measure(int(s), args) for s in args.sizes.split(",")]
    print("\n| messages | read | peak RSS, largest worker (MiB) | peak RSS, all workers (MiB) "
          "| rows/s |\n|---:|---|---:|---:|---:|")
    for r in results:
        for mode in ("batch", "stream"):
            m = r[mode]
            print(f"| {r['messages']:,} | {mode} | {m['peak_worker_rss_mib']} | "
                  f"{m['peak_total_rss_mib']} | {m['rows_per_s']:,} |")
    if len(results) > 1:
        for mode in ("batch", "stream"):
            ratio = (results[-1][mode]["peak_worker_rss_mib"]
                     / results[0][mode]["peak_worker_rss_mib"])
            print(f"{mode}: largest worker's peak at {results[-1]['messages']:,} / at "
                  f"{results[0]['messages']:,}: {ratio:.2f} (target <= 1.2)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    os.chdir(ROOT)
    main()
