"""The quick-start demo: Spark Structured Streaming reading an embedded RocketMQ, exactly once.

What it does, end to end, on one machine:

1. starts an embedded RocketMQ (a name server and ``--brokers`` brokers) and creates a topic with
   ``--queues`` queues on every broker;
2. sends ``--messages`` messages (with tags and keys) with this package's Producer;
3. runs a checkpointed ``spark.readStream.format("rocketmq")`` query into a parquet sink with
   ``Trigger.AvailableNow`` (read everything there is, then stop), committing its offsets
   back to a RocketMQ consumer group;
4. sends more messages and runs the same query again from the same checkpoint: the restart
   reads only the new messages;
5. checks the sink against what was sent (every message exactly once: none missing, no
   duplicate) and the group's lag per queue (broker max offset - committed offset, 0 once a
   run has drained the topic), and prints a summary. Exits 1 if a check fails.

Run it with ``ci/demo.sh`` (which sets everything up) or ``python -m rocketmq_spark.demo``; on a
Spark cluster, ``spark-submit rocketmq_spark/demo.py`` (``ci/cluster.sh``, docs/deploying.md).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional

# Absolute imports: spark-submit runs this file as a script (ci/cluster.sh).
from rocketmq_spark.client import Message, MessageQueue, Producer
from rocketmq_spark.client.admin import Admin
from rocketmq_spark.embedded import EmbeddedCluster

TOPIC = "DemoTopic"
GROUP = "demo-spark-group"

# Spark's own logging at ERROR from the first line on (setLogLevel only applies once the
# session is up, after the start-up warnings). A logger of its own for org.apache.spark also
# keeps Spark from printing its "Setting default log level" banner.
_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
logger.spark.name = org.apache.spark
logger.spark.level = error
"""


def quiet_log4j_option(folder: Optional[str] = None) -> str:
    """A ``spark.driver.extraJavaOptions`` value that sets Spark's logging to ERROR from the
    start (the log4j2 file is written to ``folder``, by default the temp dir)."""
    path = Path(folder or tempfile.gettempdir()) / "rocketmq-spark-log4j2.properties"
    if not path.exists() or path.read_text() != _LOG4J2:
        path.write_text(_LOG4J2)
    return f"-Dlog4j2.configurationFile={path.as_uri()}"


def launched_by_spark_submit() -> bool:
    """Whether spark-submit started this driver: it starts the driver's JVM first and hands
    Python its gateway through ``PYSPARK_GATEWAY_PORT``."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def spark_session(app_name: str = "rocketmq-spark-demo"):
    """A quiet SparkSession: log level ERROR, no UI, UTC. Run directly, it is local[2] and the
    Python workers run this interpreter (``PYSPARK_PYTHON``), so they import the same
    rocketmq_spark. Under spark-submit, the master, the workers' Python and the driver's JVM
    options are what spark-submit was given (``ci/cluster.sh``)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if not launched_by_spark_submit():
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # no "resolves to a loopback" warning
        builder = (builder.master("local[2]")
                   .config("spark.driver.extraJavaOptions", quiet_log4j_option()))
    spark = (builder.config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def produce(namesrv: str, first: int, count: int) -> float:
    """Send messages ``first .. first+count-1`` (key ``k<n>``, tag even/odd, body
    ``"message <n>"``) in batches of 100, round robin over the topic's queues; returns the
    seconds taken."""
    started = time.perf_counter()
    with Producer(namesrv) as producer:
        producer.send_many((Message(TOPIC, f"message {n:05d}".encode(),
                                    tags="even" if n % 2 == 0 else "odd", keys=f"k{n}")
                            for n in range(first, first + count)),
                           batch_size=100)  # a batch lands in one queue: spread them
    return time.perf_counter() - started


def group_offsets(namesrv: str, group: str = GROUP) -> Dict[str, Dict[str, Optional[int]]]:
    """Per queue key: the broker's max offset, the group's committed offset (None if never
    committed) and the lag between them."""
    with Admin(namesrv) as admin:
        queues: List[MessageQueue] = admin.queues(TOPIC, refresh=True)
        highs = admin.offsets("max", queues)
        done = admin.offsets("committed", queues, group=group)
    out = {}
    for mq in queues:
        for what, value in (("max", highs[mq]), ("committed", done[mq])):
            if isinstance(value, Exception):
                raise RuntimeError(f"looking up the {what} offset of {mq.key} failed: {value}")
        high, committed = highs[mq], done[mq]
        out[mq.key] = {"max": high, "committed": committed,
                       "lag": high - (committed or 0)}
    return out


def run_stream(spark, namesrv: str, checkpoint: str, sink: str, timeout: float = 120):
    """One AvailableNow run of the checkpointed query; returns (rows read, finished query)."""
    df = (spark.readStream.format("rocketmq")
          .option("nameServer", namesrv)
          .option("subscribe", TOPIC)
          .option("startingOffsets", "earliest")  # used only when the checkpoint is new
          .option("consumerGroup", GROUP)         # offsets are committed back to this group
          .load())
    query = (df.writeStream.format("parquet")
             .option("path", sink)
             .option("checkpointLocation", checkpoint)
             .trigger(availableNow=True)
             .start())
    if not query.awaitTermination(timeout):
        query.stop()
        raise RuntimeError(f"the streaming query did not finish within {timeout} s")
    if query.exception() is not None:
        raise RuntimeError(f"the streaming query failed: {query.exception()}")
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    return rows, query


def check_sink(spark, sink: str, total: int) -> dict:
    """Compare the parquet sink with the ``total`` messages sent (keys k0 .. k<total-1>)."""
    from pyspark.sql import functions as F

    out = spark.read.parquet(sink)
    number = F.expr("try_cast(substring(keys, 2) AS BIGINT)")
    stats = out.agg(
        F.count("*").alias("rows"),
        F.countDistinct("keys").alias("distinct_keys"),
        F.countDistinct(F.when(number.between(0, total - 1), number)).alias("expected_keys"),
        F.countDistinct("brokerName", "queueId", "queueOffset").alias("distinct_positions"),
    ).first()
    per_queue = {}
    for r in (out.groupBy("topic", "brokerName", "queueId")
              .agg(F.count("*").alias("rows"), F.min("queueOffset").alias("first"),
                   F.max("queueOffset").alias("last"),
                   F.countDistinct("queueOffset").alias("distinct"))
              .orderBy("topic", "brokerName", "queueId").collect()):
        per_queue[f"{r.topic}/{r.brokerName}/{r.queueId}"] = {
            "rows": r.rows, "first": r.first, "last": r.last,
            # every offset 0 .. rows-1 exactly once: no gap and no repeat within the queue
            "contiguous": r.first == 0 and r.last == r.rows - 1 and r.distinct == r.rows}
    return {"rows": stats.rows, "missing": total - stats.expected_keys,
            "duplicates": stats.rows - stats.distinct_positions,
            "unexpected": stats.distinct_keys - stats.expected_keys,
            "per_queue": per_queue}


def sample_rows(spark, sink: str, n: int = 5):
    """A few rows of the sink, body decoded as text."""
    from pyspark.sql import functions as F

    return (spark.read.parquet(sink)
            .select("topic", "brokerName", "queueId", "queueOffset", "tags", "keys",
                    F.col("body").cast("string").alias("body"), "storeTimestamp")
            .orderBy("brokerName", "queueId", "queueOffset").limit(n))


def timed(timings: Dict[str, float], name: str, fn, *args):
    """``fn(*args)``, with its wall time recorded as ``timings[name]``."""
    started = time.perf_counter()
    result = fn(*args)
    timings[name] = time.perf_counter() - started
    return result


def run(messages: int = 10_000, brokers: int = 2, queues: int = 4, more: Optional[int] = None,
        show: int = 5, spark=None) -> dict:
    """Run the whole demo and return its summary (``summary["ok"]`` says whether every check
    passed). ``more`` messages (default ``messages // 5``) are sent before the restart. A
    ``spark`` session may be passed in; otherwise one is made and stopped at the end."""
    if messages < 1:
        raise ValueError("--messages must be at least 1")
    more = max(1, messages // 5) if more is None else more
    total = messages + more
    timings: Dict[str, float] = {}
    started = time.perf_counter()
    own_spark = spark is None
    with tempfile.TemporaryDirectory(prefix="rocketmq-spark-demo-") as work, \
            EmbeddedCluster(brokers=brokers) as cluster:
        namesrv = cluster.namesrv_addr
        checkpoint, sink = os.path.join(work, "checkpoint"), os.path.join(work, "sink")
        print(f"embedded RocketMQ: name server {namesrv}, brokers "
              + ", ".join(f"{b.name}@{b.addr}" for b in cluster.brokers))
        with Admin(namesrv) as admin:
            admin.create_topic(TOPIC, queues=queues)
        print(f"topic {TOPIC}: {queues} queues on each of {brokers} broker(s)")

        timings["send 1"] = produce(namesrv, 0, messages)
        print(f"sent {messages:,} messages in {timings['send 1']:.2f} s")

        spark = timed(timings, "spark start", spark_session if own_spark else lambda: spark)
        print(f"Spark {spark.version} session ready in {timings['spark start']:.1f} s")
        try:
            rows_1, _ = timed(timings, "run 1", run_stream, spark, namesrv, checkpoint, sink)
            print(f"run 1 (AvailableNow, new checkpoint): {rows_1:,} rows "
                  f"in {timings['run 1']:.1f} s")
            lag_after_1 = group_offsets(namesrv)

            timings["send 2"] = produce(namesrv, messages, more)
            lag_before_2 = group_offsets(namesrv)
            print(f"sent {more:,} more messages; the group's lag is now "
                  f"{sum(v['lag'] for v in lag_before_2.values()):,}")

            rows_2, _ = timed(timings, "run 2", run_stream, spark, namesrv, checkpoint, sink)
            print(f"run 2 (AvailableNow, same checkpoint): {rows_2:,} rows "
                  f"in {timings['run 2']:.1f} s")
            lag_after_2 = group_offsets(namesrv)

            sink_check = timed(timings, "check", check_sink, spark, sink, total)
            if show:
                print(f"\na few rows of the parquet sink ({sink}):")
                sample_rows(spark, sink, show).show(truncate=False)
        finally:
            if own_spark:
                spark.stop()
    timings["total"] = time.perf_counter() - started
    summary = _summary([messages, more], [rows_1, rows_2], sink_check,
                       [lag_after_1, lag_before_2, lag_after_2], timings)
    print_summary(summary)
    return summary


def _summary(sent: List[int], rows: List[int], sink_check: dict, lags: List[dict],
             timings: Dict[str, float]) -> dict:
    """The demo's verdict from what its two runs read (``rows``) of what was sent (``sent``),
    the sink's check and the group's offsets (after run 1, before run 2, after run 2)."""
    (messages, more), (rows_1, rows_2) = sent, rows
    total = messages + more
    lag_after_1, lag_before_2, lag_after_2 = lags
    per_queue = {key: {"rows": sink_check["per_queue"].get(key, {}).get("rows", 0),
                       "contiguous": sink_check["per_queue"].get(key, {}).get("contiguous",
                                                                             off["max"] == 0),
                       **off}
                 for key, off in lag_after_2.items()}
    exactly_once = (sink_check["rows"] == total and sink_check["missing"] == 0
                    and sink_check["duplicates"] == 0 and sink_check["unexpected"] == 0
                    and all(q["rows"] == q["max"] and q["contiguous"]
                            for q in per_queue.values()))
    restart_ok = rows_1 == messages and rows_2 == more
    zero_lag = all(q["lag"] == 0 for q in per_queue.values()) and \
        all(q["lag"] == 0 for q in lag_after_1.values())
    summary = {
        "sent": total,
        "sent_per_run": [messages, more],
        "rows_per_run": [rows_1, rows_2],
        "sink_rows": sink_check["rows"],
        "missing": sink_check["missing"],
        "duplicates": sink_check["duplicates"],
        "unexpected": sink_check["unexpected"],
        "queues": per_queue,
        "lag_before_restart": {k: v["lag"] for k, v in lag_before_2.items()},
        "lag": {k: v["lag"] for k, v in per_queue.items()},
        "exactly_once": exactly_once,
        "restart_reads_only_new": restart_ok,
        "zero_lag": zero_lag,
        "ok": exactly_once and restart_ok and zero_lag,
        "seconds": timings,
    }
    return summary


def _verdict(ok: bool) -> str:
    return "OK  " if ok else "FAIL"


def print_summary(s: dict) -> None:
    print("\nsummary")
    print(f"  run 1: {s['rows_per_run'][0]:>8,} rows (sent {s['sent_per_run'][0]:,})")
    print(f"  run 2: {s['rows_per_run'][1]:>8,} rows (sent {s['sent_per_run'][1]:,} after run 1)")
    print(f"  sink : {s['sink_rows']:>8,} rows, sent {s['sent']:,} in all; "
          f"missing {s['missing']}, duplicates {s['duplicates']}, unexpected {s['unexpected']}")
    width = max(len(k) for k in s["queues"]) if s["queues"] else 10
    print(f"\n  {'queue':<{width}} {'rows':>7} {'max offset':>11} {'committed':>10} "
          f"{'lag':>5} {'lag before run 2':>17}")
    for key, q in s["queues"].items():
        committed = "-" if q["committed"] is None else f"{q['committed']:,}"
        print(f"  {key:<{width}} {q['rows']:>7,} {q['max']:>11,} {committed:>10} "
              f"{q['lag']:>5,} {s['lag_before_restart'].get(key, 0):>17,}")
    print(f"\n  [{_verdict(s['exactly_once'])}] exactly once: every message in the sink once, "
          "none missing, queue offsets without gaps")
    print(f"  [{_verdict(s['restart_reads_only_new'])}] the restart from the checkpoint read "
          "only the new messages")
    print(f"  [{_verdict(s['zero_lag'])}] consumer group {GROUP!r}: lag 0 on every queue "
          "after each drained run")
    print("  time: " + ", ".join(f"{k} {v:.1f} s" for k, v in s["seconds"].items()))


def main(argv: Optional[Iterable[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        description="Spark Structured Streaming reading an embedded RocketMQ, exactly once.")
    parser.add_argument("--messages", type=int, default=10_000,
                        help="messages sent before the first run (default 10,000)")
    parser.add_argument("--more", type=int, default=None,
                        help="messages sent before the restart (default messages/5)")
    parser.add_argument("--brokers", type=int, default=2, help="embedded brokers (default 2)")
    parser.add_argument("--queues", type=int, default=4,
                        help="queues of the topic on each broker (default 4)")
    parser.add_argument("--show", type=int, default=5, help="sample rows to print (default 5)")
    parser.add_argument("--json", metavar="PATH",
                        help="also write the summary to PATH as JSON (for scripts and tests)")
    args = parser.parse_args(None if argv is None else list(argv))
    for name in ("messages", "brokers", "queues"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.more is not None and args.more < 1:
        parser.error("--more must be at least 1")
    summary = run(args.messages, args.brokers, args.queues, more=args.more, show=args.show)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    if not summary["ok"]:
        print("\nDEMO FAILED: see the checks above", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
