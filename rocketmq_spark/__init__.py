"""rocketmq-spark: the Apache RocketMQ connector for Spark Structured Streaming."""

__version__ = "0.1.0"


def register(spark) -> None:
    """Register the ``rocketmq`` data source with a SparkSession (needed only where the
    ``pyspark_rocketmq`` module is not importable, e.g. when the code ships as a zip)."""
    from .source.datasource import RocketMQDataSource

    spark.dataSource.register(RocketMQDataSource)
