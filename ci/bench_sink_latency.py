"""The latency part of ci/bench_sink.py: exactly once against at least once, one
read-transform-write streaming query per guarantee fed at a steady rate, timed from each
micro-batch's trigger until a consumer can read its whole output (ci/bench_sink.py's docstring
has the definitions).
"""
from __future__ import annotations

import json
import statistics
import threading
import time
import uuid
from typing import Dict, List, Optional

import bench_session  # noqa: F401  (puts the checkout on sys.path)
from rocketmq_spark.client import Message, Producer
from rocketmq_spark.client.admin import Admin

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


def latency_query(spark, namesrv: str, in_topic: str, guarantee: str, out_topic: str,
                  checkpoint: str, args) -> Dict:
    """One read-transform-write stream from ``in_topic`` for ``--latency-seconds`` after its
    warm-up; per micro-batch: visible (s), addBatch and triggerExecution (ms)."""
    with Admin(namesrv) as admin:
        admin.create_topic(out_topic, args.queues)
    df = (spark.readStream.format("rocketmq").option("nameServer", namesrv)
          .option("subscribe", in_topic).option("startingOffsets", "latest").load()
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


def bench_latency(spark, namesrv: str, in_topic: str, args) -> Dict:
    """Both guarantees, ``--latency-rounds`` rounds interleaved, one feeder of ``in_topic``
    throughout."""
    per: Dict[str, Dict[str, List[float]]] = {
        g: {"visible_ms": [], "add_batch_ms": [], "trigger_ms": []} for g in GUARANTEES}
    with Feeder(namesrv, in_topic, args.latency_rate, args.size):
        for round_no in range(args.latency_rounds):
            for guarantee in GUARANTEES:
                tag = uuid.uuid4().hex[:8]
                result = latency_query(spark, namesrv, in_topic, guarantee,
                                       f"BenchLatOut-{tag}", f"{args.tmp}/lat-{tag}", args)
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


def print_latency(latency: Dict) -> None:
    """The latency table of :func:`bench_latency`'s summary."""
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
