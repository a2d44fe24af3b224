"""When a broker refuses CONSUMER_SEND_MSG_BACK: the message itself to the retry topic.

As the catch block of Java's ``DefaultMQPushConsumerImpl.sendMessageBack``
(``sendMessageBackAsNormalMessage``) and its producer's ``sendKernelImpl`` for a retry topic:
a new message to ``%RETRY%<group>`` with the body and properties as read, ``ORIGIN_MESSAGE_ID``
(kept, or the row's msgId), ``RETRY_TOPIC`` (the topic it was first read from), the delay level
``3 + reconsumeTimes``, and the send header's ``reconsumeTimes`` (+1) and
``maxReconsumeTimes`` (the broker puts it into the dead-letter topic once it is over). Sent to
another broker than the one that refused when the retry topic has one.
"""
from __future__ import annotations

import random
from typing import Dict, List, Optional

from ..client.errors import RocketMQError
from ..client.masters import masters
from ..client.group.send_back import retry_copy_command, retry_copy_master, retry_copy_refusal
from ..client.namespace import RETRY_PREFIX, wrap
from ..client.send.producer import Producer
from ..client.protocol.message import COMPRESSION_ZLIB, compress_body, new_uniq_key
from ..client.protocol.properties import (
    DELAY, KEYS, TAGS, UNIQ_KEY, encode_properties,
)
from ..client.protocol.route import MessageQueue
from .options import SinkOptions
from .send_back_columns import MessageRead

ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
RETRY_TOPIC = "RETRY_TOPIC"
RECONSUME_TIME = "RECONSUME_TIME"
MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
TRAN_MSG = "TRAN_MSG"
FIRST_DELAY_LEVEL = 3  # Java's fallback: 3 + the reconsume count (10 s on a default broker)


def retry_properties(message: MessageRead, namespace: str) -> Dict[str, str]:
    """The retry copy's properties: the message's own (or, without a properties column, its
    tags and keys), with what Java's fallback sets. RECONSUME_TIME and MAX_RECONSUME_TIMES
    travel in the send header instead, as Java's producer moves them there."""
    props: Dict[str, str] = dict(message.properties or {})
    if message.properties is None:
        if message.tags:
            props[TAGS] = message.tags
        if message.keys:
            props[KEYS] = message.keys
    props[ORIGIN_MESSAGE_ID] = props.get(ORIGIN_MESSAGE_ID) or message.msg_id
    first_topic = (props.get(RETRY_TOPIC) if message.topic.startswith(RETRY_PREFIX) else None)
    props[RETRY_TOPIC] = first_topic or wrap(namespace, message.topic)
    props[DELAY] = str(FIRST_DELAY_LEVEL + message.reconsume_times)
    for name in (RECONSUME_TIME, MAX_RECONSUME_TIMES, TRAN_MSG):
        props.pop(name, None)
    props.setdefault(UNIQ_KEY, new_uniq_key())
    return props


def _targets(queues: List[MessageQueue], avoid: str, attempts: int) -> List[MessageQueue]:
    """Up to ``attempts`` queues, one per broker while brokers last, ``avoid``'s last."""
    by_broker: Dict[str, List[MessageQueue]] = {}
    for queue in queues:
        by_broker.setdefault(queue.broker_name, []).append(queue)
    names = sorted(by_broker, key=lambda name: name == avoid)
    picked = []
    while len(picked) < attempts and any(by_broker.values()):
        for name in names:
            if by_broker[name] and len(picked) < attempts:
                picked.append(by_broker[name].pop(random.randrange(len(by_broker[name]))))
    return picked


def send_to_retry_topic(producer: Producer, message: MessageRead, options: SinkOptions,
                        group: str, producer_group: str, avoid: Optional[str] = None) -> str:
    """Send ``message`` to ``%RETRY%<group>`` (``group`` in its namespace already); returns
    the broker that stored it. Raises the last refusal when no broker would."""
    topic = RETRY_PREFIX + group
    props = retry_properties(message, options.namespace)
    origin = wrap(options.namespace, message.topic)
    body, sys_flag = message.body, 0
    if 0 <= options.compress_over <= len(body):
        body, sys_flag = compress_body(body, COMPRESSION_ZLIB)
    last: Optional[Exception] = None
    queues = producer.queues(topic) + _elsewhere(producer, topic, origin, avoid)
    for queue in _targets(queues, avoid or "", options.retries + 1):
        request = retry_copy_command(queue, producer_group, body, encode_properties(props),
                                     sys_flag, message.reconsume_times + 1,
                                     options.max_reconsume_times,
                                     producer.default_topic_queue_nums)
        try:
            address = retry_copy_master(producer.names, queue, origin)
            response = producer.remoting.invoke(address, request, options.send_timeout_ms / 1e3)
        except RocketMQError as exc:
            last = exc
            continue
        last = retry_copy_refusal(response, address)
        if last is None:
            return queue.broker_name
    raise last or RocketMQError(f"no writable queue of {topic}")


def _elsewhere(producer: Producer, topic: str, origin: str, avoid: Optional[str]
               ) -> List[MessageQueue]:
    """When the retry topic is on the refusing broker only: queue 0 of it on the other brokers
    of the original topic (a broker creates a retry topic a message is sent to, with one
    queue, even where topics are not created on first send)."""
    try:
        here = {q.broker_name for q in producer.queues(topic)}
        if here - {avoid}:
            return []
        routed = masters((producer.names.route(origin),))
    except RocketMQError:
        return []
    return [MessageQueue(topic, name, 0) for name in routed if name not in here]
