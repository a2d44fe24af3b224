"""Min and max offsets of many queues in one request per topic and broker.

GET_MAX_OFFSET asks for one queue. A stream over a thousand queues that refreshes its max
offsets several times a second would send thousands of requests a second to idle brokers.
GET_TOPIC_STATS_INFO (a broker's AdminBrokerProcessor answers it in 4.x and 5.x) gives every
queue of a topic on that broker with its min and max offset (the same store calls as
GET_MIN_OFFSET and GET_MAX_OFFSET), so one request serves them all.

Where it is not served, the queues are asked one by one, as before:

* a node that refuses the request (a 5.x proxy's remoting port answers
  REQUEST_CODE_NOT_SUPPORTED; an ACL may refuse it; a body we cannot read) is remembered and
  asked one queue at a time for :data:`REPROBE_SECONDS` before it is tried again;
* TOPIC_NOT_EXIST (the broker does not have the topic yet): this lookup only;
* a busy answer (SYSTEM_BUSY, FLOW_CONTROL, GO_AWAY) maps the queues to that error for this
  lookup, as it would each single request;
* a queue missing from the table (4.9.8 lists the first ``writeQueueNums`` queues; a topic
  with more read queues than write queues has the others only through GET_MAX_OFFSET).

An unreachable node maps each of its queues to the error, as the per-queue lookups do, so the
caller's retry at another node of the broker works the same.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from .broker import BrokerClient, command
from .errors import ProtocolError, RocketMQError
from .protocol.codes import RequestCode, ResponseCode
from .protocol.route import MessageQueue
from .protocol.topic_stats import parse_topic_stats
from .responses import response_error

log = logging.getLogger(__name__)

OffsetAnswer = Union[int, None, RocketMQError]
REPROBE_SECONDS = 300.0
# a topic's queues on one node are asked in one request from this many on
MIN_QUEUES = 2
BUSY = frozenset({ResponseCode.SYSTEM_BUSY, ResponseCode.FLOW_CONTROL, ResponseCode.GO_AWAY})


def topic_stats_command(topic: str, broker_name: str):
    """GET_TOPIC_STATS_INFO (GetTopicStatsInfoRequestHeader: ``topic``); ``bname`` as every
    queue request of ours carries it (a 5.x proxy routes by it; brokers ignore it)."""
    return command(RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic, "bname": broker_name})


class TopicStatsLookups:
    """Bulk min/max lookups over one request per (node, topic), with the per-queue fallback.

    ``topic_queues(topic, broker_name)``: how many readable queues the route gives the topic
    on that broker (None when unknown); a lookup that asks for fewer than a quarter of them
    is cheaper one queue at a time than as the whole table."""

    def __init__(self, brokers: BrokerClient,
                 topic_queues: Optional[Callable[[str, str], Optional[int]]] = None,
                 clock: Callable[[], float] = time.monotonic):
        self.brokers = brokers
        self._topic_queues = topic_queues
        self._clock = clock
        self._refused: Dict[str, float] = {}  # address -> when it refused
        self._lock = threading.Lock()

    def refuses(self, address: str) -> bool:
        """Whether ``address`` is asked one queue at a time for now."""
        with self._lock:
            since = self._refused.get(address)
            if since is None:
                return False
            if self._clock() - since >= REPROBE_SECONDS:
                del self._refused[address]  # ask it again
                return False
            return True

    def _remember_refusal(self, address: str, why: str) -> None:
        with self._lock:
            first = address not in self._refused
            self._refused[address] = self._clock()
        if first:
            log.info("%s does not serve GET_TOPIC_STATS_INFO (%s): its offsets are looked up "
                     "one queue at a time; asked again in %.0f s", address, why,
                     REPROBE_SECONDS)

    def _worth_a_table(self, address: str, topic: str, broker_name: str, asked: int) -> bool:
        if asked < MIN_QUEUES or self.refuses(address):
            return False
        total = self._topic_queues(topic, broker_name) if self._topic_queues else None
        return total is None or asked * 4 >= total

    def queue_offsets(self, kind: str, targets: Sequence[Tuple[str, MessageQueue]],
                      timeout: Optional[float] = None) -> Dict[MessageQueue, OffsetAnswer]:
        """``kind`` ``"min"`` or ``"max"`` of each ``(address, queue)``, as
        :meth:`BrokerClient.queue_offsets` answers them, every request sent before any
        answer is awaited."""
        groups: Dict[Tuple[str, str, str], List[MessageQueue]] = {}
        single: List[Tuple[str, MessageQueue]] = []
        for address, mq in targets:
            groups.setdefault((address, mq.topic, mq.broker_name), []).append(mq)
        sent = []
        out: Dict[MessageQueue, OffsetAnswer] = {}
        for (address, topic, broker_name), queues in groups.items():
            if not self._worth_a_table(address, topic, broker_name, len(queues)):
                single.extend((address, mq) for mq in queues)
                continue
            try:
                sent.append((address, topic, queues, self.brokers.remoting.send(
                    address, topic_stats_command(topic, broker_name))))
            except RocketMQError as exc:
                out.update((mq, exc) for mq in queues)
        # the per-queue requests go out before the tables are awaited
        pending_single = self.brokers.queue_offsets(kind, single, timeout=timeout) \
            if single else {}
        retry: List[Tuple[str, MessageQueue]] = []
        for address, topic, queues, pending in sent:
            found, rest = self._table_answer(kind, address, topic, queues, pending, timeout)
            out.update(found)
            retry.extend((address, mq) for mq in rest)
        out.update(pending_single)
        if retry:
            out.update(self.brokers.queue_offsets(kind, retry, timeout=timeout))
        return out

    def _table_answer(self, kind: str, address: str, topic: str, queues: List[MessageQueue],
                      pending, timeout: Optional[float]
                      ) -> Tuple[Dict[MessageQueue, OffsetAnswer], List[MessageQueue]]:
        """The offsets the table gives, and the queues to ask one by one."""
        try:
            response = self.brokers.remoting.wait(pending, timeout)
        except RocketMQError as exc:  # unreachable: the caller may try another node
            return {mq: exc for mq in queues}, []
        if response.code == ResponseCode.TOPIC_NOT_EXIST:
            return {}, list(queues)
        if response.code != ResponseCode.SUCCESS:
            error = response_error(response, "GET_TOPIC_STATS_INFO", address)
            if response.code in BUSY:  # a thousand single requests would not help it
                return {mq: error for mq in queues}, []
            self._remember_refusal(address, str(error))
            return {}, list(queues)
        try:
            rows = parse_topic_stats(response.body)
        except ProtocolError as exc:
            self._remember_refusal(address, str(exc))
            return {}, list(queues)
        by_id = {row.queue_id: row for row in rows if row.topic == topic}
        found: Dict[MessageQueue, OffsetAnswer] = {}
        rest = []
        for mq in queues:
            row = by_id.get(mq.queue_id)
            if row is None:
                rest.append(mq)
            else:
                found[mq] = row.max_offset if kind == "max" else row.min_offset
        return found, rest
