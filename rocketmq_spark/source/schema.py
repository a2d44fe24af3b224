"""The source's Spark schema. Light on imports: Spark asks for it in a worker of its own,
before any data is read."""
from __future__ import annotations

from pyspark.sql.types import (BinaryType, IntegerType, LongType, MapType, StringType,
                               StructField, StructType, TimestampType)

# Output columns: (Spark name, Spark type, source column in columns.SCHEMA or None).
_COLUMNS = (
    ("topic", StringType(), "topic"),
    ("brokerName", StringType(), None),
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
)
PROPERTIES = "properties"


def spark_schema(include_properties: bool = False) -> StructType:
    """The source's Spark schema (the Java connector's column names); ``properties`` is opt-in
    because parsing it is by far the most expensive column."""
    fields = [StructField(name, kind, True) for name, kind, _ in _COLUMNS]
    if include_properties:
        fields.append(StructField(PROPERTIES, MapType(StringType(), StringType(), True), True))
    return StructType(fields)
