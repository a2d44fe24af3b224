"""The sink's input columns, checked once on the driver (in ``writer()``), before any task runs.

Columns are found by name, case-insensitively, like the Kafka sink's ``value``/``key``/``topic``:
``body`` (binary or string, required), ``topic``, ``tags``, ``keys`` (string or
array<string>), ``properties`` (map<string,string>), ``shardingKey`` (string) and
``delayLevel`` (an integer type). Any other column, or one of the wrong type, is an error that
names it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

from pyspark.sql.types import (
    ArrayType, BinaryType, ByteType, DataType, IntegerType, LongType, MapType, ShortType,
    StringType, StructType,
)

from ..options import OptionError

COLUMNS = {
    "body": "binary or string",
    "topic": "string",
    "tags": "string",
    "keys": "string or array<string>",
    "properties": "map<string,string>",
    "shardingkey": "string",
    "delaylevel": "int (1-18)",
}
SPELLING = {"body": "body", "topic": "topic", "tags": "tags", "keys": "keys",
            "properties": "properties", "shardingkey": "shardingKey", "delaylevel": "delayLevel"}
_INTEGRAL = (ByteType, ShortType, IntegerType, LongType)


class SchemaError(OptionError):
    """An input column the sink cannot write; the message names it."""


@dataclass(frozen=True)
class ColumnPlan:
    """Which input column (by its name in the DataFrame) plays which part."""

    body: str
    topic: Optional[str] = None
    tags: Optional[str] = None
    keys: Optional[str] = None
    keys_is_array: bool = False
    properties: Optional[str] = None
    sharding_key: Optional[str] = None
    delay_level: Optional[str] = None


def _fits(part: str, dtype: DataType) -> bool:
    if part == "body":
        return isinstance(dtype, (BinaryType, StringType))
    if part == "keys":
        return isinstance(dtype, StringType) or (
            isinstance(dtype, ArrayType) and isinstance(dtype.elementType, StringType))
    if part == "properties":
        return (isinstance(dtype, MapType) and isinstance(dtype.keyType, StringType)
                and isinstance(dtype.valueType, StringType))
    if part == "delaylevel":
        return isinstance(dtype, _INTEGRAL)
    return isinstance(dtype, StringType)


def plan_columns(schema: StructType, default_topic: Optional[str]) -> ColumnPlan:
    """Map the input's columns to message parts; raise :class:`SchemaError` naming the first
    column at fault."""
    found: Dict[str, str] = {}
    for f in schema.fields:
        part = f.name.lower()
        if part not in COLUMNS:
            raise SchemaError(
                f"column {f.name!r} is not one the rocketmq sink writes; the columns are "
                + ", ".join(f"{SPELLING[p]} ({t})" for p, t in COLUMNS.items())
                + ". Drop it, or put it into the body (e.g. to_json(struct(...)) AS body) or "
                  "into the properties map")
        if part in found:
            raise SchemaError(f"columns {found[part]!r} and {f.name!r} both name the "
                              f"{SPELLING[part]} column")
        if not _fits(part, f.dataType):
            raise SchemaError(f"column {f.name!r} must be {COLUMNS[part]}, got "
                              f"{f.dataType.simpleString()}")
        found[part] = f.name
    if "body" not in found:
        raise SchemaError("the rocketmq sink needs a body column (binary or string), e.g. "
                          "selectExpr(\"to_json(struct(*)) AS body\")")
    if "topic" not in found and not default_topic:
        raise SchemaError("no topic: set the option topic, or give the rows a topic column")
    dtypes = {f.name: f.dataType for f in schema.fields}
    return ColumnPlan(
        body=found["body"],
        topic=found.get("topic"), tags=found.get("tags"), keys=found.get("keys"),
        keys_is_array="keys" in found and isinstance(dtypes[found["keys"]], ArrayType),
        properties=found.get("properties"), sharding_key=found.get("shardingkey"),
        delay_level=found.get("delaylevel"))
