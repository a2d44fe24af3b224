"""A read-transform-write Spark pipeline in a process of its own, for the sink's fault tests.

One checkpointed query reads ``--source`` with the rocketmq source (from the earliest offset),
upper-cases each body, keeps keys and tags, adds a ``src`` property naming the input message
(``topic/broker/queue/offset``) and writes to ``--sink`` with the rocketmq sink.

``--mode run`` runs it (``processingTime=0``) until ``--stop-file`` appears, then drains what is
left with Trigger.AvailableNow and exits 0; ``--mode drain`` only drains. Progress goes to
stdout as one JSON object per line, starting with ``{"event": "ready", "jvm_pid": ...}``; a
failed query prints ``{"event": "failed", ...}`` and exits 3.

``--guarantee`` sets the sink's ``deliveryGuarantee`` (not set: the sink's default).
``--kill-at POINT:BATCH`` asks the exactly-once sink's test hook to SIGKILL the driver JVM at
POINT of micro-batch BATCH (``after_record``: the batch is recorded as committed, no
END_TRANSACTION sent yet; ``mid_end``: half of them sent; ``after_commit``: all sent, Spark's
commit log not written), through ``ROCKETMQ_SPARK_SINK_KILL``, which the sink's commit reads
(the JVM and its Python workers inherit this process's environment; see
docs/notes/transactions-sink.md). Each point fires once per checkpoint. ``--task-max-failures N`` runs ``local[2,N]`` so that a failed
task is run again instead of failing the query (``local[2]`` never retries a task).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

KILL_HOOK_ENV = "ROCKETMQ_SPARK_SINK_KILL"  # the exactly-once sink's test hook


def emit(**event) -> None:
    print(json.dumps(event), flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--namesrv", required=True)
    p.add_argument("--source", required=True)
    p.add_argument("--sink", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--mode", choices=("run", "drain"), default="run")
    p.add_argument("--stop-file")
    p.add_argument("--max-per-trigger", type=int, default=0)
    p.add_argument("--sink-option", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--guarantee", choices=("atLeastOnce", "exactlyOnce"))
    p.add_argument("--kill-at", metavar="POINT:BATCH")
    p.add_argument("--task-max-failures", type=int, default=0)
    args = p.parse_args()
    if args.kill_at:
        os.environ[KILL_HOOK_ENV] = args.kill_at

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    master = f"local[2,{args.task_max_failures}]" if args.task_max_failures else "local[2]"
    spark = (SparkSession.builder.master(master).appName("rocketmq-sink-pipeline")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.streaming.stopTimeout", "60s")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    jvm_pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    emit(event="ready", pid=os.getpid(), jvm_pid=jvm_pid)

    def start(available_now: bool):
        reader = (spark.readStream.format("rocketmq").option("nameServer", args.namesrv)
                  .option("subscribe", args.source).option("startingOffsets", "earliest"))
        if args.max_per_trigger:
            reader = reader.option("maxMessagesPerTrigger", str(args.max_per_trigger))
        out = reader.load().selectExpr(
            "upper(CAST(body AS STRING)) AS body", "keys", "tags",
            "map('src', concat_ws('/', topic, brokerName, CAST(queueId AS STRING), "
            "CAST(queueOffset AS STRING))) AS properties")
        writer = (out.writeStream.format("rocketmq").option("nameServer", args.namesrv)
                  .option("topic", args.sink)
                  .option("checkpointLocation", os.path.join(args.work, "cp")))
        if args.guarantee:
            writer = writer.option("deliveryGuarantee", args.guarantee)
        for item in args.sink_option:
            key, _, value = item.partition("=")
            writer = writer.option(key, value)
        trigger = {"availableNow": True} if available_now else {"processingTime": "0 seconds"}
        return writer.trigger(**trigger).start()

    def watch(query, until) -> bool:
        seen = None
        while not until():
            if query.exception() is not None:
                emit(event="failed", error=str(query.exception())[:4000])
                return False
            last = query.lastProgress
            if last and seen != last["batchId"]:
                seen = last["batchId"]
                emit(event="progress", batch=last["batchId"], rows=last["numInputRows"])
            time.sleep(0.1)
        return True

    if args.mode == "run":
        query = start(available_now=False)
        if not watch(query, lambda: os.path.exists(args.stop_file)):
            return 3
        query.stop()
    query = start(available_now=True)
    if not watch(query, lambda: not query.isActive):
        return 3
    if query.exception() is not None:
        emit(event="failed", error=str(query.exception())[:4000])
        return 3
    emit(event="drained")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
