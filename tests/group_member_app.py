"""A Spark application that is one member of a RocketMQ consumer group, in a process (and JVM)
of its own, for the tests and benchmarks that kill a member.

It runs one streaming query (``membership=group``) from ``--topic`` into a parquet sink under
``--work`` (``<name>-out``, checkpoint ``<name>-cp``) with the default trigger, until
``--stop-file`` appears (then it stops the query cleanly and exits 0). Progress goes to stdout
as JSON lines, starting with ``{"event": "ready", "pid": ..., "jvm_pid": ...}``; a failed query
prints ``{"event": "failed", ...}`` and exits 3.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from app_process import app_session, emit


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--namesrv", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--stop-file", required=True)
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args()

    spark = app_session("local[2]", f"rocketmq-member-{args.name}",
                        {"spark.driver.memory": "768m"})
    jvm_pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    reader = (spark.readStream.format("rocketmq").option("nameServer", args.namesrv)
              .option("subscribe", args.topic).option("consumerGroup", args.group)
              .option("membership", "group").option("memberName", args.name)
              .option("startingOffsets", "earliest"))
    for item in args.option:
        key, _, value = item.partition("=")
        reader = reader.option(key, value)
    query = (reader.load().select("topic", "brokerName", "queueId", "queueOffset", "keys")
             .writeStream.format("parquet")
             .option("path", os.path.join(args.work, f"{args.name}-out"))
             .option("checkpointLocation", os.path.join(args.work, f"{args.name}-cp"))
             .start())
    emit(event="ready", pid=os.getpid(), jvm_pid=jvm_pid)
    seen = None
    while not os.path.exists(args.stop_file):
        if query.exception() is not None:
            emit(event="failed", error=str(query.exception())[:4000])
            return 3
        last = query.lastProgress
        if last and last["batchId"] != seen:
            seen = last["batchId"]
            emit(event="progress", batch=seen, rows=last["numInputRows"])
        time.sleep(0.1)
    query.stop()
    emit(event="stopped")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
