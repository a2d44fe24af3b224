#!/usr/bin/env python
"""Filtered reads against the unfiltered read: wall time and what the broker sent.

One run, ``local[2]``, one SparkSession; one embedded broker in this process, started with
``enable_property_filter=True`` (a genuine broker's ``enablePropertyFilter=true``) and its
default per-pull caps (32 messages / 256 KiB, as a genuine broker serves from memory). Topic
``BenchFilters`` (``--queues`` queues) holds ``--messages`` messages of ``--size`` bytes with
a user property ``region``: ``eu`` on one message in 100, ``us`` on the others.

Each case is a function ``case(spark, bench) -> dict`` in :data:`CASES`: a Spark batch read
(``spark.read.format("rocketmq")`` with the case's options, into ``noop``), timed over
``--runs`` rounds after one warm-up (median reported), then the same read once in this
process queue by queue through :class:`QueueRangeReader`, whose counters say how many
messages the broker sent (``rows_received``), how many offsets its filter skipped and how
many pulls it took. Add a case by writing its function and one entry in :data:`CASES`; the
:class:`Bench` it gets holds the session, the cluster and the arguments.

Cases: ``unfiltered`` (every message), ``sql92_1pct`` (``filterType=SQL92``,
``filter=region = 'eu'``: 1% of the messages) and ``pushdown_1h`` (a pushed-down one-hour
store-time window of a 24-hour topic, against the same window filtered by Spark).

Run: ``.venv/bin/python ci/bench_filters.py [--messages 200000] [--runs 3] [--json PATH]``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Mapping

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOPIC = "BenchFilters"
GROUP = "bench-filters"
SELECTIVE = "region = 'eu'"


@dataclass
class Bench:
    spark: object
    cluster: object
    args: argparse.Namespace


def fill(cluster, args) -> None:
    """``--messages`` messages over the queues; every 100th of a queue has region ``eu``."""
    per_queue = args.messages // args.queues
    body = b"x" * args.size
    for queue_id in range(args.queues):
        for start in range(0, per_queue, 100):
            n = min(100, per_queue - start)
            cluster.append(TOPIC, "broker-a", queue_id, [body], properties={"region": "eu"})
            if n > 1:
                cluster.append(TOPIC, "broker-a", queue_id, [body] * (n - 1),
                               properties={"region": "us"})


def make_spark():
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[2]").appName("rocketmq-bench-filters")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "2g")
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    from rocketmq_spark.datasource import RocketMQDataSource

    spark.dataSource.register(RocketMQDataSource)
    return spark


def cpu_seconds() -> Dict[str, float]:
    """CPU seconds so far of this process (the embedded broker, Spark's Python driver side)
    and of its descendants (Spark's JVM and its Python workers)."""
    import psutil

    me = psutil.Process()
    spark = 0.0
    for child in me.children(recursive=True):
        try:
            t = child.cpu_times()
            spark += t.user + t.system
        except psutil.Error:
            pass
    t = me.cpu_times()
    return {"broker_and_driver": t.user + t.system, "spark": spark}


def timed_read(bench: Bench, options: Mapping[str, str]) -> Dict[str, float]:
    """The Spark read into noop: the median wall time of ``--runs`` rounds, its rows, and the
    CPU seconds per round of this process (mostly the broker) and of Spark's processes."""
    def load():
        reader = bench.spark.read.format("rocketmq") \
            .option("nameServer", bench.cluster.namesrv_addr).option("subscribe", TOPIC)
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load()

    rows = load().count()
    times: List[float] = []
    for run in range(bench.args.runs + 1):  # the first is the warm-up
        if run == 1:
            cpu_before = cpu_seconds()
        started = time.perf_counter()
        load().write.format("noop").mode("overwrite").save()
        times.append(time.perf_counter() - started)
    cpu_after = cpu_seconds()
    seconds = statistics.median(times[1:])
    cpu = {f"cpu_{k}_s": round((cpu_after[k] - cpu_before[k]) / bench.args.runs, 3)
           for k in cpu_after}
    return {"seconds": round(seconds, 3), "rows": rows,
            "rows_per_s": round(rows / seconds) if seconds else 0, **cpu}


def transferred(bench: Bench, subscription: str = "*", expression_type: str = "TAG"
                ) -> Dict[str, int]:
    """The same read in this process, queue by queue: what the broker sent (from the
    readers' counters), what its filter skipped, and the pulls it took."""
    from rocketmq_spark.client import QueueRangeReader, ReadSettings
    from rocketmq_spark.client.admin import Admin

    totals = {"messages_sent": 0, "offsets_skipped": 0, "pulls": 0}
    settings = ReadSettings(consumer_group=GROUP, subscription=subscription,
                            expression_type=expression_type,
                            sub_version=int(time.time() * 1000))
    with Admin(bench.cluster.namesrv_addr) as admin:
        for mq in admin.queues(TOPIC, refresh=True):
            end = bench.cluster.max_offset(TOPIC, mq.broker_name, mq.queue_id)
            reader = QueueRangeReader(admin.brokers, admin.address, mq, 0, end, settings)
            for _ in reader:
                pass
            totals["messages_sent"] += reader.rows_received
            totals["offsets_skipped"] += reader.filter_skipped
            totals["pulls"] += reader.pulls
    return totals


def case_unfiltered(bench: Bench) -> dict:
    return {**timed_read(bench, {}), **transferred(bench)}


def case_sql92_1pct(bench: Bench) -> dict:
    options = {"filterType": "SQL92", "filter": SELECTIVE}
    return {**timed_read(bench, options), **transferred(bench, SELECTIVE, "SQL92")}


def case_pushdown_1h(bench: Bench) -> dict:
    """A one-hour ``storeTimestamp`` window of topic ``BenchHistory`` (``--messages`` stored
    evenly over 24 hours, in 5-minute runs) with ``spark.sql.python.filterPushdown.enabled``
    on, then off (Spark filters every message): median wall time of each, and the messages
    the broker's queues handed out in one more read (its C pull answers off meanwhile, so
    every pull is counted; the searches by time are counted too)."""
    from rocketmq_spark.embedded.queue import ConsumeQueue

    topic, cluster, args, spark = "BenchHistory", bench.cluster, bench.args, bench.spark
    hour, runs = 3_600_000, 288
    start_ms = int(time.time() * 1000) // hour * hour - 24 * hour
    cluster.create_topic(topic, queues=args.queues)
    for queue_id in range(args.queues):
        per_queue = args.messages // args.queues
        for run in range(runs):
            n = per_queue * (run + 1) // runs - per_queue * run // runs
            cluster.append(topic, "broker-a", queue_id, [b"x" * args.size] * n,
                           store_timestamp=start_ms + run * hour // 12 + queue_id)
    window = (f"storeTimestamp >= timestamp_millis({start_ms + 12 * hour}) AND "
              f"storeTimestamp < timestamp_millis({start_ms + 13 * hour})")
    broker = cluster._broker("broker-a")
    result: Dict[str, object] = {}
    for on in (True, False):
        spark.conf.set("spark.sql.python.filterPushdown.enabled", str(on).lower())
        df = spark.read.format("rocketmq").option("nameServer", cluster.namesrv_addr) \
            .option("subscribe", topic).load().where(window)
        rows = df.count()
        times: List[float] = []
        for _ in range(args.runs + 1):  # the first is the warm-up
            started = time.perf_counter()
            df.write.format("noop").mode("overwrite").save()
            times.append(time.perf_counter() - started)
        sent = [0]
        originals = ConsumeQueue.read, ConsumeQueue.read_filtered, broker.fast_paths.pulls

        def counting(original):
            def read(queue, *a, **kw):
                out = original(queue, *a, **kw)
                sent[0] += out[2]
                return out
            return read
        ConsumeQueue.read, ConsumeQueue.read_filtered = map(counting, originals[:2])
        broker.fast_paths.pulls = None
        try:
            df.write.format("noop").mode("overwrite").save()
        finally:
            ConsumeQueue.read, ConsumeQueue.read_filtered, broker.fast_paths.pulls = originals
        seconds = statistics.median(times[1:])
        prefix = "" if on else "unpushed_"
        result.update({f"{prefix}seconds": round(seconds, 3), f"{prefix}rows": rows,
                       f"{prefix}messages_sent": sent[0]})
    spark.conf.unset("spark.sql.python.filterPushdown.enabled")
    return result


CASES: Dict[str, Callable[[Bench], dict]] = {
    "unfiltered": case_unfiltered,
    "sql92_1pct": case_sql92_1pct,
    "pushdown_1h": case_pushdown_1h,
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--case", action="append", choices=sorted(CASES),
                        help="run only these cases (default: all)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    from rocketmq_spark.embedded import EmbeddedCluster

    results: Dict[str, dict] = {}
    with EmbeddedCluster(brokers=1, enable_property_filter=True) as cluster:
        cluster.create_topic(TOPIC, queues=args.queues)
        started = time.perf_counter()
        fill(cluster, args)
        print(f"filled {args.messages} messages in {time.perf_counter() - started:.1f}s",
              flush=True)
        bench = Bench(make_spark(), cluster, args)
        try:
            for name in args.case or list(CASES):
                results[name] = CASES[name](bench)
                print(f"{name:>14}: {json.dumps(results[name])}", flush=True)
        finally:
            bench.spark.stop()
    base = results.get("unfiltered")
    if base:
        for name, result in results.items():
            if name != "unfiltered" and result["seconds"]:
                print(f"{name}: {base['seconds'] / result['seconds']:.1f}x faster than "
                      f"unfiltered; the broker sent {result['messages_sent']:,} of "
                      f"{base['messages_sent']:,} messages")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
