"""The sink's delivery guarantees, one type each, chosen once from the options.

* :class:`AtLeastOnce` (the default): rows sent as messages; a task Spark runs again sends
  them again with the same message ids (:func:`.task.write_task`, over remoting or gRPC).
* :class:`ExactlyOnce` (``deliveryGuarantee=exactlyOnce``): rows sent as half messages that
  the driver's commit settles (:func:`.exactly_once_task.write_halves`, :mod:`.exactly_once`).
* :class:`SendBack` (``sendBack``): rows are messages the source read, sent back to their
  consumer group for redelivery (:mod:`.send_back`); its input has a schema of its own.

:func:`delivery_of` picks one on the driver, where the options are read; the writers hand it
to their tasks, and no layer below asks the options again which guarantee applies.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Iterable, Union

import pyarrow as pa
from pyspark.sql.types import StructType

from ..options import OptionError
from .exactly_once_task import half_message_properties, write_halves
from .ids import TaskIdentity
from .options import SinkOptions
from .schema import ColumnPlan, plan_columns
from .send_back import send_back_task
from .send_back_columns import SendBackPlan, plan_send_back
from .task import TaskSummary, write_task
from .transport import shared_producer

Plan = Union[ColumnPlan, SendBackPlan]


class Delivery(ABC):
    """One guarantee: the input columns it needs, and how a task sends its rows."""

    name = "delivery"

    def plan(self, schema: StructType, options: SinkOptions) -> Plan:
        """The input columns' roles; raises naming a column this guarantee cannot take."""
        return plan_columns(schema, options.topic)

    @abstractmethod
    def write(self, batches: Iterable[pa.RecordBatch], plan: Plan, options: SinkOptions,
              identity: TaskIdentity, group: str) -> TaskSummary:
        """Send one task's rows (``identity`` names the task attempt's query or job, batch and
        partition); returns once all are acknowledged, or raises."""


class AtLeastOnce(Delivery):
    """Messages, acknowledged before the task ends; a retried task sends them again."""

    name = "atLeastOnce"

    def write(self, batches: Iterable[pa.RecordBatch], plan: Plan, options: SinkOptions,
              identity: TaskIdentity, group: str) -> TaskSummary:
        return write_task(batches, plan, options, identity, group)


class ExactlyOnce(Delivery):
    """Half messages of a transaction, one write token per task attempt; the driver commits
    the attempts Spark keeps and rolls back the others."""

    name = "exactlyOnce"

    def plan(self, schema: StructType, options: SinkOptions) -> Plan:
        plan = plan_columns(schema, options.topic)
        if plan.delay_level:
            raise OptionError(f"column {plan.delay_level}: delayed messages cannot be sent "
                              "with deliveryGuarantee=exactlyOnce (RocketMQ's transactional "
                              "messages carry no delay level); drop the column or use "
                              "atLeastOnce")
        return plan

    def write(self, batches: Iterable[pa.RecordBatch], plan: Plan, options: SinkOptions,
              identity: TaskIdentity, group: str) -> TaskSummary:
        batch_id = identity.batch_id if identity.batch_id is not None else 0
        return write_halves(batches, plan, options, identity, group,
                            half_message_properties(group, identity.scope, batch_id))


class SendBack(Delivery):
    """Rows the source read, sent back to the ``sendBack`` group (CONSUMER_SEND_MSG_BACK),
    at least once."""

    name = "sendBack"

    def plan(self, schema: StructType, options: SinkOptions) -> Plan:
        return plan_send_back(schema, options.send_back or "")

    def write(self, batches: Iterable[pa.RecordBatch], plan: Plan, options: SinkOptions,
              identity: TaskIdentity, group: str) -> TaskSummary:
        return send_back_task(batches, plan, options, identity, shared_producer(options), group)


def delivery_of(options: SinkOptions) -> Delivery:
    """The guarantee the options ask for."""
    if options.send_back:
        return SendBack()
    if options.exactly_once:
        return ExactlyOnce()
    return AtLeastOnce()
