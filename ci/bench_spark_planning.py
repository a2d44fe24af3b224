"""Part 3 of ci/bench_spark.py, the driver's planning time: what Spark's streaming-source
runner does for one micro-batch over 1,000 queues on two brokers, timed in this process
(ci/bench_spark.py's docstring has the definitions).
"""
from __future__ import annotations

import json
import pickle
import statistics
import time

from bench_processes import start_server, stop_server
from rocketmq_spark.client.admin import Admin

WIDE_TOPIC = "BenchWide"


def bench_planning(args) -> dict:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from rocketmq_spark.source.offsets import to_offset
    from rocketmq_spark.source.options import parse_source_options
    from rocketmq_spark.source.stream_reader import RocketMQStreamReader

    server, namesrv = start_server(
        "--brokers", "2", "--topic", f"{WIDE_TOPIC}:{args.wide_queues}",
        "--fill", f"{WIDE_TOPIC}:{args.wide_messages}:{args.size}")
    try:
        with Admin(namesrv) as admin:
            queues = admin.queues(WIDE_TOPIC, refresh=True)
        start = json.dumps(to_offset({mq: 0 for mq in queues}))
        options = parse_source_options({"nameServer": namesrv, "subscribe": WIDE_TOPIC,
                                        "offsetsRefreshIntervalMs": "0"}, streaming=True)

        def plan(reader) -> tuple:
            """What the streaming-source runner does for one micro-batch."""
            t0 = time.perf_counter()
            begin = json.loads(start)
            end = reader.latestOffset(begin, ReadAllAvailable())
            end_text = json.dumps(end)
            t1 = time.perf_counter()
            parts = reader.partitions(json.loads(start), json.loads(end_text))
            blobs = [pickle.dumps(p, protocol=pickle.HIGHEST_PROTOCOL) for p in parts]
            t2 = time.perf_counter()
            return (t2 - t0) * 1000, (t1 - t0) * 1000, (t2 - t1) * 1000, len(parts), \
                sum(len(b) for b in blobs)

        reader = RocketMQStreamReader(options)
        first, first_lo, first_pa, nparts, pbytes = plan(reader)
        production, forced = [], []
        parts_lo, parts_pa = [], []
        for _ in range(args.planning_calls):
            total, lo, pa_ms, n, _ = plan(reader)
            production.append(total)
        for _ in range(args.planning_calls):
            reader.runner.offsets.expire_discovery()  # route cache stale too
            total, lo, pa_ms, n, _ = plan(reader)
            forced.append(total)
            parts_lo.append(lo)
            parts_pa.append(pa_ms)
    finally:
        stop_server(server)
    return {
        "queues": len(queues), "partitions": nparts, "pickled_partition_bytes": pbytes,
        "first_call_ms": first, "first_latest_offset_ms": first_lo,
        "first_partitions_ms": first_pa,
        "median_ms": statistics.median(production), "max_ms": max(production),
        "route_stale_median_ms": statistics.median(forced), "route_stale_max_ms": max(forced),
        "route_stale_latest_offset_median_ms": statistics.median(parts_lo),
        "route_stale_partitions_median_ms": statistics.median(parts_pa),
    }
