"""The Spark session and process environment the Spark benchmarks share (ci/bench_spark.py,
ci/bench_sink.py, ci/bench_memory.py, ci/bench_spark_versions.py).

Importing this module puts the checkout and ci/ on ``sys.path`` and on the ``PYTHONPATH``
Spark's Python workers inherit (they import ci/bench_sources.py: its classes are pickled by
reference), and runs the workers with this interpreter.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CI = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(CI))
# Spark's Python workers import bench_sources (classes are pickled by reference).
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(CI), str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


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
