"""Lets ``spark.read.format("rocketmq")`` work right after ``pip install``: PySpark registers
the ``DefaultSource`` of every top-level module whose name starts with ``pyspark_`` (on Spark
Connect, the server's PySpark, once per server process; see docs/spark-connect.md)."""
from rocketmq_spark.datasource import RocketMQDataSource as DefaultSource

__all__ = ["DefaultSource"]
