"""How the embedded 5.x proxy turns a gRPC SendMessage into the broker request Apache's proxy
sends, and the broker's answer back into a SendMessageResponse.

Kept apart from the servicer (:mod:`.grpc_proxy`) because it is the part that must match the
genuine proxy byte for byte: the refusals (code and message), the stored properties in a Java
HashMap's order, and a multi-message call sent as one SEND_BATCH_MESSAGE whose header carries
the first message's properties.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from ..client.grpc import definition_pb2 as definition
from ..client.grpc import service_pb2 as service
from ..client.protocol.codes import SEND_V2_KEYS, RequestCode, ResponseCode
from ..client.protocol.frame import RemotingCommand
from ..client.protocol.message import BatchEntry, encode_batch
from ..client.protocol.properties import (
    KEYS, SHARDING_KEY, TAGS, UNIQ_KEY, encode_properties, java_hashmap_order,
)
from .grpc_delivery import TIMER_DELIVER_MS, TRACE_CONTEXT
from .grpc_validation import ProxyLimits, Refused, status, validate_message, validate_topic, wrap

# Broker answers to the proxy's status codes (what the proxy reports for a failed send).
BROKER_CODES = {
    ResponseCode.TOPIC_NOT_EXIST: definition.TOPIC_NOT_FOUND,
    ResponseCode.NO_PERMISSION: definition.FORBIDDEN,
    ResponseCode.MESSAGE_ILLEGAL: definition.BAD_REQUEST,
    ResponseCode.SYSTEM_BUSY: definition.TOO_MANY_REQUESTS,
    ResponseCode.FLOW_CONTROL: definition.TOO_MANY_REQUESTS,
    ResponseCode.SERVICE_NOT_AVAILABLE: definition.INTERNAL_SERVER_ERROR,
}

_V2 = {name: SEND_V2_KEYS.get(name, name) for name in (
    "producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
    "bornTimestamp", "flag", "properties", "reconsumeTimes", "bname", "batch")}


OK = status(definition.OK)


class PropertiesEncoder:
    """The stored properties text of one message, in the proxy's order (a Java HashMap's).
    The order depends on the property names alone, which repeat, so it is remembered."""

    def __init__(self) -> None:
        self._orders: Dict[Tuple[str, ...], List[str]] = {}

    def encode(self, message: definition.Message, topic: str) -> str:
        props = _properties(message, topic)
        names = tuple(props)
        order = self._orders.get(names)
        if order is None:
            order = self._orders[names] = java_hashmap_order(names)
            if len(self._orders) > 4096:
                self._orders.clear()
        try:
            return encode_properties({k: props[k] for k in order}, trailing_separator=False)
        except ValueError as exc:
            raise Refused(definition.ILLEGAL_MESSAGE_PROPERTY_KEY, str(exc)) from None


def _properties(message: definition.Message, topic: str) -> Dict[str, str]:
    props: Dict[str, str] = dict(message.user_properties)  # (checked: grpc_validation)
    system = message.system_properties
    if system.tag:
        props[TAGS] = system.tag
    if system.keys:
        props[KEYS] = " ".join(system.keys)
    props[UNIQ_KEY] = system.message_id
    if system.HasField("delivery_timestamp"):
        props[TIMER_DELIVER_MS] = str(system.delivery_timestamp.ToMilliseconds())
    props["RECONSUME_TIME"] = str(system.delivery_attempt)
    props["PGROUP"] = topic
    if system.message_group:
        props[SHARDING_KEY] = system.message_group
    if system.trace_context:
        props[TRACE_CONTEXT] = system.trace_context
    return props


def checked_properties(messages: Sequence[definition.Message], limits: ProxyLimits,
                       encoder: PropertiesEncoder, now_ms: int) -> Tuple[str, List[str]]:
    """The call's topic (namespace-wrapped) and each message's properties text; refuses a call
    as SendMessageActivity does, in its order (no message, the topic's name, then each
    message: another topic, then :func:`.grpc_validation.validate_message`)."""
    if not messages:
        raise Refused(definition.MESSAGE_CORRUPTED, "no message to send")
    first_topic = messages[0].topic
    topic = wrap(first_topic)
    validate_topic(topic)
    properties = []
    for m in messages:
        if m.topic != first_topic:
            raise Refused(definition.MESSAGE_CORRUPTED, "topic in message is not same")
        validate_message(m, limits, now_ms)
        properties.append(encoder.encode(m, topic))
    return topic, properties


def broker_request(messages: Sequence[definition.Message], properties: Sequence[str],
                   topic: str, queue_id: int, broker_name: str) -> RemotingCommand:
    """SEND_MESSAGE_V2 for one message, else one SEND_BATCH_MESSAGE whose header carries the
    first message's properties (as Apache's proxy sends it)."""
    first = messages[0]
    fields = {_V2["producerGroup"]: topic, _V2["topic"]: topic, _V2["defaultTopic"]: "TBW102",
              _V2["defaultTopicQueueNums"]: "4", _V2["queueId"]: str(queue_id),
              _V2["sysFlag"]: "0",
              _V2["bornTimestamp"]: str(first.system_properties.born_timestamp.ToMilliseconds()),
              _V2["flag"]: "0", _V2["properties"]: properties[0],
              _V2["reconsumeTimes"]: "0", _V2["bname"]: broker_name}
    if len(messages) == 1:
        return RemotingCommand(RequestCode.SEND_MESSAGE_V2, fields, bytes(first.body))
    fields[_V2["batch"]] = "true"
    body = encode_batch([BatchEntry(bytes(m.body), props, 0)
                         for m, props in zip(messages, properties)])
    return RemotingCommand(RequestCode.SEND_BATCH_MESSAGE, fields, body)


def send_response(messages: Sequence[definition.Message],
                  response: RemotingCommand) -> service.SendMessageResponse:
    """The broker's answer as the proxy reports it: one entry per call (a batch's ids
    comma-separated), or the refusal mapped to the proxy's status code."""
    if response.code != ResponseCode.SUCCESS:
        raise Refused(BROKER_CODES.get(response.code, definition.INTERNAL_SERVER_ERROR),
                      response.remark or "")
    ids = ",".join(m.system_properties.message_id for m in messages)
    entry = service.SendResultEntry(status=OK, message_id=ids,
                                    offset=int(response.fields.get("queueOffset", "0")))
    return service.SendMessageResponse(status=OK, entries=[entry])
