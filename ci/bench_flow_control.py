#!/usr/bin/env python
"""Sink benchmark case ``flow``: an exactly-once ``df.write`` against a broker in flow control.

Two embedded brokers in this process (one event loop each, in threads; this process only
waits for Spark while a case runs): one with a genuine 4.9.8 broker's request queues and
fast failure (``ServerOptions`` defaults: a send queue of 10,000, 200 ms; ``--flow-limit
KEY=VALUE`` changes them, e.g. ``wait_ms_in_send_queue=10``), one with flow control off (no
fast failure, queues of 10^9). The same ``spark.range(--flow-rows, --partitions)`` of
``--size``-byte bodies is written to each, with ``deliveryGuarantee=exactlyOnce``, rounds
interleaved; the clock runs from ``save()`` until the topic holds every row (END_TRANSACTION
is oneway), and the topic must then hold exactly the rows. Reported: rows/s of each (median of
``--runs`` after ``--warmup``), their ratio, and the broker's SYSTEM_BUSY answers to sends per
100,000 rows (``flow_control_stats``: ``[OVERLOAD]`` + ``[TIMEOUT_CLEAN_QUEUE]``).

Run alone: ``.venv/bin/python ci/bench_flow_control.py [--flow-rows N] [--flow-limit K=V]``;
``ci/bench_sink.py --cases flow`` runs it too.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List

CI = Path(__file__).resolve().parent
sys.path.insert(0, str(CI))
sys.path.insert(0, str(CI.parent))

from rocketmq_spark.embedded import EmbeddedCluster  # noqa: E402

OFF = dict(broker_fast_failure=False, send_queue_capacity=10 ** 9,
           pull_queue_capacity=10 ** 9, heartbeat_queue_capacity=10 ** 9,
           transaction_queue_capacity=10 ** 9)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--flow-rows", type=int, default=200_000)
    p.add_argument("--flow-limit", action="append", default=[], metavar="KEY=VALUE",
                   help="a broker queue setting of the flow-controlled broker (repeatable), "
                        "e.g. wait_ms_in_send_queue=10")


def _limits(items: List[str]) -> Dict[str, object]:
    out: Dict[str, object] = {}
    for item in items:
        key, _, value = item.partition("=")
        out[key] = value == "true" if value in ("true", "false") else int(value)
    return out


def _busy_sends(cluster) -> int:
    stats = cluster.flow_control_stats()
    return stats["send_timeout"] + stats["send_overload"]


def _visible(cluster, topic: str, queues: int) -> int:
    return sum(cluster.max_offset(topic, b.name, q) for b in cluster.brokers
               for q in range(queues))


def _write_once(spark, cluster, topic: str, rows: int, args) -> Dict:
    cluster.create_topic(topic, args.queues)
    df = spark.range(rows, numPartitions=args.partitions).selectExpr(
        f"CAST(lpad(CAST(id AS STRING), {args.size}, 'x') AS BINARY) AS body")
    busy0 = _busy_sends(cluster)
    started = time.perf_counter()
    (df.write.format("rocketmq").mode("append").option("nameServer", cluster.namesrv_addr)
     .option("topic", topic).option("deliveryGuarantee", "exactlyOnce").save())
    deadline = time.monotonic() + 600
    while _visible(cluster, topic, args.queues) < rows:
        if time.monotonic() > deadline:
            raise AssertionError(f"flow: {topic}: committed rows did not all become visible")
        time.sleep(0.01)
    seconds = time.perf_counter() - started
    if _visible(cluster, topic, args.queues) != rows:
        raise AssertionError(f"flow: {topic} holds {_visible(cluster, topic, args.queues)} "
                             f"messages for {rows} rows")
    busy = _busy_sends(cluster) - busy0
    return {"rows": rows, "seconds": round(seconds, 3), "rows_per_s": round(rows / seconds),
            "busy": busy, "busy_per_100k_rows": round(busy * 100_000 / rows, 1)}


def bench_flow(spark, args) -> Dict:
    """Both brokers, rounds interleaved; medians and the ratio."""
    limits = _limits(args.flow_limit)
    runs: Dict[str, List[Dict]] = {"limits": [], "off": []}
    with EmbeddedCluster(brokers=1, **limits) as limited, \
            EmbeddedCluster(brokers=1, **OFF) as free:
        for round_no in range(args.warmup + args.runs):
            for label, cluster in (("limits", limited), ("off", free)):
                result = _write_once(spark, cluster, f"BenchFlow-{label}-{round_no}",
                                     args.flow_rows, args)
                tag = "warm-up" if round_no < args.warmup else f"run {round_no - args.warmup}"
                print(f"  {tag:8s} flow/{label:6s} {result['rows_per_s']:>10,} rows/s  "
                      f"({result['seconds']:.2f} s; {result['busy']} busy answers)", flush=True)
                if round_no >= args.warmup:
                    runs[label].append(result)
    summary = {label: {"rows_per_s": statistics.median(r["rows_per_s"] for r in rs),
                       "busy_per_100k_rows": statistics.median(r["busy_per_100k_rows"]
                                                               for r in rs)}
               for label, rs in runs.items()}
    summary["limits_vs_off"] = round(summary["limits"]["rows_per_s"]
                                     / summary["off"]["rows_per_s"], 3)
    summary["limits_given"] = limits or "4.9.8 defaults"
    summary["runs"] = runs
    return summary


def report(summary: Dict) -> None:
    print(f"exactlyOnce, broker flow control ({summary['limits_given']}): "
          f"{summary['limits']['rows_per_s']:,.0f} rows/s, "
          f"{summary['limits']['busy_per_100k_rows']} busy answers per 100,000 rows; "
          f"flow control off: {summary['off']['rows_per_s']:,.0f} rows/s; "
          f"ratio {summary['limits_vs_off']:.3f}")


def main() -> None:
    from bench_sink import make_spark

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--queues", type=int, default=4)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    args = p.parse_args()
    spark = make_spark()
    try:
        report(bench_flow(spark, args))
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
