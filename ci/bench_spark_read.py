"""Part 1 of ci/bench_spark.py, the read rate: our batch read into Spark's ``noop`` sink
against (a) a Python source replaying one of our Arrow batches and (b) the JVM's
``spark.range`` with the same columns (ci/bench_spark.py's docstring has the definitions).
"""
from __future__ import annotations

import os
import statistics
import time
from typing import Dict, List

from bench_processes import cpu_delta, cpu_snapshot

READ_TOPIC = "BenchSpark"


def ok(good: bool) -> str:
    return "✔" if good else "✘"


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
        "queueTopic": F.lit(READ_TOPIC),
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
