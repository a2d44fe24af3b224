"""Spark's pushed filters (``DataSourceReader.pushFilters``, Spark 4.1+) as a plan of what to
read: which queues, which offsets and store times, which tags.

Spark hands a batch reader the conjuncts of a WHERE clause it could translate (``EqualTo``,
``In``, ``GreaterThan``, ... on a column path) and re-evaluates every filter the reader gives
back. :func:`translate` keeps a filter away from Spark only when the plan reads exactly the
rows it selects; a filter the plan only narrows (store times, an ``IN`` on offsets) or cannot
use goes back, so pushdown never changes a result. Pure functions, no Spark import: the
filters are told apart by class name (Spark 4.0 has none of these classes).
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field, replace
from typing import Any, Dict, FrozenSet, Iterable, List, Mapping, Optional, Tuple

from ..client.protocol.route import MessageQueue

# Spark's filter classes by the name of the comparison (pyspark.sql.datasource).
_EQUAL = ("EqualTo", "EqualNullSafe")
_LOWER = {"GreaterThan": True, "GreaterThanOrEqual": False}   # name -> strict
_UPPER = {"LessThan": True, "LessThanOrEqual": False}

# Columns whose value is the same for every message of a queue: a predicate on one of them
# picks whole queues. Values are the Python types Spark passes for the column's type.
_QUEUE_COLUMNS: Dict[str, type] = {"topic": str, "brokerName": str, "queueId": int}
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
_MS = _dt.timedelta(milliseconds=1)


@dataclass(frozen=True)
class ReadPlan:
    """What the pushed filters leave to read; every field's default reads everything.

    ``topics``/``brokers``/``queue_ids``/``tags``: the values allowed (None: any);
    ``from_offset``/``to_offset``: queue offsets ``[from, to)``; ``since_ms``/``until_ms``:
    store times ``[since, until)`` in milliseconds."""

    topics: Optional[FrozenSet[str]] = None
    brokers: Optional[FrozenSet[str]] = None
    queue_ids: Optional[FrozenSet[int]] = None
    tags: Optional[FrozenSet[str]] = None
    from_offset: int = 0
    to_offset: Optional[int] = None
    since_ms: Optional[int] = None
    until_ms: Optional[int] = None
    pushed: Tuple[str, ...] = field(default=(), compare=False)  # the filters taken, for logs

    def keeps(self, mq: MessageQueue, topic: Optional[str] = None) -> bool:
        """Whether the queue can hold a selected row; ``topic``: its name as the rows' topic
        column gives it (without the namespace), by default the queue's."""
        return ((self.topics is None or (mq.topic if topic is None else topic) in self.topics)
                and (self.brokers is None or mq.broker_name in self.brokers)
                and (self.queue_ids is None or mq.queue_id in self.queue_ids))

    @property
    def reads_nothing(self) -> bool:
        """The filters contradict each other (``queueId = 1 AND queueId = 2``, say)."""
        empty_set = any(s is not None and not s for s in
                        (self.topics, self.brokers, self.queue_ids, self.tags))
        return (empty_set or (self.to_offset is not None and self.to_offset <= self.from_offset)
                or (self.since_ms is not None and self.until_ms is not None
                    and self.until_ms <= self.since_ms))

    @property
    def by_time(self) -> bool:
        return self.since_ms is not None or self.until_ms is not None

    def cut(self, start: Mapping[MessageQueue, int], end: Mapping[MessageQueue, int]
            ) -> Tuple[Dict[MessageQueue, int], Dict[MessageQueue, int]]:
        """Each queue's ``[start, end)`` narrowed to the pushed offset bounds."""
        new_start = {mq: max(s, self.from_offset) for mq, s in start.items()}
        new_end = dict(end) if self.to_offset is None else \
            {mq: min(e, self.to_offset) for mq, e in end.items()}
        return new_start, new_end

    def with_tags(self, tag_filter: List[str]) -> "ReadPlan":
        """The plan's tags intersected with the ``filter`` option's (``[]``: every tag)."""
        if not tag_filter:
            return self
        base = frozenset(tag_filter)
        return replace(self, tags=base if self.tags is None else self.tags & base)

    def describe(self) -> str:
        return ", ".join(self.pushed) if self.pushed else "nothing"


def translate(filters: Iterable[Any], tag_filter_exact: bool = True
              ) -> Tuple[ReadPlan, List[Any]]:
    """The plan of the filters (ANDed), and the filters Spark must still evaluate, in their
    order and by reference, as ``pushFilters`` returns them.

    ``tag_filter_exact``: a tag set read through the TAG filter is exact (the reader drops
    every message whose tag is not in it), so a pushed ``tags`` filter is not given back;
    through a SQL92 subscription (:func:`sql92_with_tags`) the broker alone decides, so Spark
    checks the tags again."""
    plan: Dict[str, Any] = {}
    pushed: List[str] = []
    keep: List[Any] = []
    for f in filters:
        taken, exact = _take(f, plan)
        if taken:
            pushed.append(_show(f))
        if not taken or not exact or (_column(f) == "tags" and not tag_filter_exact):
            keep.append(f)
    return ReadPlan(pushed=tuple(pushed), **plan), keep


def sql92_with_tags(expression: str, tags: Iterable[str]) -> str:
    """A SQL92 subscription narrowed to ``tags``: the broker compares the TAGS property as
    the rows' tags column shows it (a message without tags matches neither)."""
    quoted = ", ".join("'" + tag.replace("'", "''") + "'" for tag in sorted(tags))
    return f"({expression}) AND (TAGS IN ({quoted}))"


def _column(f: Any) -> Optional[str]:
    path = getattr(f, "attribute", None)
    return path[0] if isinstance(path, tuple) and len(path) == 1 else None


def _show(f: Any) -> str:
    return f"{type(f).__name__}({_column(f)}, {getattr(f, 'value', None)!r})"


def _values(f: Any) -> Optional[List[Any]]:
    """The values an equality or ``IN`` allows (None for other filters); a null in an ``IN``
    matches no row, and ``<=> NULL`` is not an equality on values."""
    name = type(f).__name__
    if name in _EQUAL:
        return None if f.value is None else [f.value]
    if name == "In":
        return [v for v in f.value if v is not None]
    return None


def _take(f: Any, plan: Dict[str, Any]) -> Tuple[bool, bool]:
    """Fold one filter into ``plan``: (taken, exact)."""
    column, name = _column(f), type(f).__name__
    if column is None:
        return False, False
    if column in _QUEUE_COLUMNS or column == "tags":
        values = _values(f)
        kind = _QUEUE_COLUMNS.get(column, str)
        if values is None or not all(_is(v, kind) for v in values):
            return False, False
        if column == "tags" and not all(_plain_tag(v) for v in values):
            return False, False
        key = {"topic": "topics", "brokerName": "brokers", "queueId": "queue_ids",
               "tags": "tags"}[column]
        allowed = frozenset(values)
        plan[key] = allowed if plan.get(key) is None else plan[key] & allowed
        return True, True
    if column == "queueOffset":
        return _take_bounds(f, name, plan, "from_offset", "to_offset",
                            lambda v: v if _is(v, int) else None, step=1)
    if column == "storeTimestamp":
        taken, _ = _take_bounds(f, name, plan, "since_ms", "until_ms", _millis, step=1,
                                strict_matters=False)
        return taken, False  # offsets by time bound the read; Spark still checks each row
    return False, False


def _take_bounds(f: Any, name: str, plan: Dict[str, Any], low_key: str, high_key: str,
                 convert, step: int, strict_matters: bool = True) -> Tuple[bool, bool]:
    """A range on an ordered column as ``[low, high)``. With ``strict_matters`` False the
    bounds are the widest that can hold a row (millisecond store times against a microsecond
    timestamp), never narrower than the filter."""
    if name not in _LOWER and name not in _UPPER and name not in _EQUAL and name != "In":
        return False, False
    values = _values(f) if name in _EQUAL or name == "In" else [getattr(f, "value", None)]
    if not values or any(convert(v) is None for v in values):
        if name == "In" and values == []:
            # IN of nulls only: no row. Reads nothing, as Spark would keep nothing.
            _narrow(plan, low_key, 0, high_key, 0)
            return True, True
        return False, False
    numbers = [convert(v) for v in values]
    low, high = min(numbers), max(numbers) + step
    if name in _LOWER:
        strict = _LOWER[name] and strict_matters
        _narrow(plan, low_key, numbers[0] + (step if strict else 0), high_key, None)
    elif name in _UPPER:
        strict = _UPPER[name] and strict_matters
        _narrow(plan, low_key, None, high_key, numbers[0] + (0 if strict else step))
    else:  # equality or IN: the smallest range holding every value
        _narrow(plan, low_key, low, high_key, high)
        return True, name != "In"
    return True, True


def _narrow(plan: Dict[str, Any], low_key: str, low: Optional[int], high_key: str,
            high: Optional[int]) -> None:
    if low is not None:
        plan[low_key] = low if plan.get(low_key) is None else max(plan[low_key], low)
    if high is not None:
        plan[high_key] = high if plan.get(high_key) is None else min(plan[high_key], high)


def _is(value: Any, kind: type) -> bool:
    return isinstance(value, kind) and not isinstance(value, bool)


def _plain_tag(value: str) -> bool:
    """A tag a TAG expression can name as it is: not empty, not ``*``, no ``||``, no edge
    spaces (the expression's parser trims them) and no separator characters."""
    return (bool(value) and value == value.strip() and value != "*" and "||" not in value
            and not any(c in value for c in "\x00\x01\x02"))


def _millis(value: Any) -> Optional[int]:
    """A timestamp filter value (an aware datetime) as whole milliseconds, rounded down."""
    if not isinstance(value, _dt.datetime) or value.tzinfo is None:
        return None
    return (value - _EPOCH) // _MS
