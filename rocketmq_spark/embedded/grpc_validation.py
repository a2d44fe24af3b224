"""What Apache RocketMQ 5.0's gRPC proxy refuses, and the status it answers with: the embedded
proxy is as strict as the genuine one, so a client that works against it works against 5.0.

Read from apache/rocketmq's proxy source of the 5.0 line (the versions that still import
``org.apache.rocketmq.common.protocol`` and ``InternalLogger``, i.e. before 5.1.0):

* ``grpc/v2/common/GrpcValidator.java``: topic and consumer-group names (blank, system names,
  then the client's ``Validators.checkTopic``/``checkGroup``: length and characters), tags.
* ``grpc/v2/producer/SendMessageActivity.java``: body size, user properties (count, reserved
  names, control characters, total size with tag and keys), keys, message id, message group,
  delivery time.
* ``config/ProxyConfig.java``: the limits' defaults (:class:`ProxyLimits`).
* ``service/route/TopicRouteService.java`` + ``grpc/v2/common/ResponseBuilder.java``: a topic
  the name server does not know is TOPIC_NOT_FOUND with the client exception's text.
* ``common/utils/NamespaceUtil.java`` (via ``GrpcConverter.wrapResourceWithNamespace``): a
  resource's namespace makes the broker-side name ``namespace%name``.

Every check raises :class:`Refused` with the code and message Apache's proxy answers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from ..client.grpc import definition_pb2 as definition
from .grpc_delivery import SYSTEM_PROPERTIES
from .send import SYSTEM_TOPICS, TOPIC_MAX_LENGTH, VALID_TOPIC, VALID_TOPIC_TEXT

GROUP_MAX_LENGTH = 255  # Validators.CHARACTER_MAX_LENGTH
SYSTEM_TOPIC_PREFIX = "rmq_sys_"
SYSTEM_GROUP_PREFIX = "CID_RMQ_SYS_"
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
NAMESPACE_SEPARATOR = "%"
FAQ_URL = "http://rocketmq.apache.org/docs/faq/"
TOPIC_NOT_EXIST = 17  # the remoting ResponseCode the proxy's route lookup fails with
# Java's LanguageCode names in 5.0 (remoting/protocol/LanguageCode.java; RUST and NODE_JS came
# later): the x-mq-language header must be one of them for the proxy to register a client
# (apache/rocketmq#10890 describes the INTERNAL answer otherwise).
LANGUAGE_CODES = frozenset({"JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY",
                            "OTHER", "HTTP", "GO", "PHP", "OMS"})
LANGUAGE_ENUM = "org.apache.rocketmq.remoting.protocol.LanguageCode"


@dataclass(frozen=True)
class ProxyLimits:
    """ProxyConfig's defaults in 5.0 (0 or less: no limit, as there)."""

    max_message_size: int = 4 * 1024 * 1024
    max_user_property_size: int = 16 * 1024
    user_property_max_num: int = 128
    max_message_group_size: int = 64
    max_delay_ms: int = 24 * 3600 * 1000


def status(code: int, message: str = "") -> definition.Status:
    """A gRPC status; without a message, the code's name (as Apache's proxy answers)."""
    return definition.Status(code=code, message=message or definition.Code.Name(code))


class Refused(Exception):
    """A request the proxy refuses, with the status it answers."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.status = status(code, message)


# ------------------------------------------------------------------ Java's string predicates

_JAVA_SPACES = frozenset("\t\n\u000b\f\r\u001c\u001d\u001e\u001f")


def _java_whitespace(ch: str) -> bool:
    """Character.isWhitespace: Unicode space separators except the no-break ones, line and
    paragraph separators, and the ASCII controls Java counts as space."""
    if ch in _JAVA_SPACES:
        return True
    if ch in "\u00a0\u2007\u202f":
        return False
    return ch == " " or ch in "\u1680\u2028\u2029\u205f\u3000" or "\u2000" <= ch <= "\u200a"


def is_blank(text: str) -> bool:
    """StringUtils.isBlank (for a non-null string)."""
    return all(_java_whitespace(ch) for ch in text)


def has_control_character(text: str) -> bool:
    """CharMatcher.javaIsoControl: U+0000-U+001F and U+007F-U+009F."""
    return any(ch <= "\u001f" or "\u007f" <= ch <= "\u009f" for ch in text)


def java_length(text: str) -> int:
    """String.length(): UTF-16 code units."""
    return len(text.encode("utf-16-le")) // 2


# ------------------------------------------------------------------ names and namespaces

def is_system_topic(topic: str) -> bool:
    """TopicValidator.isSystemTopic."""
    return topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIX)


def wrap(resource: definition.Resource) -> str:
    """NamespaceUtil.wrapNamespace(resource_namespace, name): ``namespace%name``; retry and DLQ
    prefixes stay in front; a system name or one already in the namespace is kept as is. The
    ``x-mq-namespace`` header plays no part (the proxy reads the resource's field)."""
    namespace, name = resource.resource_namespace, resource.name
    if not namespace or not name:
        return name
    if is_system_topic(name) or name.startswith(SYSTEM_GROUP_PREFIX):
        return name
    bare, prefix = name, ""
    for marker in (RETRY_PREFIX, DLQ_PREFIX):
        if bare.startswith(marker):
            bare, prefix = bare[len(marker):], marker
    if bare.startswith(namespace + NAMESPACE_SEPARATOR):
        return name
    return f"{prefix}{namespace}{NAMESPACE_SEPARATOR}{bare}"


def validate_topic(topic: str) -> None:
    """GrpcValidator.validateTopic on the wrapped name: ILLEGAL_TOPIC."""
    if is_blank(topic):
        raise Refused(definition.ILLEGAL_TOPIC, "topic name cannot be empty")
    if is_system_topic(topic):
        raise Refused(definition.ILLEGAL_TOPIC, "cannot access system topic")
    if java_length(topic) > TOPIC_MAX_LENGTH:
        raise Refused(definition.ILLEGAL_TOPIC, "The specified topic is longer than topic max "
                                                f"length {TOPIC_MAX_LENGTH}.")
    if not VALID_TOPIC.match(topic):
        raise Refused(definition.ILLEGAL_TOPIC, f"The specified topic[{topic}] contains illegal "
                                                f"characters, allowing only {VALID_TOPIC_TEXT}")


def validate_group(group: str) -> None:
    """GrpcValidator.validateConsumerGroup on the wrapped name: ILLEGAL_CONSUMER_GROUP."""
    if is_blank(group):
        raise Refused(definition.ILLEGAL_CONSUMER_GROUP, "consumer group cannot be empty")
    if group.startswith(SYSTEM_GROUP_PREFIX):
        raise Refused(definition.ILLEGAL_CONSUMER_GROUP, "cannot use system consumer group")
    if java_length(group) > GROUP_MAX_LENGTH:
        raise Refused(definition.ILLEGAL_CONSUMER_GROUP, "the specified group is longer than "
                                                         f"group max length {GROUP_MAX_LENGTH}.")
    if not VALID_TOPIC.match(group):
        raise Refused(definition.ILLEGAL_CONSUMER_GROUP,
                      f"the specified group[{group}] contains illegal characters, allowing "
                      f"only {VALID_TOPIC_TEXT}")


def topic_not_found(topic: str) -> Refused:
    """What the proxy answers for a topic the name server has no route for (QueryRoute,
    SendMessage): TOPIC_NOT_FOUND with MQClientException's text."""
    return Refused(definition.TOPIC_NOT_FOUND,
                   f"CODE: {TOPIC_NOT_EXIST}  DESC: No topic route info in name server for the "
                   f"topic: {topic}\nFor more information, please visit the url, {FAQ_URL}")


def unknown_language(language: str) -> str:
    """The text of LanguageCode.valueOf's failure for an x-mq-language the proxy does not
    know (it registers every client under its language), or "" when it is known."""
    return "" if language in LANGUAGE_CODES else f"No enum constant {LANGUAGE_ENUM}.{language}"


# ------------------------------------------------------------------ one message

def validate_tag(tag: str) -> None:
    if not tag:
        return
    if is_blank(tag):
        raise Refused(definition.ILLEGAL_MESSAGE_TAG,
                      "tag cannot be the char sequence of whitespace")
    if "|" in tag:
        raise Refused(definition.ILLEGAL_MESSAGE_TAG, "tag cannot contain '|'")
    if has_control_character(tag):
        raise Refused(definition.ILLEGAL_MESSAGE_TAG, "tag cannot contain control character")


def validate_key(key: str) -> None:
    if not key:
        return
    if is_blank(key):
        raise Refused(definition.ILLEGAL_MESSAGE_KEY,
                      "key cannot be the char sequence of whitespace")
    if has_control_character(key):
        raise Refused(definition.ILLEGAL_MESSAGE_KEY, "key cannot contain control character")


def validate_message_group(group: str, limits: ProxyLimits) -> None:
    if not group:
        return
    if is_blank(group):
        raise Refused(definition.ILLEGAL_MESSAGE_GROUP,
                      "message group cannot be the char sequence of whitespace")
    most = limits.max_message_group_size
    if most > 0 and len(group.encode("utf-8")) >= most:
        raise Refused(definition.ILLEGAL_MESSAGE_GROUP, f"message group exceed the max size {most}")
    if has_control_character(group):
        raise Refused(definition.ILLEGAL_MESSAGE_GROUP,
                      "message group cannot contain control character")


def validate_body(size: int, limits: ProxyLimits) -> None:
    if not size:
        raise Refused(definition.MESSAGE_BODY_EMPTY, "message body cannot be empty")
    most = limits.max_message_size
    if 0 < most < size:
        raise Refused(definition.MESSAGE_BODY_TOO_LARGE,
                      f"message body cannot exceed the max {most}")


def _user_properties_size(properties: Mapping[str, str], limits: ProxyLimits) -> int:
    if len(properties) > limits.user_property_max_num:
        raise Refused(definition.MESSAGE_PROPERTIES_TOO_LARGE,
                      f"too many user properties, max is {limits.user_property_max_num}")
    size = 0
    for key, value in properties.items():
        if key in SYSTEM_PROPERTIES:
            raise Refused(definition.ILLEGAL_MESSAGE_PROPERTY_KEY,
                          f"property is used by system: {key}")
        if has_control_character(key):
            raise Refused(definition.ILLEGAL_MESSAGE_PROPERTY_KEY,
                          "the key of property cannot contain control character")
        if has_control_character(value):
            raise Refused(definition.ILLEGAL_MESSAGE_PROPERTY_KEY,
                          "the value of property cannot contain control character")
        size += len(key.encode("utf-8")) + len(value.encode("utf-8"))
    return size


def _keys_size(keys: Iterable[str]) -> int:
    size = 0
    for key in keys:
        validate_key(key)
        size += len(key.encode("utf-8"))
    return size


def validate_message(message: definition.Message, limits: ProxyLimits, now_ms: int) -> None:
    """SendMessageActivity's checks of one message, in its order."""
    validate_body(len(message.body), limits)
    system = message.system_properties
    size = _user_properties_size(message.user_properties, limits)
    validate_tag(system.tag)
    size += len(system.tag.encode("utf-8"))
    size += _keys_size(system.keys)
    if size > limits.max_user_property_size:
        raise Refused(definition.MESSAGE_PROPERTIES_TOO_LARGE,
                      "the total size of user property is too large, max is "
                      f"{limits.max_user_property_size}")
    if is_blank(system.message_id):
        raise Refused(definition.ILLEGAL_MESSAGE_ID, "message id cannot be empty")
    if system.HasField("delivery_timestamp") and limits.max_delay_ms > 0:
        if system.delivery_timestamp.ToMilliseconds() - now_ms > limits.max_delay_ms:
            raise Refused(definition.ILLEGAL_DELIVERY_TIME, "the max delay time of message is "
                          f"too large, max is {limits.max_delay_ms}")
    validate_message_group(system.message_group, limits)
