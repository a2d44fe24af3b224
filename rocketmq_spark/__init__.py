"""rocketmq-spark: the Apache RocketMQ connector for Spark Structured Streaming."""

__version__ = "0.1.0"
