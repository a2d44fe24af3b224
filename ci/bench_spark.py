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
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

import psutil

ROOT = Path(__file__).resolve().parents[1]
CI = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(CI))
# Spark's Python workers import bench_sources (classes are pickled by reference).
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(CI), str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

from rocketmq_spark.client import Message, Producer  # noqa: E402
from rocketmq_spark.client.admin import Admin  # noqa: E402

READ_TOPIC = "BenchSpark"
LATENCY_TOPIC = "BenchLatency"
WIDE_TOPIC = "BenchWide"


# ------------------------------------------------------------------------------ processes


def start_server(*flags: str, timeout: float = 300):
    """``python -m rocketmq_spark.embedded FLAGS``; returns (process, namesrv address)."""
    proc = subprocess.Popen([sys.executable, "-m", "rocketmq_spark.embedded", *flags],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    namesrv = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("namesrv"):
            namesrv = line.split()[1]
        if line.startswith("ready") and namesrv:
            return proc, namesrv
    proc.kill()
    raise RuntimeError(f"the embedded server ({' '.join(flags)}) did not become ready")


def stop_server(proc) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _cpu_seconds(process: psutil.Process) -> float:
    """User + system CPU seconds of one process (not of its children)."""
    times = process.cpu_times()
    return times.user + times.system


def cpu_by_role(server_pid: int) -> Dict[str, float]:
    """CPU seconds (user + system) so far of the live processes: the embedded server, Spark's
    JVM and the Python processes it started (workers, daemons, runners)."""
    me = psutil.Process()
    out = {"server": 0.0, "jvm": 0.0, "python_workers": 0.0, "bench_driver": _cpu_seconds(me)}
    skip = {server_pid}
    try:
        server = psutil.Process(server_pid)
        out["server"] = _cpu_seconds(server)
        skip.update(p.pid for p in server.children(recursive=True))
    except psutil.Error:
        pass
    for child in me.children(recursive=True):
        if child.pid in skip:
            continue
        try:
            role = "jvm" if "java" in child.name() else "python_workers"
            out[role] += _cpu_seconds(child)
        except psutil.Error:  # it ended meanwhile
            pass
    return out


def machine_busy() -> float:
    """CPU seconds the whole machine has been busy (all cores; idle and iowait excluded)."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + t.irq + t.softirq + t.steal


def cpu_snapshot(server_pid: int) -> Dict[str, float]:
    snap = cpu_by_role(server_pid)
    snap["machine"] = machine_busy()
    return snap


def cpu_delta(before: Dict[str, float], after: Dict[str, float]) -> Dict[str, float]:
    """Per-role CPU seconds between two snapshots; ``other`` is what processes outside this
    benchmark used meanwhile (a shared machine makes the figures noisy)."""
    out = {k: round(after[k] - before.get(k, 0.0), 3) for k in after if k != "machine"}
    out["other"] = round(max(0.0, after["machine"] - before["machine"] - sum(out.values())), 3)
    return out


# ------------------------------------------------------------------------------ Spark


def make_spark():
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("rocketmq-spark-bench")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.log.level", "ERROR")
             .config("spark.driver.memory", "4g")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.streaming.stopTimeout", "30s")
             .config("spark.sql.streaming.numRecentProgressUpdates", "10000")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    from bench_sources import FileStreamSource, OneRowStreamSource, PrebuiltArrowSource
    from rocketmq_spark.datasource import RocketMQDataSource

    spark.dataSource.register(RocketMQDataSource)
    spark.dataSource.register(PrebuiltArrowSource)
    spark.dataSource.register(OneRowStreamSource)
    spark.dataSource.register(FileStreamSource)
    return spark


def ours_df(spark, namesrv: str, args):
    reader = (spark.read.format("rocketmq").option("nameServer", namesrv)
              .option("subscribe", READ_TOPIC).option("pullBatchSize", str(args.pull_batch_size)))
    for item in args.read_option:
        key, _, value = item.partition("=")
        reader = reader.option(key, value)
    return reader.load()


def prebuilt_df(spark, path: str, rows: int, partitions: int):
    return (spark.read.format("bench_prebuilt").option("path", path).option("rows", str(rows))
            .option("partitions", str(partitions)).load())


def jvm_df(spark, rows: int, partitions: int, size: int):
    from pyspark.sql import functions as F

    from rocketmq_spark.source.arrow import spark_schema

    now_ms = int(time.time() * 1000)
    cols = {
        "topic": F.lit(READ_TOPIC), "brokerName": F.lit("broker-a"),
        "queueId": (F.col("id") % partitions).cast("int"), "queueOffset": F.col("id"),
        "body": F.lit(bytearray(b"x" * size)), "tags": F.lit(None).cast("string"),
        "keys": F.lit(None).cast("string"), "msgId": F.lit("7F00000100002A9F0000000000000000"),
        "bornTimestamp": F.timestamp_millis(F.lit(now_ms)),
        "storeTimestamp": F.timestamp_millis(F.lit(now_ms)),
        "bornHost": F.lit("127.0.0.1:40000"), "storeHost": F.lit("127.0.0.1:10911"),
        "reconsumeTimes": F.lit(0), "commitLogOffset": F.col("id"),
    }
    schema = spark_schema()
    df = spark.range(0, rows, 1, partitions).select(
        [cols[f.name].cast(f.dataType).alias(f.name) for f in schema.fields])
    assert [(f.name, f.dataType) for f in df.schema.fields] == \
        [(f.name, f.dataType) for f in schema.fields], df.schema
    return df


def noop_write(df) -> float:
    started = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


# ------------------------------------------------------------------------------ 1. read rate


def build_reference_batch(namesrv: str, args, path: str) -> dict:
    """The first Spark batch our own partition reader yields for the first partition of the
    read in part 1 (same options), saved as Arrow IPC."""
    from bench_sources import save_batch
    from rocketmq_spark.source.batch_reader import RocketMQBatchReader
    from rocketmq_spark.source.options import parse_source_options
    from rocketmq_spark.source.partition_reader import read_partition

    raw = {"nameServer": namesrv, "subscribe": READ_TOPIC,
           "pullBatchSize": str(args.pull_batch_size)}
    raw.update(item.partition("=")[::2] for item in args.read_option)
    options = parse_source_options(raw, streaming=False)
    partition = RocketMQBatchReader(options).partitions()[0]
    batches = read_partition(options, partition)
    batch = next(batches)
    batches.close()
    save_batch(batch, path)
    return {"rows": batch.num_rows, "bytes": batch.nbytes}


def bench_read(spark, namesrv: str, server_pid: int, args, tmp: str) -> dict:
    ref_path = os.path.join(tmp, "reference.arrows")
    ref = build_reference_batch(namesrv, args, ref_path)
    print(f"reference batch: {ref['rows']:,} rows, {ref['bytes']:,} B", flush=True)
    n = args.messages
    cases = {
        "ours": lambda: ours_df(spark, namesrv, args),
        "python_ceiling": lambda: prebuilt_df(spark, ref_path, n, args.queues),
        "jvm_range": lambda: jvm_df(spark, n, args.queues, args.size),
    }
    # Row counts and partition counts must agree (counted once, untimed).
    checks = {}
    for name, make in cases.items():
        df = make()
        checks[name] = {"rows": df.count(), "partitions": df.rdd.getNumPartitions()}
    print(f"row/partition check: {checks}", flush=True)
    for name, c in checks.items():
        if c["rows"] != n:
            raise SystemExit(f"{name} has {c['rows']} rows, expected {n}")

    times: Dict[str, List[float]] = {name: [] for name in cases}
    cpu: Dict[str, Dict[str, float]] = {name: {} for name in cases}
    warm = args.warmup_rounds
    for round_no in range(warm + args.runs):
        for name, make in cases.items():
            df = make()
            before = cpu_snapshot(server_pid)
            seconds = noop_write(df)
            delta = cpu_delta(before, cpu_snapshot(server_pid))
            label = f"warm-up {round_no + 1}" if round_no < warm else f"run {round_no - warm + 1}"
            print(f"  {label:9} {name:15} {seconds:6.2f} s  {n / seconds:>12,.0f} rows/s  "
                  f"cpu {delta}", flush=True)
            if round_no >= warm:
                times[name].append(seconds)
                for k, v in delta.items():
                    cpu[name][k] = cpu[name].get(k, 0.0) + v
    out = {"reference_batch": ref, "checks": checks, "cases": {}}
    for name in cases:
        med = statistics.median(times[name])
        per_run = {k: round(v / args.runs, 3) for k, v in cpu[name].items()}
        out["cases"][name] = {
            "seconds": times[name], "median_seconds": med, "rows_per_s": n / med,
            "cpu_seconds_per_run": per_run,
            "cpu_per_1M_rows": round(sum(per_run[k] for k in ("server", "jvm", "python_workers"))
                                     * 1e6 / n, 3),
            "cpu_per_1M_rows_by_role": {k: round(per_run[k] * 1e6 / n, 3)
                                        for k in ("server", "jvm", "python_workers")},
        }
    out["cpu_ratio"] = (out["cases"]["python_ceiling"]["cpu_per_1M_rows"]
                        / out["cases"]["ours"]["cpu_per_1M_rows"])
    out["other_cpu_per_run"] = round(statistics.fmean(
        out["cases"][k]["cpu_seconds_per_run"]["other"] for k in cases), 3)
    out["ratio_vs_python_ceiling_pairwise_median"] = statistics.median(
        a / o for a, o in zip(times["python_ceiling"], times["ours"]))
    ours = out["cases"]["ours"]["rows_per_s"]
    out["ratio_vs_python_ceiling"] = ours / out["cases"]["python_ceiling"]["rows_per_s"]
    out["ratio_vs_jvm_range"] = ours / out["cases"]["jvm_range"]["rows_per_s"]
    return out


# ------------------------------------------------------------------------------ 2. latency


def percentile(values: List[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def progress_stats(progresses: List[dict], skip: int = 0, after: Optional[float] = None
                   ) -> dict:
    """Median triggerExecution and its parts over the batches with data: the first ``skip``
    left out, and those that started before ``after`` (epoch s)."""
    rows = [p for p in progresses if p.get("numInputRows", 0) > 0][skip:]
    if after is not None:
        rows = [p for p in rows if _epoch(p["timestamp"]) >= after]
    keys = ("triggerExecution", "latestOffset", "walCommit", "queryPlanning", "getBatch",
            "addBatch", "commitOffsets")
    out = {"batches": len(rows)}
    for k in keys:
        vals = [p["durationMs"].get(k, 0) for p in rows]
        out[k] = statistics.median(vals) if vals else float("nan")
    return out


def _collect_sink(record):
    """A foreachBatch function: collect the batch's keys and born times to this driver and
    call ``record(batch_id, rows, time.time())`` right after."""
    def sink(batch_df, batch_id):
        rows = batch_df.select("keys", "bornTimestamp").collect()
        record(batch_id, rows, time.time())
    return sink


def _start(df, sink: str, checkpoint: str, record=None):
    writer = df.writeStream.option("checkpointLocation", checkpoint) \
        .trigger(processingTime="0 seconds")
    if sink == "noop":
        writer = writer.format("noop")
    else:
        writer = writer.foreachBatch(_collect_sink(record or (lambda *a: None)))
    return writer.start()


def bench_reference_stream(spark, args, tmp: str, sink: str = "noop") -> dict:
    """``--reference-batches`` one-row micro-batches; then the source idles and the query is
    stopped between batches (stopping during one logs an aborted write)."""
    df = spark.readStream.format("bench_one_row") \
        .option("batches", str(args.reference_batches)).load()
    query = _start(df, sink, os.path.join(tmp, f"cp-one-row-{sink}"))
    try:
        deadline = time.monotonic() + 30 + args.reference_batches
        done = 0
        while done < args.reference_batches and time.monotonic() < deadline:
            if query.exception() is not None:
                raise RuntimeError(f"the reference query failed: {query.exception()}")
            time.sleep(0.2)
            done = sum(json.loads(p.json).get("numInputRows", 0) for p in query.recentProgress)
        time.sleep(0.5)
    finally:
        progresses = [json.loads(p.json) for p in query.recentProgress]
        query.stop()
    return progress_stats(progresses, skip=3)


def _offsets(value) -> Dict[str, int]:
    if value is None:
        return {}
    return json.loads(value) if isinstance(value, str) else dict(value)


def commit_times(progresses: List[dict], sends: Dict[int, tuple]) -> Dict[int, float]:
    """key -> end of the trigger (progress timestamp + triggerExecution) of the micro-batch
    whose offset range holds the message; ``sends`` maps key -> (queue key, offset)."""
    spans = []
    for p in progresses:
        if not p.get("numInputRows"):
            continue
        src = p["sources"][0]
        start, end = _offsets(src.get("startOffset")), _offsets(src.get("endOffset"))
        done = _epoch(p["timestamp"]) + p["durationMs"]["triggerExecution"] / 1000.0
        spans.append((start, end, done))
    out = {}
    for key, (queue, offset) in sends.items():
        for start, end, done in spans:
            if queue in end and start.get(queue, 0) <= offset < end[queue]:
                out[key] = done
                break
    return out


def bench_latency(spark, namesrv: str, args, tmp: str, sink: str = "foreachBatch",
                  seconds: Optional[float] = None, topic: str = LATENCY_TOPIC,
                  source_format: str = "rocketmq", transport: str = "rocketmq",
                  rate: Optional[float] = None) -> dict:
    """A source at a steady send rate; see the module docstring for the definitions.

    ``transport="file"``: instead of RocketMQ, records appended to a local file and read by
    ``bench_file_stream`` (the zero-cost reference)."""
    seconds = args.latency_seconds if seconds is None else seconds
    rate = args.latency_rate if rate is None else rate
    sent: Dict[int, float] = {}        # key -> time.time() before send
    where: Dict[int, tuple] = {}       # key -> (queue key, queue offset)
    arrived: Dict[int, float] = {}     # key -> time.time() after collect in foreachBatch
    born: Dict[int, float] = {}        # key -> bornTimestamp (s)
    batches = []

    def record(batch_id, rows, now):
        batches.append((batch_id, len(rows), now))
        for r in rows:
            key = int(r["keys"])
            arrived.setdefault(key, now)
            born[key] = r["bornTimestamp"].timestamp()

    if transport == "file":
        from bench_sources import append_record

        path = os.path.join(tmp, f"records-{sink}-{time.monotonic_ns()}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        df = spark.readStream.format("bench_file_stream").option("path", path).load()
        name = f"file-{sink}"
    else:
        df = (spark.readStream.format(source_format).option("nameServer", namesrv)
              .option("subscribe", topic).option("startingOffsets", "latest").load())
        name = f"{sink}-{topic}-{source_format}"
    query = _start(df, sink, os.path.join(tmp, f"cp-latency-{name}"), record)
    stop_sending = threading.Event()
    total = int((args.latency_warmup + seconds) * rate)
    warm = int(args.latency_warmup * rate)

    def paced():
        """Message numbers 0..total-1, each at its send time; records that time in ``sent``."""
        next_at = time.monotonic()
        for i in range(total):
            if stop_sending.is_set():
                return
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            sent[i] = time.time()
            yield i
            next_at += 1.0 / rate

    def produce():
        if transport == "file":
            for i in paced():
                append_record(fd, int(sent[i] * 1000))
                where[i] = ("pos", i)
            return
        body = b"x" * args.size
        with Producer(namesrv) as producer:
            producer.queues(topic, refresh=True)
            for i in paced():
                result = producer.send(Message(topic, body, keys=str(i)))
                where[i] = (result.queue.key, result.queue_offset)

    def last_batch_done() -> bool:
        last = query.lastProgress
        return bool(where) and last is not None and all(
            _offsets(last["sources"][0].get("endOffset")).get(q, -1) > o
            for q, o in (where[k] for k in list(where)[-4:]))

    try:
        deadline = time.monotonic() + 60
        while query.lastProgress is None and time.monotonic() < deadline:
            time.sleep(0.05)  # batch 0 pins the starting offsets
        if query.lastProgress is None:
            raise RuntimeError(f"the latency query made no progress: {query.exception()}")
        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        producer.join(args.latency_warmup + seconds + 60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if query.exception() is not None:
                raise RuntimeError(f"the latency query failed: {query.exception()}")
            if (len(arrived) >= total) if sink != "noop" else last_batch_done():
                break
            time.sleep(0.1)
        time.sleep(0.3)
    finally:
        stop_sending.set()
        progresses = [json.loads(p.json) for p in query.recentProgress]
        query.stop()
        if transport == "file":
            os.close(fd)
    measured = [k for k in range(warm, total) if k in sent]
    warm_end = sent.get(warm, float("inf"))
    committed = commit_times(progresses, {k: where[k] for k in measured if k in where})
    commit_lat = [(committed[k] - sent[k]) * 1000 for k in measured if k in committed]
    out = {
        "sink": sink, "messages_sent": len(measured),
        "commit_p50_ms": percentile(commit_lat, 0.5), "commit_p99_ms": percentile(commit_lat, 0.99),
        "progress": progress_stats(progresses, after=warm_end),
    }
    if sink != "noop":
        lat = [(arrived[k] - sent[k]) * 1000 for k in measured if k in arrived]
        born_lat = [(arrived[k] - born[k]) * 1000 for k in measured if k in arrived]
        steady = [b for b in batches if b[2] > warm_end and b[1]]
        out.update({
            "messages_measured": len(lat), "messages_missing": len(measured) - len(lat),
            "p50_ms": percentile(lat, 0.5), "p99_ms": percentile(lat, 0.99),
            "mean_ms": statistics.fmean(lat) if lat else float("nan"),
            "max_ms": max(lat) if lat else float("nan"),
            "born_p50_ms": percentile(born_lat, 0.5),
            "batches_with_rows": len(steady),
            "rows_per_batch": statistics.median([b[1] for b in steady]) if steady else 0,
        })
    return out


# ------------------------------------------------------------------------------ 3. planning


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


# ------------------------------------------------------------------------------ main


def ok(good: bool) -> str:
    return "✔" if good else "✘"


def read_table(result: dict) -> str:
    """Part 1 alone (``--skip latency --skip planning``)."""
    return "\n".join(["| measure | value | reference | ratio | target |",
                      "|---|---:|---:|---:|---|"] + read_lines(result))


def read_lines(result: dict) -> list:
    r = result["read"]
    c = r["cases"]
    a = result["args"]
    return [
        f"| per-pull caps of the broker (messages / bytes), pullBatchSize | "
        f"{a['max_transfer_count']} / {a['max_transfer_bytes']:,} B, {a['pull_batch_size']} "
        "| | | – |",
        f"| read rate, ours → noop (rows/s) | {c['ours']['rows_per_s']:,.0f} | "
        f"(a) Python prebuilt batches {c['python_ceiling']['rows_per_s']:,.0f} | "
        f"{r['ratio_vs_python_ceiling']:.2f} | "
        f"≥ 0.6 {ok(r['ratio_vs_python_ceiling'] >= 0.6)} |",
        f"| read rate, ours → noop (rows/s) | {c['ours']['rows_per_s']:,.0f} | "
        f"(b) JVM spark.range {c['jvm_range']['rows_per_s']:,.0f} | "
        f"{r['ratio_vs_jvm_range']:.2f} | – |",
        f"| read rate ratio ours/(a), median of the per-round ratios | | | "
        f"{r['ratio_vs_python_ceiling_pairwise_median']:.2f} | (noise check) |",
        f"| CPU s per 1M rows (server + JVM + Python workers) | "
        f"{c['ours']['cpu_per_1M_rows']:.2f} | (a) {c['python_ceiling']['cpu_per_1M_rows']:.2f} | "
        f"{r['cpu_ratio']:.2f} | (CPU(a)/CPU(ours)) |",
        f"| CPU s per 1M rows: Python workers / Spark JVM / embedded broker | "
        f"{c['ours']['cpu_per_1M_rows_by_role']['python_workers']:.2f} / "
        f"{c['ours']['cpu_per_1M_rows_by_role']['jvm']:.2f} / "
        f"{c['ours']['cpu_per_1M_rows_by_role']['server']:.2f} | "
        f"(a) {c['python_ceiling']['cpu_per_1M_rows_by_role']['python_workers']:.2f} / "
        f"{c['python_ceiling']['cpu_per_1M_rows_by_role']['jvm']:.2f} / – | | "
        f"workers ≤ 0.6 {ok(c['ours']['cpu_per_1M_rows_by_role']['python_workers'] <= 0.6)} |",
        f"| CPU s used by other processes per timed run | {r['other_cpu_per_run']:.2f} | | | "
        f"≈ 0 for clean figures |",
    ]


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


def main() -> None:
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
    args = parser.parse_args()

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
            if not args.no_diagnostics:
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
                    spark, namesrv, args, tmp, seconds=args.diagnostics_seconds,
                    transport="file")
                print(f"   {result['latency_file_reference']}", flush=True)
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
