"""The source's Spark schema. Light on imports: Spark asks for it in a worker of its own,
before any data is read."""
from __future__ import annotations

from pyspark.sql.types import (BinaryType, IntegerType, LongType, MapType, StringType,
                               StructField, StructType, TimestampType)

# Constant columns, the same for every row of a queue: filled from the queue read, not decoded.
BROKER_NAME, QUEUE_TOPIC = "(the queue's broker)", "(the queue's topic)"

# Output columns: (Spark name, Spark type, source column in columns.SCHEMA or a constant).
_COLUMNS = (
    ("topic", StringType(), "topic"),
    ("brokerName", StringType(), BROKER_NAME),
    ("queueId", IntegerType(), "queue_id"),
    ("queueOffset", LongType(), "queue_offset"),
    ("body", BinaryType(), "body"),
    ("tags", StringType(), "tags"),
    ("keys", StringType(), "keys"),
    ("msgId", StringType(), "msg_id"),
    ("bornTimestamp", TimestampType(), "born_timestamp"),
    ("storeTimestamp", TimestampType(), "store_timestamp"),
    ("bornHost", StringType(), "born_host"),
    ("storeHost", StringType(), "store_host"),
    ("reconsumeTimes", IntegerType(), "reconsume_times"),
    # the message's place in its broker's commit log (Java's MessageExt.commitLogOffset):
    # what CONSUMER_SEND_MSG_BACK names a message by, for the sink's sendBack
    ("commitLogOffset", LongType(), "physical_offset"),
    # the topic of the queue read: ``topic`` unless the row came from a group's retry queue,
    # where ``topic`` is the message's original topic and this ``%RETRY%<group>``; with
    # brokerName, queueId and queueOffset it names the row's real position
    ("queueTopic", StringType(), QUEUE_TOPIC),
)
PROPERTIES = "properties"


def spark_schema(include_properties: bool = False) -> StructType:
    """The source's Spark schema (the Java connector's column names); ``properties`` is opt-in
    because parsing it is by far the most expensive column."""
    fields = [StructField(name, kind, True) for name, kind, _ in _COLUMNS]
    if include_properties:
        fields.append(StructField(PROPERTIES, MapType(StringType(), StringType(), True), True))
    return StructType(fields)


def check_user_schema(given: StructType, include_properties: bool) -> None:
    """Refuse a schema the user set with ``.schema(...)`` unless it is the source's own, as
    Spark's Kafka source refuses one: the rows have the source's columns whatever is asked,
    and Spark would only find the mismatch inside the tasks. Raises ValueError naming the
    first column that differs."""
    own = spark_schema(include_properties)
    if given == own:
        return
    own_fields, given_fields = list(own.fields), list(given.fields)
    where = next((i for i, (a, b) in enumerate(zip(own_fields, given_fields)) if a != b),
                 min(len(own_fields), len(given_fields)))
    if where < len(own_fields) and where < len(given_fields):
        first = (f"column {where + 1} is {given_fields[where].simpleString()}, the source's is "
                 f"{own_fields[where].simpleString()}")
    elif where < len(own_fields):
        first = f"the source also has {own_fields[where].simpleString()}"
    else:
        first = f"the source has no column {given_fields[where].simpleString()}"
    raise ValueError(
        "the rocketmq source has a fixed schema and cannot be set with a custom one "
        f"(.schema(...)): {first}. Leave .schema(...) out (includeProperties=true adds "
        f"`{PROPERTIES}`); the source's schema is {own.simpleString()}")
