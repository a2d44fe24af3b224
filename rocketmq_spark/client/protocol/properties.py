"""Message properties: ``name \\x01 value \\x02`` text, and the well-known property names."""
from __future__ import annotations

from functools import lru_cache
from typing import Dict, Iterable, List, Mapping, Tuple

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

TAGS = "TAGS"
KEYS = "KEYS"
UNIQ_KEY = "UNIQ_KEY"
WAIT = "WAIT"
CLUSTER = "CLUSTER"
DELAY = "DELAY"
SHARDING_KEY = "__SHARDINGKEY"
MIN_OFFSET = "MIN_OFFSET"
MAX_OFFSET = "MAX_OFFSET"


def encode_properties(props: Mapping[str, str], trailing_separator: bool = True) -> str:
    """Properties text. ``trailing_separator=False`` is the 4.9.1-5.1.4 form (no final
    ``\\x02``)."""
    for name, value in props.items():
        for text in (name, value):
            if NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
                raise ValueError(f"property {name!r} contains a \\x01 or \\x02 separator")
    text = PROPERTY_SEPARATOR.join(f"{k}{NAME_VALUE_SEPARATOR}{v}" for k, v in props.items())
    if trailing_separator and text:
        text += PROPERTY_SEPARATOR
    return text


def decode_properties(text: str) -> Dict[str, str]:
    """Java's rule: split on ``\\x02``; the first ``\\x01`` splits name and value; pairs with an
    empty name or value are dropped; a later duplicate wins. Accepts both trailing forms."""
    out: Dict[str, str] = {}
    if not text:
        return out
    for item in text.split(PROPERTY_SEPARATOR):
        if len(item) < 3:
            continue
        name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if sep and name and value:
            out[name] = value
    return out


@lru_cache(maxsize=8192)
def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode()`` as a signed 32-bit int (used for tag codes).

    Remembered per string: brokers hash the same tags and property names for every message."""
    h = 0
    if text.isascii():  # one UTF-16 unit per character
        for c in text.encode("ascii"):
            h = (31 * h + c) & 0xFFFFFFFF
    else:
        data = text.encode("utf-16-be")
        for i in range(0, len(data), 2):
            h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def java_hashmap_order(keys: Iterable[str]) -> List[str]:
    """The iteration order of a ``java.util.HashMap`` holding ``keys`` (inserted in this order).

    A genuine broker rebuilds the stored properties from a HashMap, so their order on disk is
    this order; the embedded server uses it to store byte-identical properties. Remembered per
    tuple of keys: every message of a producer carries the same key set.
    """
    return list(_hashmap_order(tuple(keys)))


_ORDERS: Dict[Tuple[str, ...], Tuple[str, ...]] = {}


def _hashmap_order(keys: Tuple[str, ...]) -> Tuple[str, ...]:
    order = _ORDERS.get(keys)
    if order is None:
        if len(_ORDERS) >= 4096:  # key sets with unique names: do not grow without bound
            _ORDERS.clear()
        order = _ORDERS[keys] = tuple(_compute_hashmap_order(keys))
    return order


def _compute_hashmap_order(keys: Iterable[str]) -> List[str]:
    keys = list(dict.fromkeys(keys))
    capacity = 16
    while len(keys) > capacity * 0.75:
        capacity *= 2

    def bucket(item):
        h = java_string_hash(item[1]) & 0xFFFFFFFF
        return ((h ^ (h >> 16)) & (capacity - 1), item[0])

    return [k for _, k in sorted(enumerate(keys), key=bucket)]


def hashmap_properties(props: Mapping[str, str], drop: str = "") -> str:
    """``MessageDecoder.messageProperties2String`` of a Java HashMap holding ``props``
    (inserted in their order): the 4.9.1+ text (no trailing separator), minus property
    ``drop`` (which still counts for the map's layout)."""
    order = _hashmap_order(tuple(props))
    return encode_properties({k: props[k] for k in order if k != drop},
                             trailing_separator=False)


def property_value(text: str, name: str):
    """What ``decode_properties(text).get(name)`` is, without decoding every property."""
    key = name + NAME_VALUE_SEPARATOR
    at = text.find(key)
    if at < 0:
        return None
    found = None
    n = len(key)
    while at >= 0:
        if at == 0 or text[at - 1] == PROPERTY_SEPARATOR:
            end = text.find(PROPERTY_SEPARATOR, at + n)
            value = text[at + n:] if end < 0 else text[at + n:end]
            if value:  # an empty value is dropped: an earlier one stands
                found = value
        at = text.find(key, at + n)
    return found


def split_tags_expression(expression: str) -> List[str]:
    """Tags of a TAG subscription expression (``"a || b"``); ``[]`` means everything (``*``)."""
    expression = (expression or "").strip()
    if not expression or expression == "*":
        return []
    return [t.strip() for t in expression.split("||") if t.strip()]


# Names RocketMQ keeps for itself (MessageConst): a user property of one of these names would
# change how the broker or a consumer treats the message, so producers refuse them.
SYSTEM_PROPERTIES = frozenset({
    "KEYS", "TAGS", "WAIT", "DELAY", "RETRY_TOPIC", "REAL_TOPIC", "REAL_QID", "TRAN_MSG",
    "PGROUP", "MIN_OFFSET", "MAX_OFFSET", "BUYER_ID", "ORIGIN_MESSAGE_ID", "TRANSFER_FLAG",
    "CORRECTION_FLAG", "MQ2_FLAG", "RECONSUME_TIME", "MSG_REGION", "TRACE_ON", "UNIQ_KEY",
    "EXTEND_UNIQ_INFO", "MAX_RECONSUME_TIMES", "CONSUME_START_TIME", "INNER_NUM", "INNER_BASE",
    "DUP_INFO", "CHECK_IMMUNITY_TIME_IN_SECONDS", "TRAN_PREPARED_QUEUE_OFFSET",
    "__transactionId__", "TRANSACTION_CHECK_TIMES", "INSTANCE_ID", "CORRELATION_ID",
    "REPLY_TO_CLIENT", "TTL", "ARRIVE_TIME", "PUSH_REPLY_TIME", "CLUSTER", "MSG_TYPE", "POP_CK",
    "POP_CK_OFFSET", "1ST_POP_TIME", "__SHARDINGKEY", "PROPERTY_FORWARD_QUEUE_ID", "REDIRECT",
    "INNER_MULTI_DISPATCH", "INNER_MULTI_QUEUE_OFFSET", "TRACE_CONTEXT", "TIMER_DELAY_SEC",
    "TIMER_DELIVER_MS", "__BORNHOST", "BORN_TIMESTAMP", "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS",
    "TIMER_ROLL_TIMES", "TIMER_OUT_MS", "TIMER_DEL_UNIQKEY", "TIMER_DELAY_LEVEL",
    "__STARTDELIVERTIME",
})
# Properties under this prefix are transient (never stored); also reserved.
TRANSIENT_PREFIX = "__RMQ.TRANSIENT."
