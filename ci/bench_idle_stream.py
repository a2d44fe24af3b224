#!/usr/bin/env python
"""What an idle stream costs the brokers, and the latency of a new message, by offset lookup.

One process: an embedded cluster of two brokers (in this process, so each broker's requests
can be counted: the benchmark wraps each broker's request handler with a counter), topic
``BenchIdle`` with ``--queues`` (500) queues on each broker (1,000 queues), and a local[2]
SparkSession.

1. Idle. A streaming query on ``BenchIdle`` (``startingOffsets=latest``,
   ``trigger(processingTime="0 seconds")``, ``noop`` sink) while nothing is sent: Spark asks
   the source for its latest offset about ninety times a second. After its first batch and
   ``--warmup`` (5) s, the requests each broker receives are counted for ``--seconds`` (20) s
   and reported per second, by request code. Cases:

   * ``per-queue``: one GET_MAX_OFFSET per queue, ``offsetsRefreshIntervalMs=50`` (before:
     the brokers refuse GET_TOPIC_STATS_INFO, as a 5.x proxy's remoting port does, so the
     source falls back to the per-queue lookups it made before);
   * ``stats-50``: one GET_TOPIC_STATS_INFO per topic and broker, the old 50 ms interval;
   * ``stats-default``: the same at the default ``offsetsRefreshIntervalMs`` (after).

2. Latency at ``--rate`` (20) messages/s (ci/bench_spark.py's definition: send → the rows
   collected in foreachBatch, ``--latency-seconds`` (30) s after a 5 s warm-up) on the same
   1,000-queue topic, ``per-queue`` (before) against ``stats-default`` (after), interleaved
   ``--latency-rounds`` (1) times.

``--tree PATH`` runs a checkout of another commit (e.g. ``git worktree add /tmp/base HEAD~1``):
its ``rocketmq_spark`` is imported instead, for its own figures (case ``old``: its default
interval, its lookups). Prints a markdown table; ``--json PATH`` writes the figures. Run:
``.venv/bin/python ci/bench_idle_stream.py [--seconds 20] [--json out.json]``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Dict, List

CI = Path(__file__).resolve().parent
ROOT = CI.parent


def _tree_argument() -> Path:
    for i, arg in enumerate(sys.argv):
        if arg == "--tree" and i + 1 < len(sys.argv):
            return Path(sys.argv[i + 1]).resolve()
        if arg.startswith("--tree="):
            return Path(arg.split("=", 1)[1]).resolve()
    return ROOT


TREE = _tree_argument()  # whose rocketmq_spark runs (Spark's Python workers too)
sys.path.insert(0, str(TREE))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(TREE)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

from rocketmq_spark.client import Message, Producer  # noqa: E402
from rocketmq_spark.embedded.cluster import EmbeddedCluster  # noqa: E402

TOPIC = "BenchIdle"
GET_TOPIC_STATS_INFO = 202
NOT_SUPPORTED = 3  # REQUEST_CODE_NOT_SUPPORTED, as a 5.1.4 proxy's remoting port answers 202
CODE_NAMES = {30: "GET_MAX_OFFSET", 31: "GET_MIN_OFFSET", 202: "GET_TOPIC_STATS_INFO",
              34: "HEART_BEAT", 11: "PULL_MESSAGE", 15: "UPDATE_CONSUMER_OFFSET",
              14: "QUERY_CONSUMER_OFFSET", 38: "GET_CONSUMER_LIST_BY_GROUP"}


class RequestCounter:
    """Requests each broker of ``cluster`` handles, by code: each broker's handler is wrapped
    (requests a fault rule answers first are not counted)."""

    def __init__(self, cluster: EmbeddedCluster):
        self.counts: Dict[str, Counter] = {}
        self._lock = threading.Lock()
        for handle in cluster.brokers:
            broker = cluster._broker(handle.name)
            self.counts[handle.name] = Counter()
            broker.handle = self._counted(broker.handle, self.counts[handle.name])

    def _counted(self, handle, counts: Counter):
        def counted(conn, cmd):
            with self._lock:
                counts[cmd.code] += 1
            return handle(conn, cmd)
        return counted

    def snapshot(self) -> Dict[str, Counter]:
        with self._lock:
            return {name: Counter(c) for name, c in self.counts.items()}


def default_interval_ms() -> int:
    from rocketmq_spark.source.options import parse_source_options

    options = parse_source_options({"nameServer": "127.0.0.1:9876", "subscribe": TOPIC},
                                   streaming=True)
    return options.offsets_refresh_interval_ms


def case_settings(case: str) -> tuple:
    """(reader options, refuse GET_TOPIC_STATS_INFO) of a case: ``per-queue[-MS]`` (50 ms
    unless given), ``stats-MS``, ``stats-default`` or ``old`` (the checkout's defaults)."""
    kind, _, interval = case.partition("-queue") if case.startswith("per-queue") \
        else case.partition("-")
    interval = interval.lstrip("-")
    if case.startswith("per-queue"):
        return {"offsetsRefreshIntervalMs": interval or "50"}, True
    if kind == "stats" and interval.isdigit():
        return {"offsetsRefreshIntervalMs": interval}, False
    if case in ("stats-default", "old"):
        return {}, False
    raise SystemExit(f"unknown case {case!r}")


def refusing(cluster: EmbeddedCluster, refuse: bool) -> None:
    """The brokers refuse GET_TOPIC_STATS_INFO, or not; the clients this process shares
    (which remember refusals) start afresh."""
    from rocketmq_spark.client import pool

    pool.clear()
    cluster.clear_faults()
    if refuse:
        cluster.fail_next(10 ** 9, NOT_SUPPORTED, f" request type {GET_TOPIC_STATS_INFO} not "
                          "supported", request_codes=[GET_TOPIC_STATS_INFO])


def idle_case(spark, cluster: EmbeddedCluster, counter: RequestCounter, case: str, args,
              tmp: str) -> dict:
    options, refuse = case_settings(case)
    refusing(cluster, refuse)
    df = (spark.readStream.format("rocketmq").option("nameServer", cluster.namesrv_addr)
          .option("subscribe", TOPIC).option("startingOffsets", "latest")
          .options(**options).load())
    query = (df.writeStream.format("noop").trigger(processingTime="0 seconds")
             .option("checkpointLocation", os.path.join(tmp, f"cp-idle-{case}")).start())
    try:
        deadline = time.monotonic() + 120
        while query.lastProgress is None and time.monotonic() < deadline:
            if query.exception() is not None:
                raise RuntimeError(f"the idle query failed: {query.exception()}")
            time.sleep(0.05)
        if query.lastProgress is None:
            raise RuntimeError("the idle query made no progress")
        time.sleep(args.warmup)
        before, t0 = counter.snapshot(), time.monotonic()
        time.sleep(args.seconds)
        after, t1 = counter.snapshot(), time.monotonic()
        if query.exception() is not None:
            raise RuntimeError(f"the idle query failed: {query.exception()}")
    finally:
        query.stop()
        cluster.clear_faults()
    return rates(case, options, refuse, before, after, t1 - t0)


def driver_loop_case(cluster: EmbeddedCluster, counter: RequestCounter, case: str,
                     args) -> dict:
    """The source's stream reader asked for its latest offset every ``--poll-ms`` (11) ms with
    an unchanged start, as Spark's idle loop does (its pollingDelay is 10 ms), without Spark:
    what an idle stream costs the brokers when nothing else slows the driver down."""
    from rocketmq_spark.source.options import parse_source_options
    from rocketmq_spark.source.stream_reader import RocketMQStreamReader

    options, refuse = case_settings(case)
    refusing(cluster, refuse)
    reader = RocketMQStreamReader(parse_source_options(
        {"nameServer": cluster.namesrv_addr, "subscribe": TOPIC, "startingOffsets": "latest",
         **options}, streaming=True))
    limit = reader.getDefaultReadLimit() if hasattr(reader, "getDefaultReadLimit") else None

    def latest(start):
        return reader.latestOffset(start, limit) if limit is not None \
            else reader.latestOffset()

    try:
        start = json.loads(json.dumps(latest(reader.initialOffset())))  # batch 0's end
        calls = 0
        deadline = time.monotonic() + args.warmup
        while time.monotonic() < deadline:
            latest(start)
            time.sleep(args.poll_ms / 1000)
        before, t0 = counter.snapshot(), time.monotonic()
        while time.monotonic() < t0 + args.seconds:
            latest(start)
            calls += 1
            time.sleep(args.poll_ms / 1000)
        after, t1 = counter.snapshot(), time.monotonic()
    finally:
        reader.stop()
        cluster.clear_faults()
    out = rates(case, options, refuse, before, after, t1 - t0)
    out["latest_offset_calls_per_s"] = calls / (t1 - t0)
    return out


def rates(case: str, options: dict, refuse: bool, before: Dict[str, Counter],
          after: Dict[str, Counter], seconds: float) -> dict:
    brokers = {}
    for name in after:
        delta = after[name] - before[name]
        brokers[name] = {
            "requests_per_s": sum(delta.values()) / seconds,
            "by_code": {CODE_NAMES.get(code, str(code)): n / seconds
                        for code, n in sorted(delta.items())}}
    return {"case": case, "options": options, "refuse_topic_stats": refuse,
            "seconds": seconds, "brokers": brokers}


def make_spark():
    from pyspark.sql import SparkSession

    from rocketmq_spark.datasource import RocketMQDataSource

    spark = (SparkSession.builder.master("local[2]").appName("rocketmq-idle-bench")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "4g")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.streaming.stopTimeout", "30s")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(RocketMQDataSource)
    return spark


def percentile(values: List[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def latency_case(spark, cluster: EmbeddedCluster, case: str, args, tmp: str, n: int) -> dict:
    """Messages sent at ``--rate`` with their number as key; latency = the time the rows of
    its batch were collected in foreachBatch (this process) minus the time before its send
    (ci/bench_spark.py's definition); the ``--latency-warmup`` first seconds left out."""
    options, refuse = case_settings(case)
    refusing(cluster, refuse)
    sent: Dict[int, float] = {}
    arrived: Dict[int, float] = {}
    batches: List[int] = []

    def sink(batch_df, batch_id):
        rows = batch_df.select("keys").collect()
        now = time.time()
        batches.append(len(rows))
        for r in rows:
            arrived.setdefault(int(r["keys"]), now)

    df = (spark.readStream.format("rocketmq").option("nameServer", cluster.namesrv_addr)
          .option("subscribe", TOPIC).option("startingOffsets", "latest")
          .options(**options).load())
    query = (df.writeStream.foreachBatch(sink).trigger(processingTime="0 seconds")
             .option("checkpointLocation", os.path.join(tmp, f"cp-latency-{case}-{n}"))
             .start())
    total = int((args.latency_warmup + args.latency_seconds) * args.rate)
    warm = int(args.latency_warmup * args.rate)
    try:
        deadline = time.monotonic() + 120
        while query.lastProgress is None and time.monotonic() < deadline:
            time.sleep(0.05)  # batch 0 pins the starting offsets
        body = b"x" * args.size
        with Producer(cluster.namesrv_addr) as producer:
            producer.queues(TOPIC, refresh=True)
            next_at = time.monotonic()
            for i in range(total):
                delay = next_at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                sent[i] = time.time()
                producer.send(Message(TOPIC, body, keys=str(i)))
                next_at += 1.0 / args.rate
        deadline = time.monotonic() + 60
        while len(arrived) < total and time.monotonic() < deadline:
            if query.exception() is not None:
                raise RuntimeError(f"the latency query failed: {query.exception()}")
            time.sleep(0.1)
    finally:
        query.stop()
        cluster.clear_faults()
    lat = [(arrived[k] - sent[k]) * 1000 for k in range(warm, total) if k in arrived]
    return {"case": case, "round": n, "p50_ms": percentile(lat, 0.5),
            "p99_ms": percentile(lat, 0.99), "measured": len(lat),
            "missing": total - warm - len(lat),
            "rows_per_batch": statistics.median([b for b in batches if b] or [0])}


def table(result: dict) -> str:
    lines = ["| idle stream | case | interval (ms) | requests/s to broker-a | to broker-b | "
             "by code (broker-a) |", "|---|---|---:|---:|---:|---|"]
    default = result["default_interval_ms"]
    for part, label in (("driver_loop", "reader polled every "
                         f"{result['args']['poll_ms']:g} ms"), ("idle", "Spark query")):
        for r in result[part]:
            interval = r["options"].get("offsetsRefreshIntervalMs", str(default))
            a, b = (r["brokers"][name] for name in sorted(r["brokers"]))
            codes = ", ".join(f"{k} {v:,.1f}" for k, v in a["by_code"].items())
            lines.append(f"| {label} | {r['case']} | {interval} | {a['requests_per_s']:,.1f} "
                         f"| {b['requests_per_s']:,.1f} | {codes} |")
    if result.get("latency"):
        lines += ["", f"| case | latency p50 at {result['args']['rate']:g} msg/s (ms) | "
                      "p99 (ms) | rows per batch |", "|---|---:|---:|---:|"]
        by_case: Dict[str, List[dict]] = {}
        for r in result["latency"]:
            by_case.setdefault(r["case"], []).append(r)
        for case, runs in by_case.items():
            p50 = statistics.median(r["p50_ms"] for r in runs)
            p99 = statistics.median(r["p99_ms"] for r in runs)
            rows = statistics.median(r["rows_per_batch"] for r in runs)
            lines.append(f"| {case} | {p50:.0f} | {p99:.0f} | {rows:g} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queues", type=int, default=500, help="queues per broker (x2)")
    parser.add_argument("--seconds", type=float, default=20.0, help="idle counting window")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--cases", default=None,
                        help="comma-separated idle cases (default per-queue,stats-50,"
                             "stats-default; 'old' with --tree)")
    parser.add_argument("--poll-ms", type=float, default=11.0,
                        help="the reader-only loop's pause between latestOffset calls")
    parser.add_argument("--skip-spark-idle", action="store_true")
    parser.add_argument("--rate", type=float, default=20.0, help="latency: messages/s")
    parser.add_argument("--latency-seconds", type=float, default=30.0)
    parser.add_argument("--latency-warmup", type=float, default=5.0)
    parser.add_argument("--latency-rounds", type=int, default=1)
    parser.add_argument("--latency-cases", default=None,
                        help="comma-separated (default per-queue,stats-default; 'old' with "
                             "--tree)")
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--tree", help="a checkout whose rocketmq_spark is measured instead")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    default_cases = "old" if TREE != ROOT else "per-queue,stats-50,stats-default"
    cases = (args.cases or default_cases).split(",")

    import rocketmq_spark

    result: dict = {"args": vars(args) | {"json": str(args.json) if args.json else None},
                    "package": str(Path(rocketmq_spark.__file__).parent),
                    "default_interval_ms": default_interval_ms(), "driver_loop": [], "idle": [],
                    "latency": [], "load_average": os.getloadavg()}
    print(f"rocketmq_spark from {result['package']}; default offsetsRefreshIntervalMs "
          f"{result['default_interval_ms']}", flush=True)
    tmp = tempfile.mkdtemp(prefix="bench-idle-")
    cluster = EmbeddedCluster(brokers=2).start()
    spark = None
    try:
        cluster.create_topic(TOPIC, queues=args.queues)
        counter = RequestCounter(cluster)
        for case in cases:
            print(f"1. idle, reader polled without Spark, {case}", flush=True)
            result["driver_loop"].append(driver_loop_case(cluster, counter, case, args))
            print(f"   {json.dumps(result['driver_loop'][-1])}", flush=True)
        spark = make_spark()
        for case in ([] if args.skip_spark_idle else cases):
            print(f"1. idle, Spark query, {case}", flush=True)
            result["idle"].append(idle_case(spark, cluster, counter, case, args, tmp))
            print(f"   {json.dumps(result['idle'][-1])}", flush=True)
        if not args.skip_latency:
            latency_cases = (args.latency_cases or (
                "old" if TREE != ROOT else "per-queue,stats-default")).split(",")
            for n in range(args.latency_rounds):
                for case in latency_cases:
                    print(f"2. latency, {case}, round {n + 1}", flush=True)
                    result["latency"].append(latency_case(spark, cluster, case, args, tmp, n))
                    print(f"   {json.dumps(result['latency'][-1])}", flush=True)
    finally:
        if spark is not None:
            spark.stop()
        cluster.stop()
    result["load_average_after"] = os.getloadavg()
    print()
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
