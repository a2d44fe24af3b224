#!/usr/bin/env python
"""Spark benchmark of the rocketmq source: read rate, latency, and driver planning time.

One run, ``local[2]``, one SparkSession (UI off, log level ERROR, ``spark.driver.memory=4g``,
``PYSPARK_PYTHON=sys.executable``); the embedded RocketMQ server runs in its own process
(``python -m rocketmq_spark.embedded``), as in ci/bench_protocol.py.

1. Read rate. Server A: one broker, topic ``BenchSpark`` with ``--queues`` queues (4) filled by
   the server itself with ``--messages`` messages of ``--size`` bytes (``--fill``), started with
   per-pull caps ``--max-transfer-count`` / ``--max-transfer-bytes`` (default 32 messages /
   256 KiB: a genuine broker's defaults for ``maxTransferCountOnMessageInMemory`` /
   ``maxTransferBytesOnMessageInMemory``, what users get; from disk a genuine broker serves 8 /
   64 KiB). Our query is
   ``spark.read.format("rocketmq")`` (options ``subscribe``, ``pullBatchSize=--pull-batch-size``
   (32, the default), plus any ``--read-option KEY=VALUE``; one partition per queue) written with
   ``df.write.format("noop")``. Rate = rows /
   wall time of the ``save()``; ``--warmup-rounds`` (3) untimed rounds, then ``--runs`` (5)
   timed rounds, the three cases interleaved in each round; the median is reported. (One
   warm-up round is not enough: the JVM's JIT keeps making both Python cases faster for about
   five rounds, the JVM share of the CPU falling from ~1.7 to ~0.7 s per 1M rows, which moves
   the ratio.) References, same session, same sink:

   (a) ``bench_prebuilt`` (ci/bench_sources.py): a Python batch source with our schema
       (``spark_schema()``), the same row count and partition count, each partition yielding one
       prebuilt RecordBatch over and over. The batch is a real one of ours: the first
       RecordBatch our partition reader (``read_partition``, same options) yields for the first
       partition (8,192 rows), saved as Arrow IPC, loaded once per Python worker.
   (b) JVM: ``spark.range(rows, numPartitions=queues)`` projected to the same 13 columns, names
       and types (queueOffset = id, queueId = id % queues, the body a constant ``size``-byte
       binary literal, the other columns constants). ``rate-micro-batch`` is streaming-only;
       ``spark.range`` is its batch equivalent with a constant body (the doc's "rangec" case).

   Also recorded per case: CPU seconds of the embedded server, of Spark's JVM and of the
   Python workers (from /proc, over the timed runs), and ``other``: what processes outside
   this benchmark used meanwhile (the wall-clock figures are only meaningful when it is near
   0). ``cpu_per_1M_rows`` (server + JVM + workers) is robust to such noise; since every case
   keeps both cores busy, ``cpu_ratio`` = CPU(a) / CPU(ours) predicts ours/(a) on an idle
   machine.

2. Latency. Server A, topic ``BenchLatency`` (``--queues`` queues). A streaming query on our
   source (``startingOffsets=latest``), ``trigger(processingTime="0 seconds")``, into
   ``foreachBatch``; a producer thread in this process sends one ``--size``-byte message per
   ``1/--latency-rate`` s (20/s) with ``Producer.send`` for ``--latency-warmup`` + ``--latency-
   seconds`` s (5 + 30), each message's key being its sequence number.

   Latency of a message = ``t_sink - t_send`` where ``t_send`` is ``time.time()`` in this
   process immediately before ``Producer.send`` is called for it, and ``t_sink`` is
   ``time.time()`` in the foreachBatch function (this, the user's driver process) immediately
   after ``batch_df.select("keys", "bornTimestamp").collect()`` returned the rows of its
   micro-batch. Same host, same clock. It therefore covers: the send itself, waiting for the
   next trigger (a message sent during a micro-batch is picked up by the next one), the next
   batch's latestOffset and offset-log write, planning, the executor read and the collect to
   the driver; it does not cover the commit-log write that follows the sink (commitOffsets).
   Messages sent during the warm-up are excluded; p50/p99 are over the others. The broker's
   bornTimestamp (the producer's ms clock) gives a cross-check (``born_p50_ms``). Also
   reported: "send → committed", ``t_commit - t_send`` with ``t_commit`` = progress
   ``timestamp`` + ``triggerExecution`` of the micro-batch whose offset range holds the
   message (from the send result's queue and offset), i.e. until Spark's commit log records
   the batch.

   A second run sends ``--idle-latency-rate`` (2) messages/s for ``--idle-latency-seconds``
   (30): slow enough that each message finds the query idle, so it measures the pipeline's
   own latency rather than the wait for a running micro-batch to finish (at 20 msg/s batches
   run back to back and a message waits for about half a batch before its own starts).

   Reference: ``bench_one_row`` (ci/bench_sources.py), a Python stream source whose every
   micro-batch is 1 row in 1 partition, same trigger, ``noop`` sink, for
   ``--reference-batches`` (50) batches; median ``triggerExecution`` over its batches (the
   first 3 excluded), as in the doc's fixed per-batch overhead table. Our own query's median
   triggerExecution (T) is reported as well. At 20 msg/s micro-batches run back to back, so
   a message sent at a random moment waits on average T/2 for the next batch to start, then
   nearly a whole batch (T minus commitOffsets) until the sink has it: p50 ≈ 1.5 T -
   commitOffsets for any micro-batch source, so the 1.3x target needs our T close to the
   reference's.

   Diagnostics (skip with ``--no-diagnostics``): the one-row source into the same
   foreachBatch sink (the sink's own cost); our source into ``noop`` for
   ``--diagnostics-seconds`` (12) s (our micro-batch cost with the reference's sink); and the
   same latency measurement (same rate, warm-up, sink and definition) on ``bench_file_stream``
   (ci/bench_sources.py), a Python stream source over a local file the producer appends to:
   no broker, no network, one partition per batch, i.e. the latency floor Spark's
   micro-batches set for a Python source.

3. Planning. Server B: two brokers, topic ``BenchWide`` with ``--wide-queues`` (500) queues on
   each (1,000 queues), ``--wide-messages`` messages spread over them. In this process, a
   ``RocketMQStreamReader`` with ``offsetsRefreshIntervalMs=0`` (the max-offset cache is stale
   on every call) does what Spark's streaming-source runner does for one micro-batch:
   ``json.loads`` of start, ``latestOffset(start, ReadAllAvailable())``, ``json.dumps`` of the
   end, ``partitions(start, end)`` (every queue has data: 1,000 ranges, one partition each
   unless the source packs small ranges together; the count is reported) and pickling every
   partition. Timed: the first call on a new reader (connections, route lookup), then
   the median and max of ``--planning-calls`` (20) calls with the route cache as in production
   (refreshed at most once a second) and of 20 calls with the route also forced stale.

Prints a markdown table and writes JSON (``--json PATH``). Run:
``.venv/bin/python ci/bench_spark.py [--messages N] [--runs R] [--json out.json]``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench_session import make_spark  # first: puts the checkout on sys.path, sets PYSPARK_*
from bench_processes import start_server, stop_server
from bench_spark_latency import LATENCY_TOPIC, bench_latency, bench_reference_stream
from bench_spark_planning import bench_planning
from bench_spark_read import READ_TOPIC, bench_read, ok, read_lines, read_table


def table(result: dict) -> str:
    lat, ref, pl = result["latency"], result["reference_stream"], result["planning"]
    ref_te = ref["triggerExecution"]
    ours_te = lat["progress"]["triggerExecution"]

    lines = [
        "| measure | value | reference | ratio | target |",
        "|---|---:|---:|---:|---|",
        *read_lines(result),
        f"| latency p50, send → foreachBatch (ms) | {lat['p50_ms']:.0f} | "
        f"1-row Python micro-batch {ref_te:.0f} | {lat['p50_ms'] / ref_te:.2f} | "
        f"≤ 1.3 {ok(lat['p50_ms'] <= 1.3 * ref_te)} |",
        f"| latency p99, send → foreachBatch (ms) | {lat['p99_ms']:.0f} | {ref_te:.0f} | "
        f"{lat['p99_ms'] / ref_te:.2f} | – |",
        f"| latency p50 / p99, send → batch committed (ms) | {lat['commit_p50_ms']:.0f} / "
        f"{lat['commit_p99_ms']:.0f} | | | – |",
    ]
    if "latency_idle" in result:
        idle = result["latency_idle"]
        lines += [
            f"| latency p50, idle pipeline ({result['args']['idle_latency_rate']:g} msg/s) (ms) | "
            f"{idle['p50_ms']:.0f} | 1-row Python micro-batch {ref_te:.0f} | "
            f"{idle['p50_ms'] / ref_te:.2f} | ≤ 1.3 {ok(idle['p50_ms'] <= 1.3 * ref_te)} |",
            f"| latency p99, idle pipeline (ms) | {idle['p99_ms']:.0f} | {ref_te:.0f} | "
            f"{idle['p99_ms'] / ref_te:.2f} | – |",
        ]
    lines += [
        f"| micro-batch triggerExecution, ours → foreachBatch (ms) | {ours_te:.0f} | "
        f"{ref_te:.0f} | {ours_te / ref_te:.2f} | – |",
    ]
    if "latency_noop" in result:
        noop_te = result["latency_noop"]["progress"]["triggerExecution"]
        fb_te = result["reference_stream_foreach_batch"]["triggerExecution"]
        lines += [
            f"| micro-batch triggerExecution, ours → noop (ms) | {noop_te:.0f} | {ref_te:.0f} | "
            f"{noop_te / ref_te:.2f} | – |",
            f"| micro-batch triggerExecution, 1-row → foreachBatch (ms) | {fb_te:.0f} | "
            f"{ref_te:.0f} | {fb_te / ref_te:.2f} | – |",
        ]
        fl = result["latency_file_reference"]
        lines += [
            f"| latency p50 / p99, zero-cost file source → foreachBatch (ms) | "
            f"{fl['p50_ms']:.0f} / {fl['p99_ms']:.0f} | {ref_te:.0f} | "
            f"{fl['p50_ms'] / ref_te:.2f} | (floor for any Python source) |",
            f"| latency p50, ours / zero-cost file source | {lat['p50_ms']:.0f} | "
            f"{fl['p50_ms']:.0f} | {lat['p50_ms'] / fl['p50_ms']:.2f} | – |",
        ]
    lines += [
        f"| planning, {pl['queues']} queues, first call (ms) | {pl['first_call_ms']:.1f} | | | "
        f"< 200 {ok(pl['first_call_ms'] < 200)} |",
        f"| planning, median of {result['args']['planning_calls']} (ms) | "
        f"{pl['median_ms']:.1f} | | | < 200 {ok(pl['median_ms'] < 200)} |",
        f"| planning, route cache stale too, median (ms) | {pl['route_stale_median_ms']:.1f} | "
        f"| | < 200 {ok(pl['route_stale_median_ms'] < 200)} |",
    ]
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--runs", type=int, default=5,
                        help="timed rounds of part 1, after the warm-up rounds")
    parser.add_argument("--warmup-rounds", type=int, default=3,
                        help="untimed rounds of part 1 first (Spark's JIT keeps speeding "
                             "both Python cases up for several rounds)")
    parser.add_argument("--pull-batch-size", type=int, default=32,
                        help="our pullBatchSize (maxMsgNums); the broker's caps decide above it")
    parser.add_argument("--read-option", action="append", default=[], metavar="KEY=VALUE",
                        help="extra option for our read in part 1 (e.g. verifyCrc=false)")
    parser.add_argument("--max-transfer-count", type=int, default=32,
                        help="the broker's per-pull message cap (genuine default 32; 8 on disk)")
    parser.add_argument("--max-transfer-bytes", type=int, default=256 * 1024,
                        help="the broker's per-pull byte cap (genuine default 256 KiB; 64 KiB "
                             "on disk)")
    parser.add_argument("--latency-rate", type=float, default=20.0, help="messages/s")
    parser.add_argument("--latency-seconds", type=float, default=30.0)
    parser.add_argument("--idle-latency-rate", type=float, default=2.0,
                        help="messages/s of the second latency run, slow enough that every "
                             "message finds the query idle")
    parser.add_argument("--idle-latency-seconds", type=float, default=30.0)
    parser.add_argument("--latency-warmup", type=float, default=5.0)
    parser.add_argument("--reference-batches", type=int, default=50,
                        help="micro-batches of the one-row reference stream")
    parser.add_argument("--no-diagnostics", action="store_true",
                        help="skip the extra latency runs (1-row -> foreachBatch, ours -> noop)")
    parser.add_argument("--diagnostics-seconds", type=float, default=12.0)
    parser.add_argument("--wide-queues", type=int, default=500, help="queues per broker (x2)")
    parser.add_argument("--wide-messages", type=int, default=10_000)
    parser.add_argument("--planning-calls", type=int, default=20)
    parser.add_argument("--skip", action="append", default=[],
                        choices=("read", "latency", "planning"), help="skip a part")
    parser.add_argument("--json", type=Path)
    return parser.parse_args()


def run_latency(spark, namesrv: str, args, tmp: str, result: dict) -> None:
    """Part 2 into ``result``: the reference stream, our two latency runs and, unless
    ``--no-diagnostics``, the three diagnostic runs."""
    print("2. latency: reference (1-row Python stream, noop)", flush=True)
    result["reference_stream"] = bench_reference_stream(spark, args, tmp)
    print(f"   {result['reference_stream']}", flush=True)
    print(f"2. latency: ours ({args.latency_rate:g} msg/s for "
          f"{args.latency_warmup:g} + {args.latency_seconds:g} s)", flush=True)
    result["latency"] = bench_latency(spark, namesrv, args, tmp)
    print(f"   {result['latency']}", flush=True)
    print(f"2. latency: ours, idle pipeline ({args.idle_latency_rate:g} msg/s for "
          f"{args.latency_warmup:g} + {args.idle_latency_seconds:g} s)", flush=True)
    result["latency_idle"] = bench_latency(spark, namesrv, args, tmp,
                                           seconds=args.idle_latency_seconds,
                                           rate=args.idle_latency_rate)
    print(f"   {result['latency_idle']}", flush=True)
    if args.no_diagnostics:
        return
    print("2. latency diagnostics: 1-row Python stream -> foreachBatch", flush=True)
    result["reference_stream_foreach_batch"] = bench_reference_stream(
        spark, args, tmp, sink="foreachBatch")
    print(f"   {result['reference_stream_foreach_batch']}", flush=True)
    print(f"2. latency diagnostics: ours -> noop ({args.diagnostics_seconds:g} s)",
          flush=True)
    result["latency_noop"] = bench_latency(spark, namesrv, args, tmp, sink="noop",
                                           seconds=args.diagnostics_seconds)
    print(f"   {result['latency_noop']}", flush=True)
    print(f"2. latency diagnostics: zero-cost file source -> foreachBatch "
          f"({args.diagnostics_seconds:g} s)", flush=True)
    result["latency_file_reference"] = bench_latency(
        spark, namesrv, args, tmp, seconds=args.diagnostics_seconds, transport="file")
    print(f"   {result['latency_file_reference']}", flush=True)


def main() -> None:
    args = parse_args()
    started = time.monotonic()
    result: dict = {"args": vars(args) | {"json": str(args.json) if args.json else None},
                    "cpu_count": os.cpu_count()}
    tmp = tempfile.mkdtemp(prefix="bench-spark-")
    server, namesrv = start_server(
        "--topic", f"{READ_TOPIC}:{args.queues}", "--topic", f"{LATENCY_TOPIC}:{args.queues}",
        "--fill", f"{READ_TOPIC}:{args.messages}:{args.size}",
        "--max-transfer-count", str(args.max_transfer_count),
        "--max-transfer-bytes", str(args.max_transfer_bytes))
    print(f"embedded broker at {namesrv} (pid {server.pid}); {args.messages:,} x {args.size} B "
          f"in {args.queues} queues, per-pull caps {args.max_transfer_count} msgs / "
          f"{args.max_transfer_bytes:,} B, pullBatchSize {args.pull_batch_size}", flush=True)
    spark = None
    try:
        spark = make_spark()
        import pyspark

        result["spark"] = pyspark.__version__
        if "read" not in args.skip:
            print("1. read rate", flush=True)
            result["read"] = bench_read(spark, namesrv, server.pid, args, tmp)
        if "latency" not in args.skip:
            run_latency(spark, namesrv, args, tmp, result)
    finally:
        if spark is not None:
            spark.stop()
        stop_server(server)
        shutil.rmtree(tmp, ignore_errors=True)
    if "planning" not in args.skip:
        print(f"3. planning with {2 * args.wide_queues} queues", flush=True)
        result["planning"] = bench_planning(args)
        print(f"   {result['planning']}", flush=True)
    result["elapsed_s"] = time.monotonic() - started

    if not args.skip:
        print()
        print(table(result))
    elif "read" in result:
        print()
        print(read_table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
