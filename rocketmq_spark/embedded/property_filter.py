"""SQL92 property filtering of pulls, as a 4.9.8 broker with ``enablePropertyFilter=true`` does it.

* ConsumerFilterManager: an expression is compiled once per (topic, group, version); one that
  does not compile gives *no* filter data. A pull that carries its subscription (sysFlag's
  subscription bit) is then served unfiltered -- the genuine capture shows SUCCESS/FOUND with
  every message for ``a >>> 3 AND`` -- while a pull relying on the heartbeat's subscription gets
  FILTER_DATA_NOT_EXIST. Only the expression type ``SQL92`` (exact case) compiles; any other
  non-tag type is treated like a bad expression (FilterFactory has nothing else).
* The grammar is 4.9.8's: CONTAINS, STARTSWITH and ENDSWITH are property names there, and
  Apache's parser stops at the end of the first complete expression (``a = 1 b`` is ``a = 1``).
* ExpressionMessageFilter: each stored message's properties (TAGS, KEYS, UNIQ_KEY and user
  properties alike) are decoded and evaluated; only a true result passes; an evaluation
  error is logged by the genuine broker and counts as no match.
* DefaultMessageStore.getMessage: a pull examines at most max(800, maxMsgNums) entries, never
  past the end of the consume-queue file (300,000 entries) its offset is in, and stops early
  when the batch is full (the count and byte caps are checked before the filter, as there).
  ``nextBeginOffset`` is the offset after the last entry examined, so filtered-out messages
  are skipped for good.
"""
from __future__ import annotations

import json
import logging
import struct
from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, Iterable, Optional, Tuple

from ..client.filter import Expression, FilterSyntaxError, parse_sql92
from ..client.protocol.codes import ResponseCode
from ..client.protocol.frame import RemotingCommand
from ..client.protocol.message import MAGIC_V2, SYSFLAG_BORNHOST_V6, SYSFLAG_STOREHOST_V6
from ..client.protocol.properties import NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR
from .queue import ConsumeQueue, filter_window, scan_kept

log = logging.getLogger(__name__)

SQL92 = "SQL92"
CHECK_CLIENT_CONFIG = 46  # RequestCode.CHECK_CLIENT_CONFIG
CQ_FILE_ENTRIES = 300_000  # entries per consume-queue file (mappedFileSizeConsumeQueue / 20)
_INT = struct.Struct(">i")
_SHORT = struct.Struct(">h")


def is_tag_type(expression_type: Optional[str]) -> bool:
    """ExpressionType.isTagType: null, empty or exactly ``TAG``."""
    return expression_type is None or expression_type == "" or expression_type == "TAG"


@lru_cache(maxsize=100)  # SelectorParser keeps its last 100 parses too
def compile_filter(expression_type: str, text: str) -> Optional[Expression]:
    """ConsumerFilterManager.build's compile step: the expression, or None when it fails."""
    if expression_type != SQL92:
        return None
    try:
        return parse_sql92(text, allow_trailing_text=True, string_operators=False)
    except FilterSyntaxError as exc:
        log.warning("SQL92 expression does not compile; pulls that carry it get every "
                    "message: %s", exc.reason)
        return None


@dataclass(frozen=True)
class FilterData:
    """ConsumerFilterData: one group's compiled expression for one topic."""

    expression: str
    expression_type: str
    client_version: int
    compiled: Optional[Expression]


class ConsumerFilters:
    """ConsumerFilterManager: the filter data heartbeats register, by (topic, group)."""

    def __init__(self) -> None:
        self._data: Dict[Tuple[str, str], FilterData] = {}

    def get(self, topic: str, group: str) -> Optional[FilterData]:
        return self._data.get((topic, group))

    def register(self, group: str, subscriptions: Iterable) -> None:
        """Every heartbeat's subscriptions (each with topic, sub_string, expression_type,
        sub_version). Data of topics no longer subscribed stays (the genuine manager marks it
        dead and drops it a day later)."""
        for sub in subscriptions:
            self._register(sub.topic, group, sub.sub_string, sub.expression_type,
                           sub.sub_version)

    def _register(self, topic: str, group: str, expression: str, expression_type: str,
                  version: int) -> None:
        if is_tag_type(expression_type) or not expression:
            return
        key = (topic, group)
        old = self._data.get(key)
        if old is not None and version <= old.client_version:
            return  # an equal or older version never replaces the registered one
        compiled = compile_filter(expression_type, expression)
        if compiled is None:
            self._data.pop(key, None)  # a newer version that fails removes the old one
            return
        self._data[key] = FilterData(expression, expression_type, version, compiled)


class PropertyText:
    """A record's properties text looked up by name: ``get(name)`` answers what
    ``decode_properties(text).get(name)`` would (Java's string2messageProperties: the last pair
    of that name with a non-empty value), without splitting the whole text. A filter reads a
    handful of names per message, so this is cheaper than building the map."""

    __slots__ = ("_text",)

    def __init__(self, text: str):
        self._text = text

    def get(self, name: str, default: Optional[str] = None) -> Optional[str]:
        text = self._text
        key = name + NAME_VALUE_SEPARATOR
        end = len(text)
        while True:
            at = text.rfind(key, 0, end)
            if at < 0:
                return default
            if at == 0 or text[at - 1] == PROPERTY_SEPARATOR:
                start = at + len(key)
                stop = text.find(PROPERTY_SEPARATOR, start)
                if stop < 0:
                    stop = len(text)
                if stop > start:
                    return text[start:stop]
            end = at + len(key) - 1  # look further left


def record_properties(buf, start: int) -> PropertyText:
    """MessageDecoder.decodeProperties of the stored record at ``buf[start:]``."""
    sys_flag = _INT.unpack_from(buf, start + 36)[0]
    at = start + 68 + (20 if sys_flag & SYSFLAG_BORNHOST_V6 else 8) + \
        (20 if sys_flag & SYSFLAG_STOREHOST_V6 else 8)
    at += 4 + _INT.unpack_from(buf, at)[0]
    if _INT.unpack_from(buf, start + 4)[0] == MAGIC_V2:
        at += 2 + _SHORT.unpack_from(buf, at)[0]
    else:
        at += 1 + buf[at]
    length = _SHORT.unpack_from(buf, at)[0]
    if length <= 0:
        return PropertyText("")
    return PropertyText(buf[at + 2:at + 2 + length].decode("utf-8", "replace"))


def read_matching(queue: ConsumeQueue, offset: int, expression: Optional[Expression],
                  max_msg_nums: int, max_count: int, max_bytes: int) -> Tuple[bytes, int, int]:
    """A pull from ``offset`` (min <= offset < max) keeping the messages ``expression``
    matches (all of them when None). Returns (body, entries examined, messages kept)."""
    first, base, ends, buf = queue.buffer_view()
    i0 = offset - first
    file_end = (offset // CQ_FILE_ENTRIES + 1) * CQ_FILE_ENTRIES - first
    stop = min(len(ends), i0 + filter_window(max_msg_nums), file_end)
    prev_end = ends[i0 - 1] if i0 > 0 else base
    if expression is None:
        return scan_kept(ends, buf, base, i0, stop, prev_end, None, max_msg_nums, max_count,
                         max_bytes)
    evaluate = expression.evaluate
    return scan_kept(ends, buf, base, i0, stop, prev_end,
                     lambda _, start: evaluate(record_properties(buf, start - base)),
                     max_msg_nums, max_count, max_bytes)


def check_client_config(enable_property_filter: bool, cmd: RemotingCommand,
                        version: int) -> RemotingCommand:
    """CHECK_CLIENT_CONFIG (ClientManageProcessor.checkClientConfig), which a Java consumer with
    a non-tag subscription sends every broker before it starts: SUCCESS for a tag subscription
    or none; SYSTEM_ERROR when property filtering is off; SUBSCRIPTION_PARSE_FAILED when the
    expression does not compile. The genuine remark of the last is the Java parser's exception
    text; ours carries our parser's reason instead."""
    body = json.loads(cmd.body) if cmd.body else None  # bad JSON: the dispatch's SYSTEM_ERROR
    sub = body.get("subscriptionData") if isinstance(body, dict) else None
    if isinstance(sub, dict):
        expression_type = sub.get("expressionType")
        if not is_tag_type(expression_type):
            if not enable_property_filter:
                return cmd.make_response(ResponseCode.SYSTEM_ERROR, None,
                                         "The broker does not support consumer to filter "
                                         f"message by {expression_type}", version=version)
            text = sub.get("subString")
            if expression_type != SQL92 or not isinstance(text, str):
                # no filter of that type (or no expression): a NullPointerException, no message
                return cmd.make_response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, None, None,
                                         version=version)
            try:
                parse_sql92(text, allow_trailing_text=True, string_operators=False)
            except FilterSyntaxError as exc:
                return cmd.make_response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, None,
                                         f"Invalid MessageSelector: {exc.reason}",
                                         version=version)
    return cmd.make_response(ResponseCode.SUCCESS, None, None, version=version)
