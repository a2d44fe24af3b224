"""rocketmq-spark: the Apache RocketMQ connector for Spark Structured Streaming."""

from .client.version import __version__

__all__ = ["RocketMQLagListener", "__version__", "register"]


def __getattr__(name):
    if name == "RocketMQLagListener":  # imports pyspark: only when asked for
        from .source.lag import RocketMQLagListener

        return RocketMQLagListener
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register(spark) -> None:
    """Register the ``rocketmq`` data source with a SparkSession (needed only where the
    ``pyspark_rocketmq`` module is not importable, e.g. when the code ships as a zip)."""
    from .datasource import RocketMQDataSource
    from .spark_compat import register_data_source

    register_data_source(spark, RocketMQDataSource)
