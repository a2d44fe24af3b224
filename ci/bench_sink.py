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

import bench_session  # noqa: E402,F401  (puts the checkout on sys.path, sets PYSPARK_*)
from bench_processes import cpu_delta, cpu_snapshot, start_server, stop_server  # noqa: E402
import bench_flow_control  # noqa: E402
from bench_sink_latency import bench_latency, print_latency  # noqa: E402

from rocketmq_spark.client import Message, Producer  # noqa: E402
from rocketmq_spark.client.admin import Admin  # noqa: E402
from rocketmq_spark.client.send.pipeline import Outgoing  # noqa: E402

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


def with_sink_options(writer, args):
    """``writer`` with every ``--sink-option KEY=VALUE``."""
    for item in args.sink_option:
        key, _, value = item.partition("=")
        writer = writer.option(key, value)
    return writer


class Cases:
    """The timed cases (see the module docstring), each an action that sends its rows once,
    with what they share: the DataFrames, the bodies of (a), one producer, one admin."""

    def __init__(self, spark, namesrv: str, proxy: Optional[str], args):
        self.namesrv, self.proxy, self.args = namesrv, proxy, args
        self.df = rows_df(spark, args.rows, args.partitions, args.size)
        self.cpp_df = rows_df(spark, args.cpp_rows, args.partitions, args.size)
        self.grpc_df = rows_df(spark, args.grpc_rows, args.partitions, args.size)
        self.eo_df = rows_df(spark, args.eo_rows, args.partitions, args.size)
        self.bodies = [str(i).rjust(args.size, "x")[:args.size].encode()
                       for i in range(args.rows)]
        self.producer = Producer(namesrv, max_in_flight_per_broker=4)
        self.ceiling_count = BATCH_BYTES // (args.size + 80)
        self.ceiling_request = self.producer.encode_batch(
            [Message(TOPICS["ceiling"], b"x" * args.size) for _ in range(self.ceiling_count)])
        self.eo_admin = Admin(namesrv)
        self.client_started = 0.0  # when client() had built its messages

    def selected(self) -> List[tuple]:
        """(name, rows, topic, action) of the cases ``--cases`` asks for, in their order."""
        args = self.args
        cases = [("ours", args.rows, TOPICS["ours"], self.ours),
                 ("client", args.rows, TOPICS["client"], self.client),
                 ("ceiling", (args.rows // self.ceiling_count) * self.ceiling_count,
                  TOPICS["ceiling"], self.ceiling),
                 ("noop", args.rows, None, self.noop)]
        if self.proxy is not None:
            cases.append(("grpc", args.grpc_rows, TOPICS["grpc"], self.grpc))
        if not args.skip_cpp:
            cases.insert(2, ("cpp", args.cpp_rows, TOPICS["cpp"], self.cpp))
        cases.insert(1, ("eo", args.eo_rows, TOPICS["eo"], self.eo))
        wanted = set(args.cases.split(","))
        return [c for c in cases if c[0] in wanted]

    def ours(self) -> None:
        writer = (self.df.write.format("rocketmq").mode("append")
                  .option("nameServer", self.namesrv).option("topic", TOPICS["ours"]))
        with_sink_options(writer, self.args).save()

    def client(self) -> None:
        messages = [Message(TOPICS["client"], b) for b in self.bodies]
        self.client_started = time.perf_counter()
        self.producer.send_many(messages, batch_size=1 << 20, in_flight=4,
                                max_batch_bytes=BATCH_BYTES)

    def ceiling(self) -> None:
        pipeline = self.producer.pipeline()
        for _ in range(self.args.rows // self.ceiling_count):
            pipeline.submit(Outgoing(TOPICS["ceiling"], self.ceiling_request,
                                     self.ceiling_count))
        pipeline.flush()

    def cpp(self) -> None:
        self.cpp_df.foreachPartition(cpp_send_partition(self.namesrv, TOPICS["cpp"]))

    def noop(self) -> None:
        self.df.write.format("noop").mode("append").save()

    def grpc(self) -> None:
        (self.grpc_df.write.format("rocketmq").mode("append").option("endpoints", self.proxy)
         .option("tls", "false").option("topic", TOPICS["grpc"]).save())

    def eo(self) -> None:
        # END_TRANSACTION is oneway: save() returns once they are written to the sockets,
        # the rows become visible when the broker has stored them; the clock runs until
        # the topic holds them all (polled every 10 ms on one connection, patiently: the
        # broker is busy storing them).
        admin = self.eo_admin
        queues = admin.queues(TOPICS["eo"], refresh=True)
        before = sum(admin.offsets("max", queues, timeout=60).values())
        writer = (self.eo_df.write.format("rocketmq").mode("append")
                  .option("nameServer", self.namesrv).option("topic", TOPICS["eo"])
                  .option("deliveryGuarantee", "exactlyOnce"))
        with_sink_options(writer, self.args).save()
        deadline = time.monotonic() + 300
        while sum(admin.offsets("max", queues, timeout=60).values()) < (before
                                                                        + self.args.eo_rows):
            if time.monotonic() > deadline:
                raise AssertionError("eo: committed rows did not all become visible")
            time.sleep(0.01)

    def close(self) -> None:
        self.producer.close()
        self.eo_admin.close()


def timed_client(cases: Cases, server_pid: int, rows: int, namesrv: str, topic: str) -> Dict:
    """:func:`timed` for the client case: its Message objects are built inside the action,
    so only the sends are timed."""
    before = stored(namesrv, topic)
    cpu0 = cpu_snapshot(server_pid)
    cases.client()
    seconds = time.perf_counter() - cases.client_started
    cpu = cpu_delta(cpu0, cpu_snapshot(server_pid))
    assert stored(namesrv, topic) - before == rows, "client: lost messages"
    return {"rows": rows, "seconds": round(seconds, 3), "rows_per_s": round(rows / seconds),
            "cpu": cpu}


def run_rounds(cases: Cases, server_pid: int, namesrv: str, args) -> Dict[str, List[Dict]]:
    """``--warmup`` untimed rounds, then ``--runs`` timed ones, the cases interleaved, the
    broker pinged throughout; the timed runs by case."""
    results: Dict[str, List[Dict]] = {k: [] for k in ("ours", "client", "cpp", "ceiling",
                                                      "noop", "grpc", "eo")}
    selected = cases.selected()
    pinger = Pinger(namesrv, TOPICS["ping"]).__enter__()
    for round_no in range(args.warmup + args.runs):
        for name, rows, topic, action in selected:
            window = time.time()
            if name == "client":
                result = timed_client(cases, server_pid, rows, namesrv, topic)
            else:
                result = timed(name, server_pid, rows, namesrv, topic, action)
            result["broker_stall_ms"] = pinger.worst(window, time.time())
            label = "warm-up" if round_no < args.warmup else f"run {round_no - args.warmup}"
            print(f"  {label:8s} {name:8s} {result['rows_per_s']:>10,} rows/s  "
                  f"({result['seconds']:.2f} s; cpu {result['cpu']}; slowest ping "
                  f"{result['broker_stall_ms']} ms)", flush=True)
            if round_no >= args.warmup:
                results[name].append(result)
    pinger.__exit__()
    return results


def parse_args() -> argparse.Namespace:
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
    return p.parse_args()


def start_broker(args):
    """The embedded broker with every topic, and its gRPC proxy on a free port when the grpc
    case runs: (process, name server, proxy address or None)."""
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
    return server, namesrv, proxy


def summarize(results: Dict[str, List[Dict]]) -> tuple:
    """The median rate per case and the ratios the targets name: (summary, ratios)."""
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
    return summary, ratios


def print_rates(summary: Dict, ratios: Dict) -> None:
    """The table of median rates and slowest pings, then the ratios against their targets."""
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


def main() -> None:
    args = parse_args()
    args.tmp = tempfile.mkdtemp(prefix="bench-sink-")  # the latency queries' checkpoints
    server, namesrv, proxy = start_broker(args)
    spark = make_spark()
    print(f"embedded broker at {namesrv} (pid {server.pid}); {args.rows:,} x {args.size} B rows, "
          f"{args.partitions} partitions, {args.queues} queues", flush=True)
    latency: Optional[Dict] = None
    flow: Optional[Dict] = None
    wanted = set(args.cases.split(","))
    try:
        cases = Cases(spark, namesrv, proxy, args)
        results = run_rounds(cases, server.pid, namesrv, args)
        cases.close()
        if "flow" in wanted:
            flow = bench_flow_control.bench_flow(spark, args)
        if "latency" in wanted:
            latency = bench_latency(spark, namesrv, TOPICS["latency"], args)
    finally:
        spark.stop()
        stop_server(server)

    summary, ratios = summarize(results)
    out = {"args": vars(args), "summary": {k: v["rows_per_s"] for k, v in summary.items()},
           "ratios": ratios, "latency": latency, "flow": flow, "runs": results}
    print_rates(summary, ratios)
    if flow:
        bench_flow_control.report(flow)
    if latency:
        print_latency(latency)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
