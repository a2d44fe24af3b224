"""One Arrow batch of a sink task's input, checked and normalized column by column.

Every check runs over whole columns; a row that cannot become a message raises
:class:`RowError` naming the row (its number within the task), the task and what is wrong with
it, before anything of that Arrow batch is sent.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..client.namespace import wrap, wrapped_name_problem
from ..client.send.producer import MAX_DELAY_LEVEL
from ..client.protocol.properties import SYSTEM_PROPERTIES, TRANSIENT_PREFIX
from ..client.protocol.send_encode import first_index, map_properties
from ..options import TOPIC_NAME
from .ids import TaskIdentity, message_ids
from .options import SinkOptions
from .schema import ColumnPlan

_SEPARATORS = "[\x01\x02]"
_RESERVED = pa.array(sorted(SYSTEM_PROPERTIES), pa.large_string())


class RowError(ValueError):
    """A row the sink cannot send; the message names the row and the fault."""


@dataclass
class SinkRows:
    """The columns of ``count`` rows, rows ``first_row ..`` of the task, ready to encode.

    ``topic`` is None when every row goes to ``default_topic``; ``delay`` holds 0 for no delay;
    ``user_properties`` is the ``k\\x01v\\x02`` text of the properties map (null: none)."""

    identity: TaskIdentity
    first_row: int
    count: int
    body: pa.Array
    ids: pa.Array
    default_topic: Optional[str] = None
    topic: Optional[pa.Array] = None
    tags: Optional[pa.Array] = None
    keys: Optional[pa.Array] = None
    sharding_key: Optional[pa.Array] = None
    delay: Optional[np.ndarray] = None
    user_properties: Optional[pa.Array] = None
    properties_map: Optional[pa.Array] = None

    def where(self, index: int) -> str:
        return f"row {self.first_row + index} ({self.identity.describe()})"

    def topic_of(self, index: int) -> str:
        return self.default_topic if self.topic is None else self.topic[index].as_py()


def _fail(rows: SinkRows, index: int, message: str) -> RowError:
    return RowError(f"{rows.where(index)}: {message}")


def _no_separators(rows: SinkRows, values: pa.Array, column: str) -> None:
    bad = first_index(pc.match_substring_regex(values, _SEPARATORS))
    if bad is not None:
        raise _fail(rows, bad, f"the {column} value contains a \\x01 or \\x02 character, "
                               "which RocketMQ's property encoding cannot carry")


def _strings(batch: pa.RecordBatch, name: str) -> pa.Array:
    return batch.column(name).cast(pa.large_string())


def normalize(batch: pa.RecordBatch, plan: ColumnPlan, options: SinkOptions,
              identity: TaskIdentity, first_row: int) -> SinkRows:
    """Check and convert ``batch`` (rows ``first_row ..`` of the task)."""
    n = batch.num_rows
    body = batch.column(plan.body)
    # Over remoting the names are put into the namespace here; a 5.x proxy does it itself
    # from the namespace the gRPC producer sends (Java's clients do the same).
    namespace = options.namespace if options.transport == "remoting" else ""
    rows = SinkRows(identity, first_row, n, body, message_ids(identity, first_row, n),
                    default_topic=wrap(namespace, options.topic) if options.topic else None)
    if body.null_count:
        raise _fail(rows, first_index(body.is_null()), "the body is null; every message "
                    "needs a body (use an empty string or binary for an empty one)")
    rows.body = body.cast(pa.large_binary())

    if plan.topic is not None:
        topic = _strings(batch, plan.topic)
        if options.topic:
            topic = pc.fill_null(topic, pa.scalar(options.topic, pa.large_string()))
        if topic.null_count:
            raise _fail(rows, first_index(topic.is_null()), "the topic column is null and no "
                        "topic option is set")
        names = pc.unique(topic).to_pylist()
        for value in names:
            problem = (None if TOPIC_NAME.match(value) else "is not a valid topic name (letters, "
                       "digits, %, |, _ and -, at most 127)")
            if problem is None and namespace:
                problem = wrapped_name_problem(wrap(namespace, value))
                problem = problem and f"in namespace {namespace!r}: {problem}"
            if problem:
                index = first_index(pc.equal(topic, value))
                raise _fail(rows, index, f"{value!r} {problem}")
        rows.topic = _wrapped(topic, names, namespace) if namespace else topic

    if plan.tags is not None:
        tags = _strings(batch, plan.tags)
        _no_separators(rows, tags, "tags")
        rows.tags = pc.if_else(pc.equal(tags, ""), pa.scalar(None, pa.large_string()), tags)

    if plan.keys is not None:
        keys = batch.column(plan.keys)
        if plan.keys_is_array:
            flat = pc.list_flatten(keys)
            if flat.null_count:
                lists = keys.cast(pa.large_list(pa.large_string()))
                offsets = lists.offsets.to_numpy()
                j = first_index(flat.is_null())
                row = int(np.searchsorted(offsets, offsets[0] + j, "right") - 1)
                raise _fail(rows, row, "the keys array holds a null key")
            keys = pc.binary_join(keys.cast(pa.large_list(pa.large_string())),
                                  pa.scalar(" ", pa.large_string()))
        keys = keys.cast(pa.large_string())
        _no_separators(rows, keys, "keys")
        rows.keys = pc.if_else(pc.equal(keys, ""), pa.scalar(None, pa.large_string()), keys)

    if plan.sharding_key is not None:
        sharding = _strings(batch, plan.sharding_key)
        _no_separators(rows, sharding, "shardingKey")
        rows.sharding_key = pc.if_else(pc.equal(sharding, ""),
                                       pa.scalar(None, pa.large_string()), sharding)

    if plan.delay_level is not None:
        delay = pc.fill_null(batch.column(plan.delay_level).cast(pa.int64()), 0)
        values = delay.to_numpy(zero_copy_only=False)
        bad = np.flatnonzero((values < 0) | (values > MAX_DELAY_LEVEL))
        if len(bad):
            raise _fail(rows, int(bad[0]), f"delayLevel {int(values[bad[0]])} is not a delay "
                                           f"level: use 1-{MAX_DELAY_LEVEL} (0 or null: none)")
        rows.delay = values.astype(np.int32)

    if plan.properties is not None:
        maps = batch.column(plan.properties)
        _check_properties(rows, maps)
        rows.properties_map = maps
        rows.user_properties = map_properties(maps)
    return rows


def _wrapped(topic: pa.Array, names: list, namespace: str) -> pa.Array:
    """The topic column with each distinct name (``names``) put into ``namespace``."""
    wired = [wrap(namespace, name) for name in names]
    if wired == names:
        return topic
    index = pc.index_in(topic, pa.array(names, topic.type))
    return pa.array(wired, topic.type).take(index)


def _check_properties(rows: SinkRows, maps: pa.Array) -> None:
    names = maps.keys.cast(pa.large_string())
    values = maps.items.cast(pa.large_string())
    offsets = maps.offsets.to_numpy()
    first, last = int(offsets[0]), int(offsets[-1])
    names, values = names.slice(first, last - first), values.slice(first, last - first)

    def row_of(j: int) -> int:
        return int(np.searchsorted(offsets, first + j, "right") - 1)

    checks = [
        (pc.equal(pc.utf8_length(names), 0), lambda j: "a property has an empty name"),
        (pc.or_(pc.is_in(names, _RESERVED), pc.starts_with(names, TRANSIENT_PREFIX)),
         lambda j: f"property {names[j].as_py()!r} is a name RocketMQ reserves for itself "
                   "(a system property); rename it"),
        (pc.match_substring_regex(names, _SEPARATORS),
         lambda j: f"property name {names[j].as_py()!r} contains a \\x01 or \\x02 character"),
        (values.is_null(), lambda j: f"property {names[j].as_py()!r} has a null value"),
        (pc.equal(pc.utf8_length(values), 0),
         lambda j: f"property {names[j].as_py()!r} has an empty value (RocketMQ drops "
                   "those)"),
        (pc.match_substring_regex(values, _SEPARATORS),
         lambda j: f"the value of property {names[j].as_py()!r} contains a \\x01 or \\x02 "
                   "character"),
    ]
    for mask, describe in checks:
        j = first_index(mask)
        if j is not None:
            raise _fail(rows, row_of(j), describe(j))
