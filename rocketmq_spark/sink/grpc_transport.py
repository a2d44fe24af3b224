"""The sink through a 5.x proxy's gRPC API (``endpoints``): at least once, a message per row.

The proxy puts names into the namespace itself (the producer sends it), and compresses
nothing the sink would: rows go as :class:`Message` objects, their bodies checked against
the broker's limit here so a row too large fails naming itself.
"""
from __future__ import annotations

from typing import Any, List, Sequence

import numpy as np
import pyarrow as pa

from ..client.protocol.route import MessageQueue
from ..client.protocol.send_encode import byte_lengths
from ..client.send.encoding import ColumnTooLarge, check_columns
from ..client.send.pipeline import Outgoing
from ..client.send.producer import Message
from .options import SinkOptions
from .rows import RowError, SinkRows
from .transport import Prepared, Transport


class GrpcTransport(Transport):
    """A 5.x proxy's gRPC API through ``client.grpc.GrpcProducer`` (one Message per row).

    The producer sends one message per SendMessage call (Apache's proxy stores a call of
    several messages with the first one's properties on all), so a pipeline request is kept to
    ``max_request_rows`` rows: several requests stay in flight and each is answered well
    within the send timeout."""

    name = "grpc"
    max_request_rows = 32

    def __init__(self, producer: Any, options: SinkOptions):
        self.producer = producer
        self.options = options

    def queues(self, topic: str, refresh: bool = False) -> Sequence[MessageQueue]:
        return self.producer.queues(topic, refresh)

    def prepare(self, rows: SinkRows) -> Prepared:
        sizes = byte_lengths(rows.body)
        try:
            check_columns(rows.topic_of, sizes, self.options.max_message_bytes,
                          option="maxMessageBytes")
        except ColumnTooLarge as exc:
            raise RowError(f"{rows.where(exc.index)}: {exc}") from None
        return Prepared(rows, sizes + 64)

    def payload(self, prepared: Prepared, rows: np.ndarray, single: bool) -> List[Message]:
        r = prepared.rows
        index = pa.array(rows)

        def column(values):
            return [None] * len(rows) if values is None else values.take(index).to_pylist()

        topics = ([r.default_topic] * len(rows) if r.topic is None
                  else r.topic.take(index).to_pylist())
        props = column(r.properties_map)
        delay = [0] * len(rows) if r.delay is None else r.delay[rows].tolist()
        return [Message(topic, body, tags=tags, keys=keys, properties=dict(p or []),
                        sharding_key=sk, delay_level=int(d), uniq_key=uid)
                for topic, body, tags, keys, p, sk, d, uid in zip(
                    topics, r.body.take(index).to_pylist(), column(r.tags), column(r.keys),
                    props, column(r.sharding_key), delay, r.ids.take(index).to_pylist())]

    def start(self, item: Outgoing, queue: MessageQueue) -> Any:
        return self.producer.send_async(item.payload, queue)

    def finish(self, handle: Any, timeout: float) -> Sequence[Any]:
        """One SendResult per message; :class:`PartlyRefused` when the proxy answered some
        calls TOO_MANY_REQUESTS and stored the others."""
        return handle.result(timeout)

    @staticmethod
    def narrow(messages: List[Message], positions: Sequence[int]) -> List[Message]:
        """The messages at ``positions`` (those the proxy refused as busy), in order."""
        return [messages[i] for i in positions]
