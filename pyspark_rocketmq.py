"""Lets ``spark.read.format("rocketmq")`` work right after ``pip install``: PySpark registers
the ``DefaultSource`` of every top-level module whose name starts with ``pyspark_``."""
from rocketmq_spark.datasource import RocketMQDataSource as DefaultSource

__all__ = ["DefaultSource"]
