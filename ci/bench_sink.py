#!/usr/bin/env python
"""Sink benchmark: ``df.write.format("rocketmq")`` against our own client and against what
users do today, in one run, on one embedded broker.

One embedded broker in its own process (``python -m rocketmq_spark.embedded``), topics of
``--queues`` queues (4), one Spark session (``local[2]``, UI off, log level ERROR, 4g driver,
``PYSPARK_PYTHON=sys.executable``). Every case sends ``--size``-byte (100 B) bodies, each row's
own (``lpad(id, size, 'x')``), and each timed run is checked at the broker afterwards: the
topic must have grown by exactly the rows sent.

* ours: ``spark.range(rows, numPartitions)`` projected to ``body`` (binary), written with
  ``df.write.format("rocketmq").mode("append")`` (default options: 1 MiB requests, 4 in flight
  per broker). Rate = rows / wall time of ``save()``.
* (a) our client alone, no Spark: ``Producer.send_many`` of the same bodies, prebuilt as
  ``Message`` objects before the clock starts, batches of up to 1 MiB, 4 requests in flight:
  the batched send path the sink's requests take, fed by a program that does nothing else.
* (b) what users do today: the same DataFrame's ``foreachPartition`` with Apache's C++
  client (PyPI ``rocketmq`` 0.4.4), one producer per task, ``send_sync`` per row (its batch
  send does not work against 4.9.8, see the capture's README). On ``--cpp-rows`` rows (default
  100,000: at its rate a million would take minutes); a rate, so comparable.
* wire ceiling, for reference: one encoded 1 MiB batch request sent over and over through the
  same pipeline, i.e. what the broker accepts when the client spends nothing on encoding.
* noop: the same DataFrame written with ``format("noop")``: what Spark itself spends making
  the rows.
* grpc: the same write through the 5.x proxy's gRPC API (``option("endpoints", ...)``, the
  embedded proxy, plaintext) on ``--grpc-rows`` rows (default 20,000; one message per call is
  far slower), a rate, so comparable; reported as a ratio of ours (issue 9: >= 0.3).

``--warmup`` (1) untimed round, then ``--runs`` (3) timed rounds with the cases interleaved;
medians are reported. CPU seconds per case and role (embedded server, Spark's JVM, its Python
workers, this process) come from /proc; ``other`` is what processes outside the benchmark used
meanwhile (wall-clock figures only mean something when it is near 0).

Targets (issue 9): ours >= 0.5 x (a), ours >= 10 x (b).
Run: ``.venv/bin/python ci/bench_sink.py [--rows N] [--json out.json]``.
"""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Callable, Dict, List

CI = Path(__file__).resolve().parent
sys.path.insert(0, str(CI))

from bench_spark import (  # noqa: E402  (also puts the checkout on sys.path, sets PYSPARK_*)
    cpu_delta, cpu_snapshot, start_server, stop_server,
)

from rocketmq_spark.client import Message, Producer  # noqa: E402
from rocketmq_spark.client.admin import Admin  # noqa: E402
from rocketmq_spark.client.pipeline import Outgoing  # noqa: E402

TOPICS = {"ours": "BenchSink", "client": "BenchClient", "cpp": "BenchCpp",
          "ceiling": "BenchCeiling", "grpc": "BenchGrpcSink"}
BATCH_BYTES = 1024 * 1024


def make_spark():
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("rocketmq-sink-bench")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "4g")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def rows_df(spark, rows: int, partitions: int, size: int):
    return spark.range(rows, numPartitions=partitions).selectExpr(
        f"CAST(lpad(CAST(id AS STRING), {size}, 'x') AS BINARY) AS body")


def stored(namesrv: str, topic: str) -> int:
    with Admin(namesrv) as admin:
        queues = admin.queues(topic, refresh=True)
        return sum(admin.offsets("max", queues).values())


def cpp_send_partition(namesrv: str, topic: str):
    """What users write today: a C++ producer per partition, send_sync per row."""
    def send(rows):
        from rocketmq.client import Message as CppMessage
        from rocketmq.client import Producer as CppProducer

        producer = CppProducer(f"bench-cpp-{uuid.uuid4().hex[:12]}")
        producer.set_namesrv_addr(namesrv)
        producer.start()
        try:
            for row in rows:
                msg = CppMessage(topic)
                msg.set_body(bytes(row.body))
                producer.send_sync(msg)
        finally:
            producer.shutdown()
    return send


def timed(name: str, server_pid: int, rows: int, namesrv: str, topic: str,
          action: Callable[[], None]) -> Dict:
    before_rows = stored(namesrv, topic) if topic else 0
    cpu0 = cpu_snapshot(server_pid)
    started = time.perf_counter()
    action()
    seconds = time.perf_counter() - started
    cpu = cpu_delta(cpu0, cpu_snapshot(server_pid))
    if topic:
        grown = stored(namesrv, topic) - before_rows
        if grown != rows:
            raise AssertionError(f"{name}: the broker stored {grown} messages for {rows} sent")
    return {"rows": rows, "seconds": round(seconds, 3), "rows_per_s": round(rows / seconds),
            "cpu": cpu}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--cpp-rows", type=int, default=100_000)
    p.add_argument("--grpc-rows", type=int, default=20_000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--queues", type=int, default=4)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--skip-cpp", action="store_true")
    p.add_argument("--sink-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option for our sink (repeatable), e.g. maxBatchBytes=262144")
    p.add_argument("--cases", default="ours,client,cpp,ceiling,noop,grpc",
                   help="comma list of the cases to run")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()

    flags = []
    for topic in TOPICS.values():
        flags += ["--topic", f"{topic}:{args.queues}"]
    proxy = None
    if "grpc" in args.cases.split(","):
        with socket.socket() as s:  # a free port for the embedded proxy
            s.bind(("127.0.0.1", 0))
            proxy = f"127.0.0.1:{s.getsockname()[1]}"
        flags += ["--grpc-proxy", "--grpc-proxy-plaintext", "--grpc-proxy-port",
                  proxy.rsplit(":", 1)[1]]
    server, namesrv = start_server(*flags)
    spark = make_spark()
    print(f"embedded broker at {namesrv} (pid {server.pid}); {args.rows:,} x {args.size} B rows, "
          f"{args.partitions} partitions, {args.queues} queues", flush=True)
    results: Dict[str, List[Dict]] = {k: [] for k in ("ours", "client", "cpp", "ceiling",
                                                      "noop", "grpc")}
    try:
        df = rows_df(spark, args.rows, args.partitions, args.size)
        cpp_df = rows_df(spark, args.cpp_rows, args.partitions, args.size)
        grpc_df = rows_df(spark, args.grpc_rows, args.partitions, args.size)
        bodies = [str(i).rjust(args.size, "x")[:args.size].encode() for i in range(args.rows)]
        producer = Producer(namesrv, max_in_flight_per_broker=4)
        ceiling_request = producer.encode_batch(
            [Message(TOPICS["ceiling"], b"x" * args.size)
             for _ in range(BATCH_BYTES // (args.size + 80))])
        ceiling_count = BATCH_BYTES // (args.size + 80)

        def ours():
            writer = (df.write.format("rocketmq").mode("append").option("nameServer", namesrv)
                      .option("topic", TOPICS["ours"]))
            for item in args.sink_option:
                key, _, value = item.partition("=")
                writer = writer.option(key, value)
            writer.save()

        def client():
            messages = [Message(TOPICS["client"], b) for b in bodies]
            holder["started"] = time.perf_counter()
            producer.send_many(messages, batch_size=1 << 20, in_flight=4,
                               max_batch_bytes=BATCH_BYTES)

        def ceiling():
            pipeline = producer.pipeline()
            for _ in range(args.rows // ceiling_count):
                pipeline.submit(Outgoing(TOPICS["ceiling"], ceiling_request, ceiling_count))
            pipeline.flush()

        def cpp():
            cpp_df.foreachPartition(cpp_send_partition(namesrv, TOPICS["cpp"]))

        def noop():
            df.write.format("noop").mode("append").save()

        def grpc():
            (grpc_df.write.format("rocketmq").mode("append").option("endpoints", proxy)
             .option("tls", "false").option("topic", TOPICS["grpc"]).save())

        holder: Dict[str, float] = {}
        cases = [("ours", args.rows, TOPICS["ours"], ours),
                 ("client", args.rows, TOPICS["client"], client),
                 ("ceiling", (args.rows // ceiling_count) * ceiling_count, TOPICS["ceiling"],
                  ceiling),
                 ("noop", args.rows, None, noop)]
        if proxy is not None:
            cases.append(("grpc", args.grpc_rows, TOPICS["grpc"], grpc))
        if not args.skip_cpp:
            cases.insert(2, ("cpp", args.cpp_rows, TOPICS["cpp"], cpp))
        wanted = set(args.cases.split(","))
        cases = [c for c in cases if c[0] in wanted]
        for round_no in range(args.warmup + args.runs):
            for name, rows, topic, action in cases:
                if name == "client":
                    # the Message objects are built inside action(); time only the sends
                    before = stored(namesrv, topic)
                    cpu0 = cpu_snapshot(server.pid)
                    action()
                    seconds = time.perf_counter() - holder["started"]
                    cpu = cpu_delta(cpu0, cpu_snapshot(server.pid))
                    assert stored(namesrv, topic) - before == rows, "client: lost messages"
                    result = {"rows": rows, "seconds": round(seconds, 3),
                              "rows_per_s": round(rows / seconds), "cpu": cpu}
                else:
                    result = timed(name, server.pid, rows, namesrv, topic, action)
                label = "warm-up" if round_no < args.warmup else f"run {round_no - args.warmup}"
                print(f"  {label:8s} {name:8s} {result['rows_per_s']:>10,} rows/s  "
                      f"({result['seconds']:.2f} s; cpu {result['cpu']})", flush=True)
                if round_no >= args.warmup:
                    results[name].append(result)
        producer.close()
    finally:
        spark.stop()
        stop_server(server)

    summary = {name: {"rows_per_s": statistics.median(r["rows_per_s"] for r in runs),
                      "runs": runs}
               for name, runs in results.items() if runs}
    ratios = {}
    ours_rate = summary["ours"]["rows_per_s"] if "ours" in summary else None
    if ours_rate and "client" in summary:
        ratios["ours_vs_client"] = round(ours_rate / summary["client"]["rows_per_s"], 3)
    if ours_rate and "cpp" in summary:
        ratios["ours_vs_cpp_send_sync"] = round(ours_rate / summary["cpp"]["rows_per_s"], 1)
    if ours_rate and "grpc" in summary:
        ratios["grpc_vs_ours"] = round(summary["grpc"]["rows_per_s"] / ours_rate, 3)
    out = {"args": vars(args), "summary": {k: v["rows_per_s"] for k, v in summary.items()},
           "ratios": ratios, "runs": results}
    print()
    print(f"{'case':32s} {'rows/s (median)':>16s}")
    labels = {"ours": "ours: df.write rocketmq", "client": "(a) our Producer.send_many",
              "cpp": "(b) foreachPartition + C++ sync", "ceiling": "wire ceiling (prebuilt)",
              "noop": "df.write noop (Spark alone)",
              "grpc": "df.write rocketmq via gRPC proxy"}
    for name, label in labels.items():
        if name in summary:
            print(f"{label:32s} {summary[name]['rows_per_s']:>16,.0f}")
    print()
    if "ours_vs_client" in ratios:
        print(f"ours / (a) = {ratios['ours_vs_client']:.2f}   (target >= 0.5)")
    if "ours_vs_cpp_send_sync" in ratios:
        print(f"ours / (b) = {ratios['ours_vs_cpp_send_sync']:.1f}   (target >= 10)")
    if "grpc_vs_ours" in ratios:
        print(f"gRPC / ours = {ratios['grpc_vs_ours']:.3f}   (issue 9 asks >= 0.3)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
