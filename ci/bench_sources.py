"""Reference Python data sources for ci/bench_spark.py (nothing here talks to RocketMQ).

* :class:`PrebuiltArrowSource` (``bench_prebuilt``), a batch source: ``partitions`` partitions
  that together yield ``rows`` rows, each partition yielding one prebuilt ``pyarrow``
  RecordBatch over and over (the last one sliced). The batch is read once per Python worker
  from the Arrow IPC file named by the ``path`` option, so it can be a real batch of the
  rocketmq source's own output (same schema, same column contents and batch size). Nothing
  is computed per row: this is the ceiling Spark sets for a Python source of that schema.
* :class:`OneRowStreamSource` (``bench_one_row``), a stream source (admission-control
  signature, like ours) whose every micro-batch is one row in one partition, so its
  ``triggerExecution`` is the fixed cost of a Python micro-batch. Option ``batches``: stop
  offering rows after that many (the query then idles and stops cleanly).

* :class:`FileStreamSource` (``bench_file_stream``), a stream source over a local file of
  fixed-width records (``RECORD`` bytes: the send time in epoch ms, 15 digits, newline) that a
  producer appends to. Offsets ``{"pos": records}``, one partition per micro-batch, each
  record one row (``keys`` = its index, ``bornTimestamp`` = its send time). A zero-cost
  transport: its latency is what Spark's micro-batches alone impose on a Python source.

All use :func:`rocketmq_spark.source.arrow.spark_schema` and yield RecordBatches of
:func:`~rocketmq_spark.source.arrow.arrow_schema`, like the rocketmq source.
"""
from __future__ import annotations

import os
from typing import Dict, Iterator, List

import pyarrow as pa
from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader,
                                    InputPartition)
from pyspark.sql.types import StructType

from rocketmq_spark.source.arrow import arrow_schema, spark_schema

_BATCHES: Dict[str, pa.RecordBatch] = {}


def load_batch(path: str) -> pa.RecordBatch:
    """The single RecordBatch in the Arrow IPC stream file ``path`` (cached per process)."""
    batch = _BATCHES.get(path)
    if batch is None:
        with pa.OSFile(path, "rb") as f:
            batches = list(pa.ipc.open_stream(f))
        if len(batches) != 1 or batches[0].schema != arrow_schema():
            raise ValueError(f"{path} must hold one RecordBatch of the rocketmq schema")
        batch = _BATCHES[path] = batches[0]
    return batch


def save_batch(batch: pa.RecordBatch, path: str) -> None:
    with pa.OSFile(path, "wb") as f, pa.ipc.new_stream(f, batch.schema) as writer:
        writer.write_batch(batch)


class _Rows(InputPartition):
    def __init__(self, index: int, rows: int):
        super().__init__(index)
        self.rows = rows


class _PrebuiltReader(DataSourceReader):
    def __init__(self, path: str, rows: int, partitions: int):
        self.path, self.rows, self.parts = path, rows, partitions

    def partitions(self) -> List[InputPartition]:
        step, extra = divmod(self.rows, self.parts)
        return [_Rows(i, step + (1 if i < extra else 0)) for i in range(self.parts)]

    def read(self, partition: _Rows) -> Iterator[pa.RecordBatch]:
        batch = load_batch(self.path)
        left = partition.rows
        while left >= batch.num_rows:
            yield batch
            left -= batch.num_rows
        if left:
            yield batch.slice(0, left)


class PrebuiltArrowSource(DataSource):
    """Options: ``path`` (Arrow IPC stream with one batch), ``rows``, ``partitions``."""

    @classmethod
    def name(cls) -> str:
        return "bench_prebuilt"

    def schema(self) -> StructType:
        return spark_schema()

    def reader(self, schema: StructType) -> DataSourceReader:
        return _PrebuiltReader(self.options["path"], int(self.options["rows"]),
                               int(self.options["partitions"]))


class _OneRowStreamReader(DataSourceStreamReader):
    """Every trigger sees one new row: offsets {"pos": n} -> {"pos": n + 1}, until ``batches``
    rows were offered (then the stream is idle, so it can be stopped between batches)."""

    def __init__(self, batches: int):
        self.batches = batches

    def initialOffset(self) -> dict:
        return {"pos": 0}

    def latestOffset(self, start: dict, limit) -> dict:
        return {"pos": min(start["pos"] + 1, self.batches)}

    def partitions(self, start: dict, end: dict) -> List[InputPartition]:
        return [InputPartition(start["pos"])] if end["pos"] > start["pos"] else []

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield _one_row(partition.value)


def _one_row(pos: int) -> pa.RecordBatch:
    values = {"topic": "BenchOneRow", "brokerName": "broker-a", "queueId": 0,
              "queueOffset": pos, "body": b"x" * 100, "tags": None, "keys": str(pos),
              "msgId": "0" * 32, "bornTimestamp": 0, "storeTimestamp": 0,
              "bornHost": "127.0.0.1:1", "storeHost": "127.0.0.1:2", "reconsumeTimes": 0,
              "commitLogOffset": pos, "queueTopic": "BenchOneRow"}
    schema = arrow_schema()
    return pa.RecordBatch.from_arrays([pa.array([values[f.name]], f.type) for f in schema],
                                      schema=schema)


class OneRowStreamSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "bench_one_row"

    def schema(self) -> StructType:
        return spark_schema()

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _OneRowStreamReader(int(self.options.get("batches", "1000000000")))


RECORD = 16


def append_record(fd: int, millis: int) -> None:
    """Append one record (``os.write`` on an ``O_APPEND`` descriptor: whole or nothing)."""
    os.write(fd, b"%015d\n" % millis)


class _FileStreamReader(DataSourceStreamReader):
    def __init__(self, path: str):
        self.path = path

    def _records(self) -> int:
        return os.path.getsize(self.path) // RECORD

    def initialOffset(self) -> dict:
        return {"pos": self._records()}

    def latestOffset(self, start: dict, limit) -> dict:
        return {"pos": max(start["pos"], self._records())}

    def partitions(self, start: dict, end: dict) -> List[InputPartition]:
        if end["pos"] <= start["pos"]:
            return []
        return [InputPartition((start["pos"], end["pos"]))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        first, last = partition.value
        with open(self.path, "rb") as f:
            f.seek(first * RECORD)
            data = f.read((last - first) * RECORD)
        n = len(data) // RECORD
        millis = [int(data[i * RECORD:i * RECORD + RECORD - 1]) for i in range(n)]
        schema = arrow_schema()
        values = {
            "topic": pa.array(["BenchFile"] * n, pa.string()),
            "brokerName": pa.array(["local"] * n, pa.string()),
            "queueId": pa.array([0] * n, pa.int32()),
            "queueOffset": pa.array(range(first, first + n), pa.int64()),
            "body": pa.array([b"x" * 100] * n, pa.binary()),
            "tags": pa.nulls(n, pa.string()),
            "keys": pa.array([str(i) for i in range(first, first + n)], pa.string()),
            "msgId": pa.array(["0" * 32] * n, pa.string()),
            "bornTimestamp": pa.array([m * 1000 for m in millis], schema.field(8).type),
            "storeTimestamp": pa.array([m * 1000 for m in millis], schema.field(9).type),
            "bornHost": pa.array(["127.0.0.1:1"] * n, pa.string()),
            "storeHost": pa.array(["127.0.0.1:2"] * n, pa.string()),
            "reconsumeTimes": pa.array([0] * n, pa.int32()),
            "commitLogOffset": pa.array(range(first, first + n), pa.int64()),
            "queueTopic": pa.array(["BenchFile"] * n, pa.string()),
        }
        yield pa.RecordBatch.from_arrays([values[f.name] for f in schema], schema=schema)


class FileStreamSource(DataSource):
    """Option ``path``: the record file (it must exist when the query starts)."""

    @classmethod
    def name(cls) -> str:
        return "bench_file_stream"

    def schema(self) -> StructType:
        return spark_schema()

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _FileStreamReader(self.options["path"])
