"""A Spark pipeline in a process of its own, for the fault tests to kill, restart and audit.

Two checkpointed queries read the same RocketMQ topics into exactly-once sinks under ``--work``:

* ``file``: Spark's file sink (parquet; its ``_spark_metadata`` log makes it exactly-once);
* ``batches``: ``foreachBatch`` writing each micro-batch to ``batches/batch=<id>`` with mode
  overwrite, so a replayed batch id replaces its own output (idempotent by batch id).

``--mode run`` keeps both queries running (``processingTime=0``) until ``--stop-file`` appears,
then drains what is left with Trigger.AvailableNow and exits 0. ``--mode drain`` only drains.
A failed query prints ``{"event": "failed", ...}`` and exits 3. Progress goes to stdout as one
JSON object per line, starting with ``{"event": "ready", "jvm_pid": ..., "pid": ...}``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from app_process import app_session, emit
from waiting import wait_until


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--namesrv", required=True)
    p.add_argument("--topics", required=True, help="comma list")
    p.add_argument("--work", required=True)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--mode", choices=("run", "drain"), default="run")
    p.add_argument("--stop-file")
    p.add_argument("--max-per-trigger", type=int, default=0)
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args()

    conf = {"spark.executor.memory": "768m"}
    conf.update(item.partition("=")[::2] for item in args.conf)
    spark = app_session(args.master, "rocketmq-fault-pipeline", conf)
    jvm_pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()

    def executors() -> int:
        return spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1

    if args.master.startswith("local-cluster"):  # its executors register after the start
        wait_until(lambda: executors() >= 2, 60, "the local-cluster executors to register")
    emit(event="ready", pid=os.getpid(), jvm_pid=jvm_pid, master=spark.sparkContext.master,
         executors=executors())

    def source():
        reader = (spark.readStream.format("rocketmq").option("nameServer", args.namesrv)
                  .option("subscribe", args.topics).option("startingOffsets", "earliest"))
        if args.max_per_trigger:
            reader = reader.option("maxMessagesPerTrigger", str(args.max_per_trigger))
        for item in args.option:
            key, _, value = item.partition("=")
            reader = reader.option(key, value)
        return reader.load().select("topic", "brokerName", "queueId", "queueOffset", "keys",
                                    "body", "msgId")

    batches_dir = os.path.join(args.work, "batches")

    def write_batch(batch, batch_id):
        batch.write.mode("overwrite").parquet(os.path.join(batches_dir, f"batch={batch_id:09d}"))

    def sources_initialised(query) -> None:
        """Wait until ``query`` has built its sources. Spark 4.x's Python streaming source runner
        writes into a map shared by every query on the same Python data source, with no lock;
        two queries initialising at the same instant can corrupt it, and every later task then
        fails to serialize ("Illegal size 5 of collection, expected 7")."""
        wait_until(lambda: not query.isActive
                   or not query.status["message"].startswith("Initializing"), 120,
                   "the query's sources to be built")

    def start(available_now: bool):
        trigger = {"availableNow": True} if available_now else {"processingTime": "0 seconds"}
        file_query = (source().writeStream.format("parquet")
                      .option("path", os.path.join(args.work, "file"))
                      .option("checkpointLocation", os.path.join(args.work, "cp-file"))
                      .trigger(**trigger).start())
        sources_initialised(file_query)
        batch_query = (source().writeStream.foreachBatch(write_batch)
                       .option("checkpointLocation", os.path.join(args.work, "cp-batches"))
                       .trigger(**trigger).start())
        return [file_query, batch_query]

    def watch(queries, until) -> bool:
        """Report progress until ``until()``; False when a query failed."""
        seen = {}
        while not until():
            for name, q in zip(("file", "batches"), queries):
                if q.exception() is not None:
                    emit(event="failed", query=name, error=str(q.exception())[:4000])
                    return False
                last = q.lastProgress
                if last and seen.get(name) != last["batchId"]:
                    seen[name] = last["batchId"]
                    emit(event="progress", query=name, batch=last["batchId"],
                         rows=last["numInputRows"])
            time.sleep(0.2)
        return True

    if args.mode == "run":
        queries = start(available_now=False)
        if not watch(queries, lambda: os.path.exists(args.stop_file)):
            return 3
        for q in queries:
            q.stop()
    queries = start(available_now=True)
    if not watch(queries, lambda: not any(q.isActive for q in queries)):
        return 3
    for name, q in zip(("file", "batches"), queries):
        if q.exception() is not None:
            emit(event="failed", query=name, error=str(q.exception())[:4000])
            return 3
    emit(event="drained")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
