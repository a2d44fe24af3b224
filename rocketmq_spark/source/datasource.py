"""The ``rocketmq`` data source: options in, readers out."""
from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
from pyspark.sql.types import StructType

from .schema import spark_schema
from .options import parse_options


class RocketMQDataSource(DataSource):
    """``spark.read.format("rocketmq")`` and ``spark.readStream.format("rocketmq")``.

    Options are checked when a reader is made, before anything connects; a bad option fails
    the query at once with an error that names it.
    """

    @classmethod
    def name(cls) -> str:
        return "rocketmq"

    def schema(self) -> StructType:
        include = str(self.options.get("includeProperties", "false")).strip().lower() == "true"
        return spark_schema(include)

    def reader(self, schema: StructType) -> DataSourceReader:
        from .batch_reader import RocketMQBatchReader

        return RocketMQBatchReader(parse_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from .stream_reader import RocketMQStreamReader

        return RocketMQStreamReader(parse_options(self.options, streaming=True))
