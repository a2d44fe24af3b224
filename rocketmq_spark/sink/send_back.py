"""``sendBack``: messages a pipeline could not process go back to RocketMQ for redelivery.

What a Java push consumer does with a message its listener gave up on
(``DefaultMQPushConsumerImpl.sendMessageBack``), for rows our source read:

* CONSUMER_SEND_MSG_BACK to the master of the row's ``brokerName``: the broker takes the
  message back from its commit log by ``commitLogOffset`` and stores it in ``%RETRY%<group>``
  (through its delay levels), or, once it has been delivered ``maxReconsumeTimes`` times again
  (or ``delayLevel`` is -1), in ``%DLQ%<group>``. ``delayLevel`` 0 (or no column) lets the
  broker choose (3 + the reconsume count).
* When that broker refuses, cannot be reached or is not in the route: as Java's catch block,
  the message itself is sent to ``%RETRY%<group>`` (:mod:`.send_back_fallback`), on another
  broker when one is there.

Delivery is at least once: a task Spark runs again sends its rows back again.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, List, Optional, Tuple

import pyarrow as pa

from ..client.errors import RocketMQError
from ..client.masters import master_address, routes_of
from ..client.namespace import retry_topic, wrap
from ..client.send.producer import Producer
from ..client.group.send_back import send_back_command, send_back_refusal
from .ids import TaskIdentity
from .options import SinkOptions
from .send_back_columns import MessageRead, SendBackPlan
from .send_back_fallback import send_to_retry_topic
from .task import SinkWriteError, TaskSummary

log = logging.getLogger(__name__)
IN_FLIGHT = 64  # requests sent before their answers are awaited


@dataclass
class SendBackStats:
    """What a task sent back: by CONSUMER_SEND_MSG_BACK, and as messages to the retry topic
    because a broker refused (by the reason, e.g. the broker's answer)."""

    rows: int = 0
    sent_back: int = 0
    by_broker: Counter = field(default_factory=Counter)
    fallback_reasons: Counter = field(default_factory=Counter)

    @property
    def fallbacks(self) -> int:
        return sum(self.fallback_reasons.values())


class SendBackError(RocketMQError):
    """A row that could neither be sent back nor sent to the retry topic; names it."""


def _delay(value, message_row: int) -> int:
    level = 0 if value is None else int(value)
    if level < -1 or level > 18:
        raise SendBackError(f"row {message_row}: delayLevel {level} is not -1 (straight to "
                            "the dead-letter topic), 0 (the broker's choice) or 1-18")
    return level


def messages_of(batch: pa.RecordBatch, plan: SendBackPlan, first_row: int) -> List[MessageRead]:
    """The batch's rows as :class:`MessageRead`; a null identity column fails naming it."""
    data = {name: batch.column(col).to_pylist() for name, col in plan.columns.items()}
    for name, values in data.items():
        if None in values:
            row = first_row + values.index(None)
            raise SendBackError(f"row {row}: column {plan[name]} is null; a row sent back must "
                                "be a message as the rocketmq source read it")
    n = batch.num_rows
    optional = {key: (batch.column(col).to_pylist() if col else [None] * n)
                for key, col in (("properties", plan.properties), ("tags", plan.tags),
                                 ("keys", plan.keys), ("delay", plan.delay_level))}
    out = []
    for i in range(n):
        props = optional["properties"][i]
        out.append(MessageRead(
            first_row + i, data["topic"][i], data["brokerName"][i],
            int(data["commitLogOffset"][i]), data["msgId"][i], bytes(data["body"][i]),
            int(data["reconsumeTimes"][i]), dict(props) if props is not None else None,
            optional["tags"][i], optional["keys"][i],
            _delay(optional["delay"][i], first_row + i)))
    return out


class SendBack:
    """Sends one task's rows back for ``options.send_back``, over the process's producer."""

    def __init__(self, producer: Producer, options: SinkOptions, producer_group: str):
        self.producer = producer
        self.options = options
        self.namespace = options.namespace
        self.group = wrap(options.namespace, options.send_back or "")
        self.producer_group = producer_group
        self.timeout = options.send_timeout_ms / 1000.0
        self.stats = SendBackStats()

    def _address(self, message: MessageRead) -> str:
        """The master of the row's broker (as Java's ``findBrokerAddressInPublish``), from the
        route of the topic it was read from, else of the group's retry topic (a row read
        from a retry queue carries its original topic)."""
        topics = (wrap(self.namespace, message.topic),
                  retry_topic(self.namespace, self.options.send_back or ""))
        return master_address(routes_of(self.producer.names.route, topics),
                              message.broker_name, f"no master of {message.broker_name} is in "
                              f"the route of {message.topic} or of the group's retry topic")

    def send(self, messages: Iterable[MessageRead]) -> None:
        """Send back every message (IN_FLIGHT at a time); each one a broker refuses goes to the
        retry topic as a message of its own. Raises :class:`SendBackError` for a row that
        could go neither way."""
        batch: List[MessageRead] = []
        for message in messages:
            batch.append(message)
            if len(batch) >= IN_FLIGHT:
                self._send_some(batch)
                batch = []
        if batch:
            self._send_some(batch)

    def _send_some(self, messages: List[MessageRead]) -> None:
        pending: List[Tuple[MessageRead, Optional[str], object]] = []
        for message in messages:
            try:
                address = self._address(message)
                origin = wrap(self.namespace, message.topic)
                request = send_back_command(
                    message.commit_log_offset, self.group, message.delay_level, message.msg_id,
                    origin, self.options.max_reconsume_times, broker_name=message.broker_name)
                pending.append((message, address,
                                self.producer.remoting.send(address, request)))
            except RocketMQError as exc:
                pending.append((message, None, exc))
        for message, address, sent in pending:
            self.stats.rows += 1
            failure = sent if isinstance(sent, RocketMQError) else None
            if failure is None:
                try:
                    response = self.producer.remoting.wait(sent, self.timeout)
                    failure = send_back_refusal(response, address or "")
                    if failure is None:
                        self.stats.sent_back += 1
                        self.stats.by_broker[message.broker_name] += 1
                        continue
                except RocketMQError as exc:
                    failure = exc
            self._fall_back(message, failure)

    def _fall_back(self, message: MessageRead, failure: Exception) -> None:
        """Java's catch block: the message to the retry topic, as a message of its own."""
        code = getattr(failure, "code", None)
        reason = f"code {code}" if code is not None else type(failure).__name__
        log.warning("CONSUMER_SEND_MSG_BACK of %s failed (%s); sending it to the retry topic "
                    "as a message", message.describe(), failure)
        if message.properties is None and not self.stats.fallbacks:
            log.warning("the rows sent back have no properties column (read with "
                        "includeProperties=true): the retry topic's copy carries only their "
                        "tags and keys of the message's properties")
        try:
            send_to_retry_topic(self.producer, message, self.options, self.group,
                                self.producer_group, avoid=message.broker_name)
        except RocketMQError as exc:
            raise SendBackError(
                f"{message.describe()} could not be sent back to group {self.group}: the "
                f"broker answered CONSUMER_SEND_MSG_BACK with {failure}, and sending it to the "
                f"retry topic failed too: {exc}") from exc
        self.stats.fallback_reasons[reason] += 1


def send_back_task(batches: Iterable[pa.RecordBatch], plan: SendBackPlan,
                   options: SinkOptions, identity: TaskIdentity, producer: Producer,
                   producer_group: str) -> TaskSummary:
    """Send back every row of ``batches``; returns the task's summary (a request per row; the
    rows sent to the retry topic instead count as retries), or raises naming the row that
    could go nowhere."""
    started = time.monotonic()
    sender = SendBack(producer, options, producer_group)
    row = 0
    try:
        for batch in batches:
            if batch.num_rows:
                sender.send(messages_of(batch, plan, row))
                row += batch.num_rows
    except RocketMQError as exc:
        raise SinkWriteError(
            f"the rocketmq sink's task ({identity.describe()}) failed to send back: {exc}. "
            f"Rows sent back before this stay sent (at least once); Spark runs the task again "
            "and sends them back again") from exc
    stats = sender.stats
    if stats.rows != row:  # every row goes one way or the other; anything else is a bug
        raise AssertionError(f"{row} rows but {stats.rows} sent back")
    summary = TaskSummary(messages=row, requests=row, retries=stats.fallbacks,
                          by_broker=dict(stats.by_broker), partition=identity.partition,
                          seconds=time.monotonic() - started, transport="sendBack")
    log.info("sink task %s: %d rows sent back to group %s (%d by CONSUMER_SEND_MSG_BACK, %d "
             "to the retry topic as messages: %s) in %.2f s", identity.describe(), row,
             sender.group, stats.sent_back, stats.fallbacks,
             dict(stats.fallback_reasons) or "none", summary.seconds)
    return summary
