"""The sink over RocketMQ's remoting protocol (``nameServer``), one transport per guarantee.

* :class:`RemotingTransport` (at least once): rows in SEND_BATCH_MESSAGE batches, single
  sends for delayed rows.
* :class:`HalfMessageTransport` (exactly once): every row a half message of a transaction,
  a request of its own (brokers refuse transactional messages in a batch), written to a queue
  in runs; a run refused other than as busy is rolled back at once.

Both encode their rows column by column (:func:`~rocketmq_spark.client.send.encoding
.encode_columns`) and send through the process's pooled :class:`Producer`.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Sequence, Union

import numpy as np
import pyarrow as pa

from ..client.errors import RocketMQError
from ..client.protocol import properties
from ..client.protocol.route import MessageQueue
from ..client.protocol.send_encode import entries_body, repeated
from ..client.busy import is_busy
from ..client.send.backpressure import refused_in_part
from ..client.send.encoding import (
    BATCH_HEADER_PROPERTIES, HALF_RUN_ROWS, ColumnTooLarge, EncodedColumns, encode_columns,
    property_pieces,
)
from ..client.send.pipeline import Outgoing
from ..client.send.producer import EncodedRequest, EncodedRun, Producer
from ..client.txn.transaction import (
    TRANSACTION_PREPARED_TYPE, HalfSent, Outcome, collect_half_answers, end_transactions,
)
from .options import SinkOptions
from .rows import RowError, SinkRows
from .transport import Prepared, Transport

log = logging.getLogger(__name__)


class RemotingTransport(Transport):
    """At least once over the pooled :class:`Producer` of this process: batches."""

    name = "remoting"

    def __init__(self, producer: Producer, options: SinkOptions, group: str):
        self.producer = producer
        self.options = options
        self.group = group

    def queues(self, topic: str, refresh: bool = False) -> Sequence[MessageQueue]:
        return self.producer.queues(topic, refresh)

    def property_pieces(self, rows: SinkRows) -> List[pa.Array]:
        """The rows' property texts, a column per property."""
        return property_pieces(rows.ids, rows.user_properties, rows.keys, rows.tags,
                               rows.sharding_key, rows.delay)

    def prepare(self, rows: SinkRows) -> Prepared:
        try:
            encoded = encode_columns(rows.body, self.property_pieces(rows),
                                     self.options.compress_over, self.options.max_message_bytes,
                                     rows.topic_of, "maxMessageBytes")
        except ColumnTooLarge as exc:
            raise RowError(f"{rows.where(exc.index)}: {exc}") from None
        return Prepared(rows, encoded.sizes, encoded.compressed, encoded)

    def payload(self, prepared: Prepared, rows: np.ndarray, single: bool
                ) -> Union[EncodedRequest, EncodedRun]:
        encoded: EncodedColumns = prepared.data
        first = int(rows[0])
        first_id = prepared.rows.ids[first].as_py()
        if single:
            return EncodedRequest(encoded.body[first].as_py(),
                                  encoded.properties[first].as_py().decode("utf-8"),
                                  encoded.sys_flag(first), 0, False, first_id)
        return EncodedRequest(entries_body(encoded.entries, rows), BATCH_HEADER_PROPERTIES,
                              encoded.sys_flag(first), 0, True, first_id)

    def start(self, item: Outgoing, queue: MessageQueue) -> Any:
        return self.producer.start(item, queue, self.group)

    def finish(self, handle: Any, timeout: float) -> Sequence[Any]:
        return self.producer.finish(handle, timeout)


class HalfMessageTransport(RemotingTransport):
    """Exactly once: every row a half message of ``group`` carrying ``half_properties``
    (TRAN_MSG, PGROUP, the query, batch and write token), answered one :class:`HalfSent` per
    row; a pipeline may cut a run (:meth:`narrow`)."""

    max_request_rows = HALF_RUN_ROWS

    def __init__(self, producer: Producer, options: SinkOptions, group: str,
                 half_properties: Dict[str, str]):
        super().__init__(producer, options, group)
        self.half_properties = dict(half_properties)

    def property_pieces(self, rows: SinkRows) -> List[pa.Array]:
        text = properties.encode_properties(self.half_properties).encode()
        return super().property_pieces(rows) + [repeated(text, rows.count)]

    def payload(self, prepared: Prepared, rows: np.ndarray, single: bool) -> EncodedRun:
        encoded: EncodedColumns = prepared.data
        taken = pa.array(rows)
        return EncodedRun(encoded.body.take(taken), encoded.properties.take(taken),
                          prepared.rows.ids.take(taken).to_pylist(),
                          encoded.sys_flag(int(rows[0])) | TRANSACTION_PREPARED_TYPE)

    def finish(self, handle: Any, timeout: float) -> List[HalfSent]:
        """The answers of a run of half messages, one :class:`HalfSent` per message.

        Refused as busy in part: :class:`PartlyRefused`, the stored ones stay and the pipeline
        sends the refused ones again (:meth:`narrow`). Any other failure, or a status not
        accepted: the stored ones are rolled back at once (the pipeline sends the whole run
        again), rather than left to the brokers' check-back."""
        address, pending, queue, ids = handle
        accepted = self.options.accept_statuses
        outcomes = collect_half_answers(address, queue.broker_name, pending, ids, timeout)
        if all(error is None and sent.status in accepted for sent, error in outcomes):
            return [sent for sent, _ in outcomes]
        partly = refused_in_part(outcomes)
        if partly is not None and all(sent.status in accepted for _, sent in partly.stored):
            raise partly
        stored = [sent.handle for sent, _ in outcomes if sent is not None]
        if stored:
            try:
                end_transactions(self.producer.remoting, self.group, stored, Outcome.ROLLBACK)
            except RocketMQError as exc:
                log.warning("rolling back %d half messages of a refused run failed (%s); the "
                            "brokers' check-backs will roll them back", len(stored), exc)
        failure = next((e for _, e in outcomes if e is not None and not is_busy(e)), None)
        if failure is not None:
            raise failure
        return [sent for sent, _ in outcomes if sent is not None]

    @staticmethod
    def narrow(run: EncodedRun, positions: Sequence[int]) -> EncodedRun:
        """The run of just the messages at ``positions`` (those a busy broker refused)."""
        taken = pa.array(positions, pa.int64())
        return EncodedRun(run.bodies.take(taken), run.properties.take(taken),
                          [run.ids[i] for i in positions], run.sys_flag, run.flag)
