"""Topic message types, as 5.x brokers publish them and a 5.x proxy checks sends against them.

A 5.x topic carries the attribute ``message.type`` (``mqadmin updateTopic -a
+message.type=FIFO``): NORMAL, FIFO, DELAY, TRANSACTION or MIXED. The broker keeps it in the
topic config's ``attributes`` (``TopicConfig``: ``{"message.type":"NORMAL"}``; a config
without it reads as NORMAL, ``TopicConfig.getTopicMessageType``) and answers it in
GET_TOPIC_CONFIG (351) and GET_ALL_TOPIC_CONFIG. The broker itself refuses no send by type
(``SendMessageProcessor`` at 5.1.4 uses the type only for its metrics); the proxy does
(``SendMessageActivity`` / ``DefaultTopicMessageTypeValidator``, with
``enableTopicMessageTypeCheck`` on by default): a message's type is read from its properties
(``TopicMessageType.parseFromMessageProperty``) and must equal the topic's unless the topic
is MIXED; a topic the proxy does not find is UNSPECIFIED and refuses everything. The refusal
is MESSAGE_ILLEGAL (13) ``TopicMessageType validate failed, the expected type is X, but actual
type is Y`` (seen on a genuine 5.1.4 proxy). ``%RETRY%`` and ``%DLQ%`` topics are not checked.
"""
from __future__ import annotations

from typing import Dict, Mapping, Optional, Tuple

from ..client.protocol.codes import ResponseCode
from .store import TopicConfig

GET_TOPIC_CONFIG = 351  # RequestCode.GET_TOPIC_CONFIG (5.x)
ATTRIBUTE = "message.type"  # TopicAttributes.TOPIC_MESSAGE_TYPE_ATTRIBUTE
UNSPECIFIED, NORMAL, FIFO, DELAY, TRANSACTION, MIXED = (
    "UNSPECIFIED", "NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED")
TYPES = (UNSPECIFIED, NORMAL, FIFO, DELAY, TRANSACTION, MIXED)  # what the attribute may hold
_DELAY_PROPERTIES = ("DELAY", "TIMER_DELIVER_MS", "TIMER_DELAY_SEC")
_UNCHECKED_PREFIXES = ("%RETRY%", "%DLQ%")


def check_type_name(value: str) -> str:
    """``value`` if it is a topic message type, else ValueError listing them."""
    if value not in TYPES:
        raise ValueError(f"message type {value!r} is not one of {', '.join(TYPES)}")
    return value


def topic_message_type(config: Optional[TopicConfig]) -> str:
    """The topic's type: its attribute, NORMAL without one, UNSPECIFIED for no topic (what
    the proxy's metadata service answers for a topic it cannot find)."""
    if config is None:
        return UNSPECIFIED
    return config.attributes.get(ATTRIBUTE, NORMAL)


def message_type_of(properties: Mapping[str, str]) -> str:
    """A message's type from its properties, first match wins: ``TRAN_MSG`` "true" (Java's
    parseBoolean) → TRANSACTION; ``DELAY``, ``TIMER_DELIVER_MS`` or ``TIMER_DELAY_SEC``
    present → DELAY; ``__SHARDINGKEY`` present → FIFO; else NORMAL."""
    if (properties.get("TRAN_MSG") or "").lower() == "true":
        return TRANSACTION
    if any(p in properties for p in _DELAY_PROPERTIES):
        return DELAY
    if "__SHARDINGKEY" in properties:
        return FIFO
    return NORMAL


def proxy_send_refusal(topic: str, config: Optional[TopicConfig],
                       properties: Mapping[str, str]) -> Optional[Tuple[int, str]]:
    """What a 5.x proxy answers a send of a message with ``properties`` to ``topic``
    (``config``: the broker's config of it, None when there is none): (code, remark), or None
    when it passes the type check."""
    if topic.startswith(_UNCHECKED_PREFIXES):
        return None
    expected, actual = topic_message_type(config), message_type_of(properties)
    if actual == UNSPECIFIED or (actual != expected and expected != MIXED):
        return (ResponseCode.MESSAGE_ILLEGAL, "TopicMessageType validate failed, the expected "
                f"type is {expected}, but actual type is {actual}")
    return None


def parse_attributes(text: Optional[str]) -> Dict[str, str]:
    """UPDATE_AND_CREATE_TOPIC's ``attributes`` (``+message.type=FIFO,+k=v``) as a map of the
    attributes to set (``AttributeParser.parseToMap``); ValueError for a malformed one."""
    result: Dict[str, str] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        if not item.startswith("+") or "=" not in item:
            raise ValueError(f"add/alter attribute format is wrong: {item}")
        key, _, value = item[1:].partition("=")
        result[key] = value
    return result


def topic_config_json(config: TopicConfig, with_attributes: bool) -> Dict[str, object]:
    """A topic config as the broker serializes it (fastjson: keys in alphabetical order);
    ``attributes`` only from 5.x on."""
    body: Dict[str, object] = {}
    if with_attributes:
        body["attributes"] = dict(sorted(config.attributes.items()))
    body.update({"order": config.order, "perm": config.perm,
                 "readQueueNums": config.read_queue_nums,
                 "topicFilterType": config.topic_filter_type, "topicName": config.topic_name,
                 "topicSysFlag": config.topic_sys_flag,
                 "writeQueueNums": config.write_queue_nums})
    return body
