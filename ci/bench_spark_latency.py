"""Part 2 of ci/bench_spark.py, the latency: messages sent at a steady rate, timed from the
send to the user's foreachBatch and to the batch's commit, against a one-row Python stream
source and a file source with no broker (ci/bench_spark.py's docstring has the definitions).
"""
from __future__ import annotations

import json
import os
import statistics
import threading
import time
from typing import Dict, List, Optional

import bench_session  # noqa: F401  (puts the checkout on sys.path)
from rocketmq_spark.client import Message, Producer

LATENCY_TOPIC = "BenchLatency"


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
    """The queue offsets of a progress's start or end offset (any version of its shape)."""
    from rocketmq_spark.source.offsets import queue_offsets

    if value is None:
        return {}
    return queue_offsets(json.loads(value) if isinstance(value, str) else dict(value))


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
