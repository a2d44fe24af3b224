"""The send path's planning: which SendMessage calls one ``send_async`` becomes, what is
refused before anything is sent, and how many messages may wait for an answer.

A message with a sharding key (FIFO) goes alone in its call, tagged with its group so the
dispatcher sends a group's calls one after another; the proxy stores it in its group's queue,
which the client predicts. The other messages go one per call, or all in one call when the
producer packs them (``multi_message_calls``; see the producer's module docstring for why that
is off by default).
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Sequence

from ..errors import ClientClosed, RequestTimeout
from ..send.producer import Message
from ..protocol.route import MessageQueue
from . import convert
from . import definition_pb2 as definition
from . import service_pb2 as service
from .dispatch import Call
from .queue_choice import queue_for_group
from .routes import TopicRoute


class CallContext(NamedTuple):
    """What the producer keeps of a call: the places of its messages in the send, their
    message ids, and what is known of the queue the proxy will choose."""

    indexes: Sequence[int]
    message_ids: Sequence[str]
    queue: MessageQueue


def check_messages(messages: Sequence[Message], route: TopicRoute, max_body_size: int) -> None:
    """Raise ValueError for a message the proxy would refuse: an empty body, one over the
    largest body the proxy takes, or a message type the topic does not take."""
    accepts = route.accepts
    for i, message in enumerate(messages):
        size = len(message.body)
        if size == 0:
            raise ValueError(f"message {i} of the call has an empty body; the 5.x proxy "
                             "refuses empty bodies")
        if size > max_body_size:
            raise ValueError(f"message {i} of the call has a body of {size:,} bytes; the "
                             f"proxy takes at most {max_body_size:,}")
        kind = convert.message_type(message)
        if accepts and kind not in accepts:
            taken = ", ".join(sorted(_type_name(t) for t in accepts))
            raise ValueError(f"topic {message.topic!r} takes {taken} messages only; message "
                             f"{i} is {_type_name(kind)}")


def _type_name(kind: int) -> str:
    try:
        return definition.MessageType.Name(kind)
    except ValueError:
        return str(kind)


def plan_calls(messages: Sequence[Message], route: TopicRoute, namespace: str,
               multi_message_calls: bool,
               on_done: Callable[[Call, list, BaseException], None]) -> List[Call]:
    """The calls that send ``messages`` (one topic), in the order they should start: the
    plain messages (packed in one call when ``multi_message_calls``), then the FIFO ones."""
    now_ms = int(time.time() * 1000)
    fields = [convert.message_fields(m, namespace, now_ms) for m in messages]
    ids = [f["system_properties"]["message_id"] for f in fields]
    topic = messages[0].topic
    unknown = MessageQueue(topic, "", convert.UNKNOWN_QUEUE_ID)
    calls: List[Call] = []
    plain = [i for i, m in enumerate(messages) if not m.sharding_key]
    if multi_message_calls and len(plain) > 1:
        calls.append(Call(build_request(fields[i] for i in plain), None, on_done,
                          CallContext(plain, [ids[i] for i in plain], unknown)))
        plain = []
    for i in plain:
        calls.append(Call(build_request((fields[i],)), None, on_done,
                          CallContext((i,), (ids[i],), unknown)))
    for i, message in enumerate(messages):
        group = message.sharding_key
        if group:
            queue = queue_for_group(route.queues, group) if route.queues else unknown
            calls.append(Call(build_request((fields[i],)), group, on_done,
                              CallContext((i,), (ids[i],), queue)))
    return calls


def build_request(messages: Iterable[Dict[str, Any]]) -> service.SendMessageRequest:
    """A SendMessageRequest of messages given as :func:`convert.message_fields`, each built
    in place."""
    request = service.SendMessageRequest()
    add = request.messages.add
    for fields in messages:
        add(**fields)
    return request


class SendBudget:
    """How many messages may be submitted and not yet answered: a send waits for room (a send
    larger than the whole budget goes alone)."""

    def __init__(self, limit: int):
        self.limit = limit
        self._used = 0
        self._closed = False
        self._cv = threading.Condition()

    def take(self, n: int, timeout: float, address: str) -> None:
        with self._cv:
            if not self._cv.wait_for(lambda: self._closed or self._used == 0
                                     or self._used + n <= self.limit, timeout):
                raise RequestTimeout(address, "SendMessage (waiting for queue space)", timeout)
            if self._closed:
                raise ClientClosed("the GrpcProducer is closed")
            self._used += n

    def give(self, n: int) -> None:
        with self._cv:
            self._used -= n
            self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
