"""The input columns of ``sendBack``, checked on the driver before any task runs, and a row
of them as a message read (:class:`MessageRead`).

A row sent back is a message as our source read it: the broker takes it back by its place in
the commit log, so the row must carry the message's identity as the source gives it. Any other
column of the source's schema is accepted and not sent (a pipeline sends back what it read);
``delayLevel`` chooses the retry's delay; anything else is an error naming it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

from pyspark.sql.types import (
    BinaryType, DataType, IntegerType, LongType, MapType, StringType, StructType,
)

from .schema import _INTEGRAL, SchemaError

# What CONSUMER_SEND_MSG_BACK needs (topic, broker, commit-log offset, message id) and what
# Java's fallback copies into the retry topic when a broker refuses it (body, reconsume count).
REQUIRED = {
    "topic": (StringType, "string"),
    "brokerName": (StringType, "string"),
    "commitLogOffset": (LongType, "bigint"),
    "msgId": (StringType, "string"),
    "body": (BinaryType, "binary"),
    "reconsumeTimes": (IntegerType, "int"),
}
# Used when present: properties and tags/keys for the fallback's copy, delayLevel for the delay.
OPTIONAL = {"properties", "tags", "keys", "delayLevel"}
# The source's other columns: accepted, not sent.
IGNORED = {"queueId", "queueOffset", "bornTimestamp", "storeTimestamp", "bornHost",
           "storeHost", "queueTopic"}
DELAY_LEVELS = "int (-1: straight to the dead-letter topic, 0 or null: the broker's choice, 1-18)"


@dataclass
class MessageRead:
    """One row: a message as the source read it, and the delay level asked for it."""

    row: int
    topic: str
    broker_name: str
    commit_log_offset: int
    msg_id: str
    body: bytes
    reconsume_times: int
    properties: Optional[Dict[str, str]]
    tags: Optional[str]
    keys: Optional[str]
    delay_level: int

    def describe(self) -> str:
        return (f"row {self.row} (msgId {self.msg_id}, {self.topic} on {self.broker_name}, "
                f"commitLogOffset {self.commit_log_offset})")


@dataclass(frozen=True)
class SendBackPlan:
    """Which input column (by its name in the DataFrame) is which part of a message read."""

    columns: Dict[str, str]  # canonical name -> the DataFrame's spelling
    properties: Optional[str] = None
    tags: Optional[str] = None
    keys: Optional[str] = None
    delay_level: Optional[str] = None

    def __getitem__(self, name: str) -> str:
        return self.columns[name]


def _fits(name: str, dtype: DataType) -> bool:
    if name in REQUIRED:
        return isinstance(dtype, REQUIRED[name][0])
    if name == "properties":
        return (isinstance(dtype, MapType) and isinstance(dtype.keyType, StringType)
                and isinstance(dtype.valueType, StringType))
    if name == "delayLevel":
        return isinstance(dtype, _INTEGRAL)
    return True  # tags, keys and the ignored columns: as the source gives them


def plan_send_back(schema: StructType, group: str) -> SendBackPlan:
    """Map the input's columns; raise :class:`SchemaError` naming what is missing or wrong."""
    known = {n.lower(): n for n in (*REQUIRED, *OPTIONAL, *IGNORED)}
    found: Dict[str, str] = {}
    for f in schema.fields:
        name = known.get(f.name.lower())
        if name is None:
            raise SchemaError(
                f"column {f.name!r} is not one sendBack takes: the rows must be messages as the "
                "rocketmq source reads them (its columns, and delayLevel); drop it before the "
                "write (a message goes back as the broker stored it)")
        if name in found:
            raise SchemaError(f"columns {found[name]!r} and {f.name!r} both name {name}")
        if not _fits(name, f.dataType):
            want = (REQUIRED[name][1] if name in REQUIRED else
                    "map<string,string>" if name == "properties" else DELAY_LEVELS)
            raise SchemaError(f"column {f.name!r} must be {want} for sendBack, got "
                              f"{f.dataType.simpleString()}")
        found[name] = f.name
    missing = [n for n in REQUIRED if n not in found]
    if missing:
        raise SchemaError(
            f"sendBack={group} needs the column(s) {', '.join(missing)} of each message as the "
            "rocketmq source reads it (CONSUMER_SEND_MSG_BACK names a message by its topic, "
            "broker, commit-log offset and id; a broker that refuses it gets the body and "
            "reconsume count as a message of its own): keep them in the rows you send back")
    return SendBackPlan({n: found[n] for n in REQUIRED}, found.get("properties"),
                        found.get("tags"), found.get("keys"), found.get("delayLevel"))
