#!/usr/bin/env python
"""The connector on older Spark against the newest, same machine, same run.

For each Spark (``--spark``, default ``4.3,4.0``: 4.3 is the project venv ``.venv``, 4.0 and
4.1 the venvs of ci/compat.sh, made first with ``ci/compat.sh 4.0 --co -q``), in turn:

1. Read rate: ci/bench_spark.py's read case (``bench_read`` of ci/bench_spark_read.py:
   ``spark.read.format("rocketmq")`` of ``--messages`` messages of 100 B in 4 queues from an
   embedded broker into ``noop``, median of ``--runs`` timed rounds after ``--warmup-rounds``,
   beside a Python source yielding prebuilt Arrow batches, the Python ceiling, which shows
   what the Spark version itself changes), run by this file in that venv (``--read-worker``):
   with its own session setup, since Spark 4.0 refuses to register a data source its own
   lookup found (bench_session.make_spark registers ``rocketmq``).
2. Stream sink rate: this file again in that venv (``--sink-worker``): ``--sink-rows`` rows
   (``body`` of 100 B, ``keys``) in a parquet folder, read with ``readStream.parquet`` and
   written with ``writeStream.format("rocketmq")`` under Trigger.AvailableNow into an
   embedded broker; rows / wall time of the query, median of ``--runs``. Two writers: ours
   (Arrow batches in: ``DataSourceStreamArrowWriter`` on 4.1+, ``DataSourceArrowWriter`` on
   4.0) and a row writer (:class:`RowFedWriter`: a ``DataSourceStreamWriter``, so Spark hands
   it ``Row`` objects, which it turns back into Arrow batches for our task code): what a
   fallback to Spark's row writer would cost.

Prints a table and the ratios old/new; ``--json PATH`` keeps everything. Run:
``.venv/bin/python ci/bench_spark_versions.py [--spark 4.3,4.0,4.1] [--messages N]``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CI = Path(__file__).resolve().parent
VENVS = {"4.3": ROOT / ".venv", "4.2": ROOT / ".venv-spark4.2", "4.1": ROOT / ".venv-spark4.1",
         "4.0": ROOT / ".venv-spark4.0"}


# ------------------------------------------------------------------ sink worker (in a venv)

def _row_fed_source():
    """The rocketmq data source whose stream writer is fed rows (made here, so cloudpickle
    ships it to the workers by value)."""
    import pyarrow as pa
    from pyspark.sql.datasource import DataSourceStreamWriter

    from rocketmq_spark.datasource import RocketMQDataSource
    from rocketmq_spark.sink.writer import stream_writer

    class RowFedWriter(DataSourceStreamWriter):
        """Spark gives a plain stream writer ``Row`` objects; they go back into Arrow batches
        of 10,000 rows (binary and string columns) for our task code."""

        def __init__(self, inner, names):
            self.inner, self.names = inner, names

        def write(self, iterator):
            def batches():
                chunk = []
                for row in iterator:
                    chunk.append(row)
                    if len(chunk) == 10_000:
                        yield to_batch(chunk)
                        chunk = []
                if chunk:
                    yield to_batch(chunk)

            def to_batch(rows):
                body = pa.array([bytes(r[0]) for r in rows], pa.binary())
                keys = pa.array([r[1] for r in rows], pa.string())
                return pa.RecordBatch.from_arrays([body, keys], names=self.names)

            return self.inner.write(batches())

        def commit(self, messages, batchId):
            self.inner.commit(messages, batchId)

        def abort(self, messages, batchId):
            self.inner.abort(messages, batchId)

    class RowFedRocketMQ(RocketMQDataSource):
        @classmethod
        def name(cls) -> str:
            return "rocketmq_row_fed"

        def streamWriter(self, schema, overwrite):
            return RowFedWriter(stream_writer(self.options, schema, overwrite), schema.names)

    return RowFedRocketMQ


def _session():
    """bench_session.make_spark's session, in this venv (``rocketmq`` registered only where
    Spark's own lookup did not find it: Spark 4.0 refuses the second registration)."""
    sys.path.insert(0, str(CI))
    import bench_session  # noqa: F401  (sets PYTHONPATH and PYSPARK_PYTHON for the workers)
    from pyspark.sql import SparkSession

    from rocketmq_spark.datasource import RocketMQDataSource
    from rocketmq_spark.spark_compat import register_data_source

    spark = (SparkSession.builder.master("local[2]").appName("rocketmq-spark-bench")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.log.level", "ERROR").config("spark.driver.memory", "4g")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.streaming.stopTimeout", "30s")
             .config("spark.sql.streaming.numRecentProgressUpdates", "10000").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register_data_source(spark, RocketMQDataSource)
    return spark


def read_worker(args) -> dict:
    spark = _session()
    from bench_processes import start_server, stop_server
    from bench_spark_read import READ_TOPIC, bench_read
    from bench_sources import PrebuiltArrowSource

    import pyspark

    tmp = tempfile.mkdtemp(prefix="bench-versions-")
    server, namesrv = start_server(
        "--topic", f"{READ_TOPIC}:4", "--fill", f"{READ_TOPIC}:{args.messages}:100")
    try:
        spark.dataSource.register(PrebuiltArrowSource)
        options = argparse.Namespace(messages=args.messages, size=100, queues=4,
                                     runs=args.runs, warmup_rounds=args.warmup_rounds,
                                     pull_batch_size=32, read_option=[])
        read = bench_read(spark, namesrv, server.pid, options, tmp)
        cases = read["cases"]
        return {"spark": pyspark.__version__,
                "ours_rows_per_s": cases["ours"]["rows_per_s"],
                "python_ceiling_rows_per_s": cases["python_ceiling"]["rows_per_s"],
                "ours_cpu_per_1M_rows": cases["ours"]["cpu_per_1M_rows"],
                "other_cpu_per_run": read["other_cpu_per_run"]}
    finally:
        spark.stop()
        stop_server(server)
        shutil.rmtree(tmp, ignore_errors=True)


def sink_worker(args) -> dict:
    spark = _session()
    from bench_processes import cpu_delta, cpu_snapshot, start_server, stop_server

    import pyspark

    tmp = Path(tempfile.mkdtemp(prefix="bench-versions-"))
    server, namesrv = start_server("--topic", "BenchSinkIn:4")
    try:
        spark.dataSource.register(_row_fed_source())
        data = str(tmp / "in")
        spark.range(args.sink_rows, numPartitions=4).selectExpr(
            "CAST(lpad(CAST(id AS STRING), 100, 'x') AS BINARY) AS body",
            "CAST(id AS STRING) AS keys").write.parquet(data)
        schema = spark.read.parquet(data).schema
        times = {"arrow": [], "rows": []}
        cpu = {"arrow": [], "rows": []}  # server + JVM + Python workers, per run
        for round_no in range(args.warmup_rounds + args.runs):
            for case, fmt in (("arrow", "rocketmq"), ("rows", "rocketmq_row_fed")):
                topic = f"BenchSink{case}{round_no}"
                checkpoint = str(tmp / f"cp-{case}-{round_no}")
                before = cpu_snapshot(server.pid)
                started = time.monotonic()
                query = (spark.readStream.schema(schema).parquet(data).writeStream.format(fmt)
                         .option("nameServer", namesrv).option("topic", topic)
                         .option("checkpointLocation", checkpoint)
                         .trigger(availableNow=True).start())
                query.awaitTermination()
                seconds = time.monotonic() - started
                used = cpu_delta(before, cpu_snapshot(server.pid))
                if query.exception() is not None:
                    raise SystemExit(f"{case}: {query.exception()}")
                rows = sum(p["numInputRows"] for p in query.recentProgress)
                if rows != args.sink_rows:
                    raise SystemExit(f"{case}: {rows} rows written, expected {args.sink_rows}")
                print(f"  spark {pyspark.__version__} sink {case:5} round {round_no}: "
                      f"{seconds:6.2f} s {rows / seconds:>10,.0f} rows/s  cpu {used}",
                      file=sys.stderr, flush=True)
                if round_no >= args.warmup_rounds:
                    times[case].append(seconds)
                    cpu[case].append(sum(used[k] for k in ("server", "jvm", "python_workers")))
        return {"spark": pyspark.__version__, "rows": args.sink_rows,
                "rows_per_s": {c: args.sink_rows / statistics.median(t)
                               for c, t in times.items()},
                "cpu_per_1M_rows": {c: statistics.median(v) * 1e6 / args.sink_rows
                                    for c, v in cpu.items()},
                "seconds": times}
    finally:
        spark.stop()
        stop_server(server)
        shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------ driver (project venv)

def run_worker(python: Path, mode: str, args, tmp: Path, label: str) -> dict:
    out = tmp / f"{mode}-{label}.json"
    subprocess.run([str(python), __file__, f"--{mode}-worker", "--messages", str(args.messages),
                    "--sink-rows", str(args.sink_rows), "--runs", str(args.runs),
                    "--warmup-rounds", str(args.warmup_rounds), "--json", str(out)],
                   check=True, cwd=ROOT, stdout=sys.stderr)
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spark", default="4.3,4.0", help="comma-separated minors")
    parser.add_argument("--messages", type=int, default=500_000)
    parser.add_argument("--sink-rows", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warmup-rounds", type=int, default=2)
    parser.add_argument("--skip", action="append", default=[], choices=("read", "sink"))
    parser.add_argument("--read-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sink-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.read_worker or args.sink_worker:
        result = read_worker(args) if args.read_worker else sink_worker(args)
        args.json.write_text(json.dumps(result, indent=2))
        return

    minors = [m.strip() for m in args.spark.split(",") if m.strip()]
    for minor in minors:
        python = VENVS.get(minor, Path("-")) / "bin" / "python"
        if not python.exists():
            raise SystemExit(f"no venv for Spark {minor} at {python.parent.parent}: run "
                             f"ci/compat.sh {minor} --co -q first")
    tmp = Path(tempfile.mkdtemp(prefix="bench-versions-"))
    results = {"args": vars(args) | {"json": str(args.json) if args.json else None},
               "cpu_count": os.cpu_count(), "by_spark": {}}
    try:
        for minor in minors:
            python = VENVS[minor] / "bin" / "python"
            entry = results["by_spark"][minor] = {}
            if "read" not in args.skip:
                print(f"read, Spark {minor}", file=sys.stderr, flush=True)
                entry["read"] = run_worker(python, "read", args, tmp, minor)
            if "sink" not in args.skip:
                print(f"sink, Spark {minor}", file=sys.stderr, flush=True)
                entry["sink"] = run_worker(python, "sink", args, tmp, minor)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    newest = results["by_spark"][minors[0]]
    print("| Spark | read rows/s (ours) | read CPU s/1M rows | read, prebuilt-Arrow ceiling "
          "| sink rows/s (Arrow in) | sink CPU s/1M rows | sink rows/s (row writer) "
          "| row writer CPU s/1M rows |")
    print("|---|---|---|---|---|---|---|---|")
    for minor in minors:
        e = results["by_spark"][minor]
        read, sink = e.get("read", {}), e.get("sink", {})
        rate, sink_cpu = sink.get("rows_per_s", {}), sink.get("cpu_per_1M_rows", {})
        print(f"| {read.get('spark') or sink.get('spark') or minor} "
              f"| {read.get('ours_rows_per_s', 0):,.0f} "
              f"| {read.get('ours_cpu_per_1M_rows', 0):.2f} "
              f"| {read.get('python_ceiling_rows_per_s', 0):,.0f} "
              f"| {rate.get('arrow', 0):,.0f} | {sink_cpu.get('arrow', 0):.2f} "
              f"| {rate.get('rows', 0):,.0f} | {sink_cpu.get('rows', 0):.2f} |")
    for minor in minors[1:]:
        e = results["by_spark"][minor]
        if "read" in e and "read" in newest:
            ratio = e["read"]["ours_rows_per_s"] / newest["read"]["ours_rows_per_s"]
            results.setdefault("ratios", {})[f"read {minor}/{minors[0]}"] = ratio
            print(f"read rate, Spark {minor} / Spark {minors[0]}: {ratio:.2f}")
            cpu = newest["read"]["ours_cpu_per_1M_rows"] / e["read"]["ours_cpu_per_1M_rows"]
            results["ratios"][f"read CPU {minors[0]}/{minor}"] = cpu
            print(f"read CPU per row, Spark {minors[0]} / Spark {minor}: {cpu:.2f} (the rate "
                  "ratio to expect on an idle machine)")
        if "sink" in e and "sink" in newest:
            ratio = e["sink"]["rows_per_s"]["arrow"] / newest["sink"]["rows_per_s"]["arrow"]
            results.setdefault("ratios", {})[f"sink {minor}/{minors[0]}"] = ratio
            print(f"sink rate, Spark {minor} / Spark {minors[0]}: {ratio:.2f}")
    for minor in minors:
        sink = results["by_spark"][minor].get("sink")
        if sink:
            ratio = sink["rows_per_s"]["rows"] / sink["rows_per_s"]["arrow"]
            cpu = sink["cpu_per_1M_rows"]["arrow"] / sink["cpu_per_1M_rows"]["rows"]
            print(f"row writer / Arrow writer, Spark {minor}: rate {ratio:.2f}, CPU per row "
                  f"(Arrow / row) {cpu:.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
