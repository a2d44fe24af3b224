"""A read-transform-write Spark pipeline in a process of its own, for the sink's fault tests.

One checkpointed query reads ``--source`` with the rocketmq source (from the earliest offset),
upper-cases each body, keeps keys and tags, adds a ``src`` property naming the input message
(``topic/broker/queue/offset``) and writes to ``--sink`` with the rocketmq sink.

``--mode run`` runs it (``processingTime=0``) until ``--stop-file`` appears, then drains what is
left with Trigger.AvailableNow and exits 0; ``--mode drain`` only drains. Progress goes to
stdout as one JSON object per line, starting with ``{"event": "ready", "jvm_pid": ...}``; a
failed query prints ``{"event": "failed", ...}`` and exits 3.

``--guarantee`` sets the sink's ``deliveryGuarantee`` (not set: the sink's default).
``--kill-at POINT:BATCH`` SIGKILLs the driver JVM at POINT of micro-batch BATCH's exactly-once
commit (``after_record``: the batch is recorded as committed, no END_TRANSACTION sent yet;
``mid_end``: half of them sent; ``after_commit``: all sent, Spark's commit log not written).
The hooks are this script's: it registers :func:`kill_hooks_source`, the rocketmq data source
whose stream writer carries a :class:`rocketmq_spark.sink.exactly_once.CommitObserver` that
kills, under the name ``rocketmq_kill_hooks``, and writes with it (the observer travels pickled
to the Python worker that runs the driver-side commit). Each point fires once per checkpoint.
``--task-max-failures N`` runs ``local[2,N]`` so that a failed task is run again instead of
failing the query (``local[2]`` never retries a task).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from app_process import app_session, emit

KILL_POINTS = ("after_record", "mid_end", "after_commit")
KILL_HOOKS_FORMAT = "rocketmq_kill_hooks"


def kill_hooks_source(kill_at: str):
    """The rocketmq data source, named ``rocketmq_kill_hooks``, whose exactly-once commits
    SIGKILL the driver JVM at ``kill_at`` (``POINT:BATCH``, several separated by commas). Made
    here, in ``__main__``, so that cloudpickle ships its code to Spark's Python workers."""
    import logging
    import signal

    from rocketmq_spark.datasource import RocketMQDataSource
    from rocketmq_spark.sink.exactly_once import CommitObserver, driver_jvm_pid
    from rocketmq_spark.sink.writer import stream_writer

    wanted = frozenset(s.strip() for s in kill_at.split(",") if s.strip())
    unknown = [w for w in wanted if w.partition(":")[0] not in KILL_POINTS]
    if unknown:
        raise SystemExit(f"--kill-at: unknown point(s) {unknown}; use {KILL_POINTS}")

    class DriverKiller(CommitObserver):
        """SIGKILLs the driver JVM (and this worker) at the wanted points, once each."""

        def recorded(self, commit_log, batch_id):
            self._kill_at(commit_log, "after_record", batch_id)

        def send_end_transactions(self, send, handles, commit_log, batch_id):
            if f"mid_end:{batch_id}" not in wanted:
                return send(handles)
            half = len(handles) // 2
            sent = send(handles[:half])
            self._kill_at(commit_log, "mid_end", batch_id)
            return sent + send(handles[half:])

        def committed(self, commit_log, batch_id):
            self._kill_at(commit_log, "after_commit", batch_id)

        @staticmethod
        def _kill_at(commit_log, point, batch_id):
            if f"{point}:{batch_id}" not in wanted:
                return
            marker = f"kill-fired/{point}-{batch_id}"  # in the record, on whatever store
            if commit_log.store.read(marker) is not None:
                return
            commit_log.store.write(marker, str(time.time()).encode())
            jvm = driver_jvm_pid()
            logging.getLogger("sink_pipeline").warning(
                "test hook: killing the driver JVM %s at %s of batch %d", jvm, point, batch_id)
            if jvm is not None:
                os.kill(jvm, signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)

    class RocketMQWithKillHooks(RocketMQDataSource):
        @classmethod
        def name(cls) -> str:
            return KILL_HOOKS_FORMAT

        def streamWriter(self, schema, overwrite):
            return stream_writer(self.options, schema, overwrite, observer=DriverKiller())

    return RocketMQWithKillHooks


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

    master = f"local[2,{args.task_max_failures}]" if args.task_max_failures else "local[2]"
    spark = app_session(master, "rocketmq-sink-pipeline")
    sink_format = "rocketmq"
    if args.kill_at:
        spark.dataSource.register(kill_hooks_source(args.kill_at))
        sink_format = KILL_HOOKS_FORMAT
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
        writer = (out.writeStream.format(sink_format).option("nameServer", args.namesrv)
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
