"""Our :class:`~rocketmq_spark.client.send.producer.Message` to the proxy's ``Message``, and the
proxy's answer back to :class:`~rocketmq_spark.client.send.producer.SendResult`: pure functions.

The mapping (the 5.x way of saying what 4.x said in properties):

==================  ==========================================================================
``topic``           ``topic.name`` (plus the producer's namespace)
``body``            ``body``, sent as is (``IDENTITY`` encoding)
``tags``            ``system_properties.tag``
``keys``            ``system_properties.keys`` (the proxy stores them space-separated: KEYS)
``properties``      ``user_properties``
``sharding_key``    ``system_properties.message_group``: a FIFO message (``__SHARDINGKEY``)
``delay_level``     ``system_properties.delivery_timestamp`` = now + the level's delay of the
                    4.x table (1s 5s 10s 30s 1m ... 2h): a DELAY message (``TIMER_DELIVER_MS``)
``uniq_key``        ``system_properties.message_id`` (``UNIQ_KEY``); a fresh one when None
``flag``            not carried by the 5.x API: a non-zero flag is refused
==================  ==========================================================================
"""
from __future__ import annotations

import socket
from typing import Any, Dict, List, Sequence

from ..errors import ProtocolError
from ..send.producer import Message, SendResult
from ..protocol.message import new_uniq_key
from ..protocol.route import MessageQueue
from . import definition_pb2 as definition
from . import service_pb2 as service
from . import status

# The delay of each 4.x delay level (messageDelayLevel's default), in seconds.
DELAY_LEVEL_SECONDS = (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200,
                       1800, 3600, 7200)
SEND_OK = "SEND_OK"
UNKNOWN_QUEUE_ID = -1


def _local_ip() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


BORN_HOST = _local_ip()


def message_type(message: Message) -> int:
    """NORMAL, FIFO (a sharding key) or DELAY (a delay level); both at once is refused."""
    if message.sharding_key and message.delay_level:
        raise ValueError("a message cannot have both a sharding_key (FIFO) and a delay_level "
                         "(DELAY) through the 5.x proxy")
    if message.sharding_key:
        return definition.FIFO
    if message.delay_level:
        return definition.DELAY
    return definition.NORMAL


def delivery_millis(delay_level: int, now_ms: int) -> int:
    if not 1 <= delay_level <= len(DELAY_LEVEL_SECONDS):
        raise ValueError(f"delay_level must be 1-{len(DELAY_LEVEL_SECONDS)}, got {delay_level}")
    return now_ms + DELAY_LEVEL_SECONDS[delay_level - 1] * 1000


def _timestamp(millis: int) -> Dict[str, int]:
    """A ``google.protobuf.Timestamp``'s fields for ``millis`` since the epoch."""
    seconds, ms = divmod(millis, 1000)
    return {"seconds": seconds, "nanos": ms * 1_000_000}


def message_fields(message: Message, namespace: str, now_ms: int) -> Dict[str, Any]:
    """The proxy's ``Message`` for ``message`` as constructor arguments (nested messages as
    dicts), so a request builds it in place (:func:`.send_calls.build_request`): cheaper than
    building a ``Message`` and copying it in. Raises ValueError for what the 5.x API
    cannot carry; the message id is the message's ``uniq_key``, or a fresh one."""
    if message.flag:
        raise ValueError(f"flag={message.flag}: the 5.x proxy API has no message flag")
    kind = message_type(message)
    keys = message.keys
    system = {"tag": message.tags or None,
              "keys": None if not keys else (keys,) if isinstance(keys, str) else keys,
              "message_id": message.uniq_key or new_uniq_key(),
              "body_encoding": definition.IDENTITY, "message_type": kind,
              "born_timestamp": _timestamp(now_ms), "born_host": BORN_HOST}
    if kind == definition.FIFO:
        system["message_group"] = message.sharding_key
    elif kind == definition.DELAY:
        system["delivery_timestamp"] = _timestamp(delivery_millis(message.delay_level, now_ms))
    return {"topic": {"name": message.topic, "resource_namespace": namespace},
            "user_properties": message.properties or None, "system_properties": system,
            "body": bytes(message.body)}


def send_results(response: service.SendMessageResponse, message_ids: Sequence[str],
                 queue: MessageQueue, address: str) -> List[SendResult]:
    """One :class:`SendResult` per message sent, or the error the proxy reported.

    A call of several messages is stored as one batch: the proxy answers one entry whose
    ``message_id`` lists every id (comma-separated) and whose offset is the first message's.
    ``queue`` is what we know of the queue (the proxy does not say which it chose)."""
    entries = response.entries
    if len(message_ids) == 1 and len(entries) == 1:  # one message per call: the usual case
        entry = entries[0]
        if response.status.code not in status.OK_CODES or entry.status.code not in status.OK_CODES:
            status.check(response.status, "SendMessage", address)
            status.check(entry.status, "SendMessage", address)
        return [SendResult(SEND_OK, entry.message_id or message_ids[0], "", queue,
                           entry.offset)]
    status.check(response.status, "SendMessage", address)
    entries = list(entries)
    for entry in entries:
        status.check(entry.status, "SendMessage", address)
    n = len(message_ids)
    if len(entries) == n:
        pairs = [(e.message_id or mid, e.offset) for e, mid in zip(entries, message_ids)]
    elif len(entries) == 1 and n > 1:
        ids = entries[0].message_id.split(",")
        if len(ids) != n:
            raise ProtocolError(f"SendMessage of {n} messages to proxy {address} was answered "
                                f"with {len(ids)} message ids")
        pairs = [(mid, entries[0].offset + i) for i, mid in enumerate(ids)]
    else:
        raise ProtocolError(f"SendMessage of {n} messages to proxy {address} was answered with "
                            f"{len(entries)} entries")
    return [SendResult(SEND_OK, mid, "", queue, offset) for mid, offset in pairs]
