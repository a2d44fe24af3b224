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
  far slower), a rate, so comparable; reported as a ratio of ours (target >= 0.3).
* eo: ours with ``option("deliveryGuarantee", "exactlyOnce")`` (half messages, one per
  request, END_TRANSACTION COMMIT for each from the job's commit) on ``--eo-rows`` rows
  (default 200,000), a rate, reported as a ratio of ours in the same run (target >= 0.5).
  END_TRANSACTION is oneway, so the clock runs from ``save()`` until the broker's topic holds
  every row (polled every 10 ms), and the topic must then have grown by exactly the rows.
* flow: the exactly-once write against a broker in flow control (genuine 4.9.8 queue limits)
  and against one with flow control off, and busy answers per 100,000 rows: see
  ``ci/bench_flow_control.py`` (``--flow-rows``, ``--flow-limit``).
* broker stall, every case: a thread of this process sends GET_MAX_OFFSET (one queue of
  ``BenchPing``) every 50 ms; "slowest ping" is the slowest answer to a ping sent while the
  case ran: how long the embedded broker (one event loop) kept every client waiting.
* latency (exactly once against at least once): one streaming query per guarantee,
  read-transform-write from topic
  ``BenchLatIn`` to a fresh output topic, ``trigger(processingTime=--latency-trigger)`` (1 s),
  while a thread of this process sends ``--latency-rate`` (2,000) messages/s to the input in
  bursts every 50 ms, and another polls the output topic's max offsets every 10 ms. For each
  micro-batch with rows, started at its progress ``timestamp`` (epoch ``t0``) and bringing
  the query's row count to ``C``: "visible" = the first poll at which the output holds ``C``
  messages, minus ``t0``: from the trigger to the consumer being able to read the whole
  batch (for exactly once that is the COMMIT; for at least once the last acknowledgement).
  Reported per guarantee: medians (and p90) of visible, ``addBatch`` and ``triggerExecution``
  over the batches that start ``--latency-warmup`` s (5) after the query's first micro-batch
  with rows finished, during ``--latency-seconds`` (20) per query,
  ``--latency-rounds`` (2) rounds with the guarantees interleaved; and the added latency per
  micro-batch: exactlyOnce minus atLeastOnce of the medians of visible and of addBatch.

``--warmup`` (1) untimed round, then ``--runs`` (3) timed rounds with the cases interleaved;
medians are reported. CPU seconds per case and role (embedded server, Spark's JVM, its Python
workers, this process) come from /proc; ``other`` is what processes outside the benchmark used
meanwhile (wall-clock figures only mean something when it is near 0).

Targets: ours >= 0.5 x (a), ours >= 10 x (b), eo >= 0.5 x ours, grpc >= 0.3 x ours.
Run: ``.venv/bin/python ci/bench_sink.py [--rows N] [--json out.json]``.
"""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Dict, List, Optional

CI = Path(__file__).resolve().parent
sys.path.insert(0, str(CI))

from bench_spark import (  # noqa: E402  (also puts the checkout on sys.path, sets PYSPARK_*)
    cpu_delta, cpu_snapshot, start_server, stop_server,
)
import bench_flow_control  # noqa: E402

from rocketmq_spark.client import Message, Producer  # noqa: E402
from rocketmq_spark.client.admin import Admin  # noqa: E402
from rocketmq_spark.client.send_pipeline import Outgoing  # noqa: E402

TOPICS = {"ours": "BenchSink", "client": "BenchClient", "cpp": "BenchCpp",
          "ceiling": "BenchCeiling", "grpc": "BenchGrpcSink", "eo": "BenchSinkEo",
          "latency": "BenchLatIn", "ping": "BenchPing"}
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


GUARANTEES = ("atLeastOnce", "exactlyOnce")


def _median(values: List[float]) -> float:
    return round(statistics.median(values), 1) if values else float("nan")


def _p90(values: List[float]) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 1)


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


class Feeder:
    """Sends ``rate`` messages a second to ``topic`` in bursts every 50 ms until stopped."""

    def __init__(self, namesrv: str, topic: str, rate: int, size: int):
        self.producer = Producer(namesrv, max_in_flight_per_broker=4)
        self.topic, self.rate, self.size = topic, rate, size
        self.sent = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        tick, start = 0.05, time.monotonic()
        while not self.stopping.is_set():
            due = int((time.monotonic() - start) * self.rate)
            if due > self.sent:
                batch = [Message(self.topic, str(i).rjust(self.size, "x").encode(),
                                 keys=str(i)) for i in range(self.sent, due)]
                self.producer.send_many(batch, batch_size=256, in_flight=4)
                self.sent = due
            time.sleep(tick)

    def __enter__(self) -> "Feeder":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.thread.join(30)
        self.producer.close()


class Pinger:
    """GET_MAX_OFFSET of one queue every 50 ms, timed: how long the broker (one event loop)
    keeps every client waiting while a case runs."""

    def __init__(self, namesrv: str, topic: str):
        self.admin = Admin(namesrv)
        self.queues = self.admin.queues(topic, refresh=True)[:1]
        self.samples: List[tuple] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stopping.is_set():
            sent = time.time()
            self.admin.offsets("max", self.queues, timeout=120)
            self.samples.append((sent, time.time() - sent))
            time.sleep(0.05)

    def worst(self, start: float, end: float) -> float:
        """The slowest answer (ms) to a ping sent between ``start`` and ``end``."""
        return round(1000 * max((rtt for t, rtt in self.samples if start <= t <= end),
                                default=0.0), 1)

    def __enter__(self) -> "Pinger":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.thread.join(150)
        self.admin.close()


class OutputWatch:
    """Polls a topic's total max offset every 10 ms: samples of (epoch time, total)."""

    def __init__(self, namesrv: str, topic: str):
        self.admin = Admin(namesrv)
        self.queues = self.admin.queues(topic, refresh=True)
        self.samples: List[tuple] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stopping.is_set():
            count = sum(self.admin.offsets("max", self.queues, timeout=60).values())
            self.samples.append((time.time(), count))
            time.sleep(0.01)

    def visible_at(self, count: int) -> Optional[float]:
        return next((t for t, c in self.samples if c >= count), None)

    def __enter__(self) -> "OutputWatch":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.thread.join(30)
        self.admin.close()


def latency_query(spark, namesrv: str, guarantee: str, out_topic: str, checkpoint: str,
                  args) -> Dict:
    """One read-transform-write stream for ``--latency-seconds`` after its warm-up; per
    micro-batch: visible (s), addBatch and triggerExecution (ms)."""
    with Admin(namesrv) as admin:
        admin.create_topic(out_topic, args.queues)
    df = (spark.readStream.format("rocketmq").option("nameServer", namesrv)
          .option("subscribe", TOPICS["latency"]).option("startingOffsets", "latest").load()
          .selectExpr("body", "keys"))
    writer = (df.writeStream.format("rocketmq").option("nameServer", namesrv)
              .option("topic", out_topic).option("checkpointLocation", checkpoint)
              .option("deliveryGuarantee", guarantee)
              .trigger(processingTime=args.latency_trigger))
    for item in args.sink_option:
        key, _, value = item.partition("=")
        writer = writer.option(key, value)
    with OutputWatch(namesrv, out_topic) as watch:
        query = writer.start()
        started = None  # when the first micro-batch with rows finished: the warm-up starts
        try:
            deadline = time.time() + 600
            while started is None or time.time() - started < (args.latency_warmup
                                                              + args.latency_seconds):
                if query.exception() is not None:
                    raise RuntimeError(f"{guarantee} query failed: {query.exception()}")
                if time.time() > deadline:
                    raise RuntimeError(f"{guarantee} query: no micro-batch with rows")
                if started is None and any(p.numInputRows for p in query.recentProgress):
                    started = time.time()
                time.sleep(0.2)
            progresses = [json.loads(p.json) for p in query.recentProgress]
        finally:
            query.stop()
        time.sleep(0.5)  # the last batch's rows become visible
    rows = 0
    visible, add_batch, trigger, sizes = [], [], [], []
    for prog in sorted(progresses, key=lambda p: p["batchId"]):
        rows += prog["numInputRows"]
        t0 = _epoch(prog["timestamp"])
        if not prog["numInputRows"] or t0 < started + args.latency_warmup:
            continue
        seen = watch.visible_at(rows)
        if seen is None:
            raise AssertionError(f"{guarantee}: the output never held {rows} messages")
        visible.append((seen - t0) * 1000)
        sizes.append(prog["numInputRows"])
        add_batch.append(prog["durationMs"].get("addBatch", 0))
        trigger.append(prog["durationMs"].get("triggerExecution", 0))
    if not visible:
        raise AssertionError(f"{guarantee}: no micro-batch with rows after the warm-up")
    return {"batches": len(visible), "rows_per_batch": statistics.median(sizes),
            "visible_ms": visible, "add_batch_ms": add_batch, "trigger_ms": trigger}


def bench_latency(spark, namesrv: str, args) -> Dict:
    """Both guarantees, ``--latency-rounds`` rounds interleaved, one feeder throughout."""
    per: Dict[str, Dict[str, List[float]]] = {
        g: {"visible_ms": [], "add_batch_ms": [], "trigger_ms": []} for g in GUARANTEES}
    with Feeder(namesrv, TOPICS["latency"], args.latency_rate, args.size):
        for round_no in range(args.latency_rounds):
            for guarantee in GUARANTEES:
                tag = uuid.uuid4().hex[:8]
                result = latency_query(spark, namesrv, guarantee, f"BenchLatOut-{tag}",
                                       f"{args.tmp}/lat-{tag}", args)
                for key in per[guarantee]:
                    per[guarantee][key] += result[key]
                print(f"  latency  {guarantee:12s} round {round_no}: {result['batches']} "
                      f"batches of ~{result['rows_per_batch']} rows, visible p50 "
                      f"{_median(result['visible_ms'])} ms, addBatch p50 "
                      f"{_median(result['add_batch_ms'])} ms", flush=True)
    summary = {g: {"batches": len(v["visible_ms"]),
                   **{f"{k}_p50": _median(vals) for k, vals in v.items()},
                   **{f"{k}_p90": _p90(vals) for k, vals in v.items()}}
               for g, v in per.items()}
    eo, alo = summary["exactlyOnce"], summary["atLeastOnce"]
    summary["added_ms"] = {"visible_p50": round(eo["visible_ms_p50"] - alo["visible_ms_p50"], 1),
                           "add_batch_p50": round(eo["add_batch_ms_p50"]
                                                  - alo["add_batch_ms_p50"], 1)}
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--cpp-rows", type=int, default=100_000)
    p.add_argument("--grpc-rows", type=int, default=20_000)
    p.add_argument("--eo-rows", type=int, default=200_000)
    p.add_argument("--latency-rate", type=int, default=2_000)
    p.add_argument("--latency-trigger", default="1 second")
    p.add_argument("--latency-seconds", type=float, default=20.0)
    p.add_argument("--latency-warmup", type=float, default=5.0)
    p.add_argument("--latency-rounds", type=int, default=2)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--queues", type=int, default=4)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--skip-cpp", action="store_true")
    p.add_argument("--sink-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option for our sink (repeatable), e.g. maxBatchBytes=262144")
    bench_flow_control.add_arguments(p)
    p.add_argument("--cases", default="ours,client,cpp,ceiling,noop,grpc,eo,flow,latency",
                   help="comma list of the cases to run")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    args.tmp = tempfile.mkdtemp(prefix="bench-sink-")  # the latency queries' checkpoints

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
                                                      "noop", "grpc", "eo")}
    latency: Optional[Dict] = None
    flow: Optional[Dict] = None
    try:
        df = rows_df(spark, args.rows, args.partitions, args.size)
        cpp_df = rows_df(spark, args.cpp_rows, args.partitions, args.size)
        grpc_df = rows_df(spark, args.grpc_rows, args.partitions, args.size)
        eo_df = rows_df(spark, args.eo_rows, args.partitions, args.size)
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

        def eo():
            # END_TRANSACTION is oneway: save() returns once they are written to the sockets,
            # the rows become visible when the broker has stored them; the clock runs until
            # the topic holds them all (polled every 10 ms on one connection, patiently: the
            # broker is busy storing them).
            queues = eo_admin.queues(TOPICS["eo"], refresh=True)
            before = sum(eo_admin.offsets("max", queues, timeout=60).values())
            writer = (eo_df.write.format("rocketmq").mode("append")
                      .option("nameServer", namesrv).option("topic", TOPICS["eo"])
                      .option("deliveryGuarantee", "exactlyOnce"))
            for item in args.sink_option:
                key, _, value = item.partition("=")
                writer = writer.option(key, value)
            writer.save()
            deadline = time.monotonic() + 300
            while sum(eo_admin.offsets("max", queues, timeout=60).values()) < (before
                                                                             + args.eo_rows):
                if time.monotonic() > deadline:
                    raise AssertionError("eo: committed rows did not all become visible")
                time.sleep(0.01)

        eo_admin = Admin(namesrv)
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
        cases.insert(1, ("eo", args.eo_rows, TOPICS["eo"], eo))
        wanted = set(args.cases.split(","))
        cases = [c for c in cases if c[0] in wanted]
        pinger = Pinger(namesrv, TOPICS["ping"]).__enter__()
        for round_no in range(args.warmup + args.runs):
            for name, rows, topic, action in cases:
                window = time.time()
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
                result["broker_stall_ms"] = pinger.worst(window, time.time())
                label = "warm-up" if round_no < args.warmup else f"run {round_no - args.warmup}"
                print(f"  {label:8s} {name:8s} {result['rows_per_s']:>10,} rows/s  "
                      f"({result['seconds']:.2f} s; cpu {result['cpu']}; slowest ping "
                      f"{result['broker_stall_ms']} ms)", flush=True)
                if round_no >= args.warmup:
                    results[name].append(result)
        pinger.__exit__()
        producer.close()
        eo_admin.close()
        if "flow" in wanted:
            flow = bench_flow_control.bench_flow(spark, args)
        if "latency" in wanted:
            latency = bench_latency(spark, namesrv, args)
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
    if ours_rate and "eo" in summary:
        ratios["eo_vs_ours"] = round(summary["eo"]["rows_per_s"] / ours_rate, 3)
    out = {"args": vars(args), "summary": {k: v["rows_per_s"] for k, v in summary.items()},
           "ratios": ratios, "latency": latency, "flow": flow, "runs": results}
    print()
    print(f"{'case':32s} {'rows/s (median)':>16s} {'slowest ping (ms)':>18s}")
    labels = {"ours": "ours: df.write rocketmq", "client": "(a) our Producer.send_many",
              "cpp": "(b) foreachPartition + C++ sync", "ceiling": "wire ceiling (prebuilt)",
              "noop": "df.write noop (Spark alone)",
              "grpc": "df.write rocketmq via gRPC proxy",
              "eo": "df.write rocketmq exactlyOnce"}
    for name, label in labels.items():
        if name in summary:
            stall = max(r["broker_stall_ms"] for r in summary[name]["runs"])
            print(f"{label:32s} {summary[name]['rows_per_s']:>16,.0f} {stall:>18,.1f}")
    print()
    if "ours_vs_client" in ratios:
        print(f"ours / (a) = {ratios['ours_vs_client']:.2f}   (target >= 0.5)")
    if "ours_vs_cpp_send_sync" in ratios:
        print(f"ours / (b) = {ratios['ours_vs_cpp_send_sync']:.1f}   (target >= 10)")
    if "grpc_vs_ours" in ratios:
        print(f"gRPC / ours = {ratios['grpc_vs_ours']:.3f}   (target >= 0.3)")
    if "eo_vs_ours" in ratios:
        print(f"exactlyOnce / ours = {ratios['eo_vs_ours']:.3f}   (target >= 0.5)")
    if flow:
        bench_flow_control.report(flow)
    if latency:
        print()
        print(f"{'per micro-batch (ms)':24s} {'visible p50':>12s} {'p90':>8s} "
              f"{'addBatch p50':>13s} {'trigger p50':>12s} {'batches':>8s}")
        for g in GUARANTEES:
            r = latency[g]
            print(f"{g:24s} {r['visible_ms_p50']:>12.1f} {r['visible_ms_p90']:>8.1f} "
                  f"{r['add_batch_ms_p50']:>13.1f} {r['trigger_ms_p50']:>12.1f} "
                  f"{r['batches']:>8d}")
        added = latency["added_ms"]
        print(f"added by exactlyOnce per micro-batch: visible {added['visible_p50']:+.1f} ms, "
              f"addBatch {added['add_batch_p50']:+.1f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
