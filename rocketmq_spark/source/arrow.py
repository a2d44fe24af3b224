"""Decoded RocketMQ columns -> the Arrow RecordBatch a Spark Python data source yields.

Spark accepts a ``RecordBatch`` from ``read()`` only if its schema equals, exactly,
``pyspark.sql.pandas.types.to_arrow_schema(schema, timezone="UTC")`` (see
``pyspark/sql/worker/plan_data_source_read.py``); anything else fails with
``DATA_SOURCE_RETURN_SCHEMA_MISMATCH``. So :func:`arrow_schema` spells that conversion out:
``string``, ``binary``, ``int32``/``int64``, ``timestamp[us, tz=UTC]`` (always UTC, whatever
the session time zone), every field nullable, in schema order; the properties map is
``map<string, string>`` with a non-nullable ``key`` and a nullable ``value`` field.

This runs in Spark executors at millions of rows per second, so nothing here makes a Python
object per row: most output columns are the decoder's arrays as they are (zero copy), the
timestamps are one vectorised multiply, ``brokerName`` and ``queueTopic`` are constant arrays
cut from cached ones, and the properties map is parsed with pyarrow.compute and numpy over
the text buffers.
"""
from __future__ import annotations

import threading
from typing import Dict, Optional, Tuple

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, TimestampType

from .schema import (  # noqa: F401 (spark_schema re-exported)
    _COLUMNS, BROKER_NAME, PROPERTIES, QUEUE_TOPIC, spark_schema,
)

if TYPE_CHECKING:
    import numpy as np


NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

_TIMESTAMP = pa.timestamp("us", tz="UTC")
_MAP = pa.map_(pa.field("key", pa.string(), nullable=False),
               pa.field("value", pa.string(), nullable=True))
_ARROW_TYPES = {StringType: pa.string(), BinaryType: pa.binary(), IntegerType: pa.int32(),
                LongType: pa.int64(), TimestampType: _TIMESTAMP}


def _arrow_schema(include_properties: bool) -> pa.Schema:
    fields = [pa.field(name, _ARROW_TYPES[type(kind)], nullable=True)
              for name, kind, _ in _COLUMNS]
    if include_properties:
        fields.append(pa.field(PROPERTIES, _MAP, nullable=True))
    return pa.schema(fields)


_SCHEMAS = {False: _arrow_schema(False), True: _arrow_schema(True)}


def arrow_schema(include_properties: bool = False) -> pa.Schema:
    """Exactly what Spark expects for :func:`spark_schema`, i.e. pyspark's
    ``to_arrow_schema(schema, timezone="UTC")``; spelled out so the hot path never calls the
    converter (a test checks they agree)."""
    return _SCHEMAS[bool(include_properties)]


def empty_spark_batch(include_properties: bool = False) -> pa.RecordBatch:
    """A 0-row batch of the output schema (e.g. for a pull that found nothing)."""
    schema = arrow_schema(include_properties)
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)


# --------------------------------------------------------------------------------------------
# Constant brokerName and queueTopic columns

_CONSTANTS: Dict[str, pa.Array] = {}
_CONSTANTS_LOCK = threading.Lock()
_CONSTANT_MIN_ROWS = 1 << 16


def _constant_string(value: str, n: int) -> pa.Array:
    """``n`` copies of ``value`` as a plain string array, sliced from a cached one.

    An executor reads a handful of brokers and topics, so caching one array per name (grown by
    doubling)
    makes this free after the first batch; a slice from offset 0 is written to Arrow IPC as
    just its ``n`` rows."""
    cached = _CONSTANTS.get(value)
    if cached is None or len(cached) < n:
        size = max(_CONSTANT_MIN_ROWS, n, 2 * len(cached) if cached is not None else 0)
        cached = pa.repeat(pa.scalar(value, pa.string()), size)
        with _CONSTANTS_LOCK:
            if len(_CONSTANTS) > 256:  # many broker names: don't grow without bound
                _CONSTANTS.clear()
            _CONSTANTS[value] = cached
    return cached.slice(0, n)


def _timestamps(millis: pa.Array) -> pa.Array:
    """Epoch milliseconds (int64) to ``timestamp[us, tz=UTC]``: one multiply, then a zero-copy
    view. Unchecked: only values beyond +-292,000 years overflow (and would wrap), which no
    broker clock produces; raising would instead stop the stream on one corrupt record."""
    return pc.multiply(millis, 1000).view(_TIMESTAMP)


# --------------------------------------------------------------------------------------------
# Properties map


def _offsets(array: pa.Array) -> np.ndarray:
    """The int32 offsets of a string/binary/list array (``len + 1`` entries, slice-aware)."""
    import numpy as np

    return np.frombuffer(array.buffers()[1], dtype=np.int32, count=len(array) + 1,
                         offset=4 * array.offset)


def properties_map(props: pa.Array) -> pa.Array:
    """Parse properties texts into ``map<string, string>`` with Java's rule
    (``MessageDecoder.string2messageProperties``), one map per row.

    * Items are split on ``\\x02``; the first ``\\x01`` of an item separates name and value (the
      value may contain further ``\\x01``); a pair is kept only if name and value are both
      non-empty. (Java also skips items shorter than 3 characters, which that rule implies.)
    * A name repeated within a row keeps its *first* position with its *last* value, i.e. a
      Python dict's (and Java's ``HashMap.put``'s) overwrite semantics; map keys are unique per
      row. Keys are otherwise in text order (a Java ``HashMap`` iterates in hash order, which
      carries no meaning).
    * An empty (or null) text gives an empty map, never null.

    Vectorised: split, flatten and find with pyarrow.compute; names and values are cut out of
    the flattened text buffer with numpy offsets and copied by ``take``. Repeated names are
    found by dictionary-encoding the names and sorting (row, name code) pairs (cheap: rows are
    already in order); only if some row repeats a name is the first-position/last-value
    resolution run, and it is vectorised too (no per-row Python), so a batch full of repeats
    costs about 25% more, not a Python loop.
    """
    import numpy as np

    n = len(props)
    if props.null_count:
        props = props.fill_null("")
    items = pc.split_pattern(props, PROPERTY_SEPARATOR)
    flat = pc.list_flatten(items)
    m = len(flat)
    if m == 0:
        return pa.MapArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)),
                                       pa.array([], pa.string()), pa.array([], pa.string()),
                                       type=_MAP)
    sep = pc.find_substring(flat, NAME_VALUE_SEPARATOR).to_numpy()  # byte position or -1
    offs = _offsets(flat)
    starts, ends = offs[:-1], offs[1:]
    kept = np.flatnonzero((sep > 0) & (ends - starts > sep + 1))
    parents = pc.list_parent_indices(items).to_numpy()[kept]
    k = len(kept)

    # One binary array over the flattened text whose entries 4i and 4i+2 are the name and the
    # value of kept item i (4i+1 is its "\x01", 4i+3 what lies before the next kept item).
    key_start = starts[kept]
    key_end = key_start + sep[kept]
    inter = np.empty(4 * k + 1, dtype=np.int32)
    inter[0:4 * k:4] = key_start
    inter[1:4 * k:4] = key_end
    inter[2:4 * k:4] = key_end + 1
    inter[3:4 * k:4] = ends[kept]
    inter[4 * k] = ends[kept[-1]] if k else 0
    spans = pa.Array.from_buffers(pa.binary(), 4 * k,
                                  [None, pa.py_buffer(inter), flat.buffers()[2]])
    name_idx = np.arange(0, 4 * k, 4, dtype=np.int64)
    names = spans.take(pa.array(name_idx)).view(pa.string())

    value_rows = None  # kept-item index whose value each output entry takes (None: its own)
    entries = None     # kept-item indices that become map entries (None: all)
    if k:
        codes = pc.dictionary_encode(names)
        distinct = len(codes.dictionary)
        if distinct < k:  # a name occurs twice somewhere in the batch: maybe within a row
            entries, value_rows = _resolve_duplicates(parents, codes.indices.to_numpy(),
                                                      distinct)
    if entries is not None:
        names = names.take(pa.array(entries))
        parents = parents[entries]
        value_idx = 4 * value_rows + 2
    else:
        value_idx = name_idx + 2
    values = spans.take(pa.array(value_idx)).view(pa.string())
    counts = np.bincount(parents, minlength=n)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.MapArray.from_arrays(pa.array(offsets), names, values, type=_MAP)


def _resolve_duplicates(parents: np.ndarray, codes: np.ndarray, distinct: int
                        ) -> Tuple[np.ndarray | None, np.ndarray | None]:
    """For kept items (row ``parents``, name code ``codes``): which become entries and whose
    value each takes, so that a repeated name keeps its first position and its last value.
    Returns ``(None, None)`` when no row repeats a name."""
    import numpy as np

    group = parents.astype(np.int64) * distinct + codes  # one id per (row, name)
    # Items of a row are contiguous and rows ascend, so sorting groups only sorts within rows.
    order = np.argsort(group, kind="stable")
    sorted_group = group[order]
    same = sorted_group[1:] == sorted_group[:-1]
    if not same.any():
        return None, None
    k = len(group)
    # Runs of equal group in sorted order: first item = first occurrence (stable sort), last
    # item = last occurrence.
    run_start = np.flatnonzero(np.concatenate(([True], ~same)))
    run_end = np.concatenate((run_start[1:], [k])) - 1
    first, last = order[run_start], order[run_end]
    keep = np.zeros(k, dtype=bool)
    keep[first] = True
    value_of = np.arange(k, dtype=np.int64)
    value_of[first] = last
    entries = np.flatnonzero(keep)
    return entries, value_of[entries]


# --------------------------------------------------------------------------------------------
# The batch


def to_spark_batch(columns: pa.RecordBatch, broker_name: str,
                   include_properties: bool = False, queue_topic: Optional[str] = None
                   ) -> pa.RecordBatch:
    """One decoded batch (:data:`rocketmq_spark.client.protocol.pull_decode.SCHEMA`) as the batch
    Spark accepts for :func:`spark_schema`; ``broker_name`` and ``queue_topic`` (the queue's
    topic; by default the first row's ``topic``, right for any queue but a retry queue) fill
    the constant ``brokerName`` and ``queueTopic``.

    Every column but the timestamps, the constants and ``properties`` is the decoder's own
    array (no copy)."""
    n = columns.num_rows
    if queue_topic is None:
        queue_topic = columns.column("topic")[0].as_py() if n else ""
    out = []
    for name, _, source in _COLUMNS:
        if source == BROKER_NAME:
            out.append(_constant_string(broker_name, n))
        elif source == QUEUE_TOPIC:
            out.append(_constant_string(queue_topic, n))
        elif name.endswith("Timestamp"):
            out.append(_timestamps(columns.column(source)))
        else:
            out.append(columns.column(source))
    if include_properties:
        out.append(properties_map(columns.column("properties")))
    return pa.RecordBatch.from_arrays(out, schema=arrow_schema(include_properties))
