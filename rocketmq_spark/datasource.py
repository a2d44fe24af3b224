"""The ``rocketmq`` data source: options in, readers and writers out.

The one module that knows both sides: :mod:`.source` (reads) and :mod:`.sink` (writes) do
not import each other."""
from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource, DataSourceReader, DataSourceStreamReader, DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from . import spark_compat
from .options import boolean
from .source.options import parse_source_options
from .source.schema import check_user_schema, spark_schema


class RocketMQDataSource(DataSource):
    """``spark.read`` / ``spark.readStream`` and ``df.write`` / ``df.writeStream`` with
    ``format("rocketmq")``.

    Options are checked when a reader or writer is made, before anything connects; a bad
    option (or, for writes, a bad input column) fails the query at once with an error that
    names it. On a Spark older than 4.2 the first reader or writer of a process logs what
    that Spark changes (:func:`.spark_compat.announce`).
    """

    @classmethod
    def name(cls) -> str:
        return "rocketmq"

    def schema(self) -> StructType:
        return spark_schema(self._include_properties())

    def _include_properties(self) -> bool:
        return boolean("includeProperties", self.options.get("includeProperties", "false"))

    def reader(self, schema: StructType) -> DataSourceReader:
        from .source.batch_reader import batch_reader

        check_user_schema(schema, self._include_properties())
        spark_compat.announce()
        return batch_reader(parse_source_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from .source.stream_reader import RocketMQStreamReader

        check_user_schema(schema, self._include_properties())
        options = parse_source_options(self.options, streaming=True)
        spark_compat.announce(options.max_messages_per_trigger)
        return RocketMQStreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from .sink.writer import batch_writer

        spark_compat.announce()
        return batch_writer(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .sink.writer import stream_writer

        spark_compat.announce()
        return stream_writer(self.options, schema, overwrite)
