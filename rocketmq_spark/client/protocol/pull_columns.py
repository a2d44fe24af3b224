"""The columns of a decoded pull body, which both decoders (:mod:`.pull_decode`, the C one
behind it, and its numpy twin :mod:`.pull_decode_numpy`) fill."""
from __future__ import annotations

import pyarrow as pa

# Column names and types of a decoded batch (the Spark schema is built from these elsewhere).
SCHEMA = pa.schema([
    ("topic", pa.string()),
    ("queue_id", pa.int32()),
    ("queue_offset", pa.int64()),
    ("physical_offset", pa.int64()),
    ("flag", pa.int32()),
    ("sys_flag", pa.int32()),
    ("born_timestamp", pa.int64()),
    ("born_host", pa.string()),
    ("store_timestamp", pa.int64()),
    ("store_host", pa.string()),
    ("reconsume_times", pa.int32()),
    ("body", pa.binary()),
    ("properties", pa.string()),
    ("tags", pa.string()),
    ("keys", pa.string()),
    ("msg_id", pa.string()),
    ("offset_msg_id", pa.string()),
])
