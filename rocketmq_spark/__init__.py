"""rocketmq-spark: the Apache RocketMQ connector for Spark Structured Streaming."""

from .client.version import __version__

__all__ = ["RocketMQLagListener", "__version__", "register"]


def __getattr__(name):
    if name == "RocketMQLagListener":  # imports pyspark: only when asked for
        from .source.lag import RocketMQLagListener

        return RocketMQLagListener
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register(spark) -> None:
    """Register the ``rocketmq`` data source with a SparkSession, classic or Spark Connect.

    Needed where the Spark that plans the query does not discover the ``pyspark_rocketmq``
    module by itself: a Spark Connect server whose Python lacks it (the package reached its
    workers some other way, or was installed after the server started looking), code shipped
    as a zip. On Spark Connect the registration holds for this client session only, and the
    server's Python workers must import ``rocketmq_spark`` (the class is sent by name)."""
    if getattr(spark, "dataSource", None) is None:
        raise TypeError("rocketmq_spark.register() needs a SparkSession (classic or Spark "
                        f"Connect), got {type(spark).__name__}")
    from .datasource import RocketMQDataSource
    from .spark_compat import register_data_source

    register_data_source(spark, RocketMQDataSource)
