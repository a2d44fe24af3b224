"""The message type a 5.x topic is published with, asked of its brokers.

A 5.x topic carries ``+message.type`` (NORMAL, FIFO, DELAY, TRANSACTION, MIXED) in its topic
config's ``attributes``; a broker answers the config to GET_TOPIC_CONFIG (351) with the
attributes in the body. A 4.x broker does not serve the request (REQUEST_CODE_NOT_SUPPORTED)
and knows no types; neither does a 5.x proxy's remoting port (it does not serve 351 either).
"""
from __future__ import annotations

import json
from typing import Dict, Optional

from .errors import ProtocolError, RocketMQError
from .masters import masters
from .nameserver import NameServerClient
from .protocol.codes import ResponseCode
from .protocol.frame import RemotingCommand
from .remoting import RemotingClient

GET_TOPIC_CONFIG = 351
TYPE_ATTRIBUTE = "message.type"


def broker_topic_type(remoting: RemotingClient, address: str, topic: str) -> Optional[str]:
    """The ``message.type`` the broker at ``address`` publishes for ``topic``, or None when it
    publishes none (a 4.x broker, no such topic there, or no attribute)."""
    cmd = RemotingCommand(code=GET_TOPIC_CONFIG, ext_fields={"topic": topic, "lo": "true"})
    answer = remoting.invoke(address, cmd, timeout=5)
    if answer.code != ResponseCode.SUCCESS:
        return None  # REQUEST_CODE_NOT_SUPPORTED (4.x), TOPIC_NOT_EXIST, ...
    try:
        attributes = json.loads(answer.body or b"{}").get("attributes") or {}
    except (ValueError, AttributeError):
        raise ProtocolError(f"GET_TOPIC_CONFIG answer of {address} for {topic} is not a topic "
                            "config", 0, "topic config body", answer.body) from None
    value = attributes.get(TYPE_ATTRIBUTE)
    return str(value) if value is not None else None


def published_types(remoting: RemotingClient, names: NameServerClient,
                    topic: str) -> Dict[str, Optional[str]]:
    """Broker name -> the type its master publishes for ``topic`` (None: none published or
    not reachable now; the write says so when it sends)."""
    types: Dict[str, Optional[str]] = {}
    for broker_name, address in masters((names.route(topic),)).items():
        try:
            types[broker_name] = broker_topic_type(remoting, address, topic)
        except RocketMQError:
            types[broker_name] = None
    return types
