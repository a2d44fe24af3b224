"""GET_TOPIC_STATS_INFO's answer (a TopicStatsTable): every queue of a topic on one broker with
its min and max offset, in one body.

A broker writes it with fastjson, whose maps keyed by objects are not JSON: each key of
``offsetTable`` is a MessageQueue object, ``{"brokerName":..,"queueId":..,"topic":..}``, followed
by ``:`` and a TopicOffset ``{"lastUpdateTimestamp":..,"maxOffset":..,"minOffset":..}``. This
module reads that form (and the same table with the keys quoted as strings or written as
standard JSON objects' text, which other serializers produce).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from json.decoder import scanstring
from typing import Dict, List, Optional, Tuple

from ..errors import ProtocolError

WHERE = "GET_TOPIC_STATS_INFO body"
_TEXT = r'"((?:[^"\\]|\\.)*)"'
# one row exactly as fastjson writes it (fields in name order, no spaces): the common case,
# read without the general parser (a thousand rows several times a second)
_ROW = re.compile(r'\{"brokerName":' + _TEXT + r',"queueId":(-?\d+),"topic":' + _TEXT
                  + r'\}:\{"lastUpdateTimestamp":(-?\d+),"maxOffset":(-?\d+),'
                  r'"minOffset":(-?\d+)\}')
_FAST_OPEN, _FAST_CLOSE = '{"offsetTable":{', "}}"
_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?")
_WORDS = {"true": True, "false": False, "null": None}


@dataclass(frozen=True)
class QueueStats:
    """One queue's row of the table (offsets as GET_MIN_OFFSET / GET_MAX_OFFSET give them)."""

    topic: str
    broker_name: str
    queue_id: int
    min_offset: int
    max_offset: int
    last_update_timestamp: int


def parse_topic_stats(body: bytes) -> List[QueueStats]:
    """The rows of a TopicStatsTable body; :class:`ProtocolError` names the byte at fault."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError("the topic stats are not UTF-8", exc.start, WHERE, body) from None
    fast = _fastjson_rows(text)
    if fast is not None:
        return fast
    parser = _Reader(text, body)
    top = parser.document()
    table = top.get("offsetTable") if isinstance(top, dict) else None
    if not isinstance(table, list):
        raise ProtocolError("the topic stats have no offsetTable object", 0, WHERE, body)
    rows = []
    for key, value in table:
        queue = _as_object(key, body)
        if not isinstance(value, dict) or not isinstance(queue, dict):
            raise ProtocolError(f"an offsetTable entry is not a queue and its offsets: "
                                f"{key!r}", 0, WHERE, body)
        try:
            rows.append(QueueStats(str(queue["topic"]), str(queue["brokerName"]),
                                   int(queue["queueId"]), int(value["minOffset"]),
                                   int(value["maxOffset"]),
                                   int(value.get("lastUpdateTimestamp") or 0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"an offsetTable entry lacks {exc}: {queue!r}", 0, WHERE,
                                body) from None
    return rows


def _fastjson_rows(text: str) -> Optional[List[QueueStats]]:
    """The rows of a table in fastjson's exact form, or None for any other text."""
    if not (text.startswith(_FAST_OPEN) and text.endswith(_FAST_CLOSE)):
        return None
    pos, end = len(_FAST_OPEN), len(text) - len(_FAST_CLOSE)
    rows: List[QueueStats] = []
    while pos < end:
        m = _ROW.match(text, pos)
        if m is None:
            return None
        broker, queue_id, topic, last, high, low = m.groups()
        if "\\" in broker or "\\" in topic:
            return None  # escapes: the general parser decodes them
        rows.append(QueueStats(topic, broker, int(queue_id), int(low), int(high), int(last)))
        pos = m.end()
        if pos < end:
            if text[pos] != ",":
                return None
            pos += 1
            if pos == end:
                return None
    return rows


def _as_object(key, body: bytes):
    """A key given as a MessageQueue: an object, or a string holding one's JSON."""
    if isinstance(key, str) and key.startswith("{"):
        try:
            return json.loads(key)
        except ValueError:
            raise ProtocolError(f"an offsetTable key is not a queue: {key!r}", 0, WHERE,
                                body) from None
    return dict(key) if isinstance(key, tuple) else key


class _Reader:
    """JSON with fastjson's object keys. Objects come back as dicts, except ``offsetTable``'s
    value, kept as a list of (key, value) pairs whose object keys are tuples of items."""

    def __init__(self, text: str, body: bytes):
        self.text, self.body, self.pos = text, body, 0

    def fail(self, what: str):
        # the byte offset of the character at fault (the body is UTF-8)
        at = len(self.text[:self.pos].encode("utf-8"))
        raise ProtocolError(f"the topic stats are malformed: {what}", at, WHERE, self.body)

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t\r\n":
            self.pos += 1

    def document(self):
        value = self.value()
        self.skip()
        if self.pos != len(self.text):
            self.fail("text after the table")
        return value

    def value(self, pairs: bool = False):
        self.skip()
        if self.pos >= len(self.text):
            self.fail("the body ends early")
        c = self.text[self.pos]
        if c == "{":
            return self.obj(pairs)
        if c == "[":
            return self.array()
        if c == '"':
            value, self.pos = scanstring(self.text, self.pos + 1)
            return value
        m = _NUMBER.match(self.text, self.pos)
        if m:
            self.pos = m.end()
            return float(m.group()) if m.group(1) or m.group(2) else int(m.group())
        for word, value in _WORDS.items():
            if self.text.startswith(word, self.pos):
                self.pos += len(word)
                return value
        self.fail(f"unexpected {c!r}")

    def array(self) -> list:
        self.pos += 1
        out: list = []
        self.skip()
        if self.text.startswith("]", self.pos):
            self.pos += 1
            return out
        while True:
            out.append(self.value())
            if self.sep("]"):
                return out

    def sep(self, close: str) -> bool:
        """After an item: True at the closing bracket, False after a comma."""
        self.skip()
        if self.text.startswith(close, self.pos):
            self.pos += 1
            return True
        if not self.text.startswith(",", self.pos):
            self.fail(f"expected ',' or {close!r}")
        self.pos += 1
        return False

    def obj(self, pairs: bool):
        self.pos += 1
        items: List[Tuple[object, object]] = []
        self.skip()
        if self.text.startswith("}", self.pos):
            self.pos += 1
            return items if pairs else {}
        while True:
            key = self.value()
            if isinstance(key, dict):  # an object as a key: hashable as its items
                key = tuple(sorted(key.items()))
            self.skip()
            if not self.text.startswith(":", self.pos):
                self.fail("expected ':'")
            self.pos += 1
            items.append((key, self.value(pairs=key == "offsetTable")))
            if self.sep("}"):
                break
        if pairs:
            return items
        out: Dict[object, object] = {}
        for key, value in items:
            out[key] = value
        return out
