"""How a sink task's messages reach RocketMQ: the one seam between the sink and a protocol.

A :class:`Transport` turns checked rows (:class:`~.rows.SinkRows`) into request payloads and
sends them for a :class:`~rocketmq_spark.client.send.pipeline.SendPipeline` (it is the pipeline's
``Sender``). One exists per protocol and guarantee:

* :class:`~.remoting_transport.RemotingTransport`: RocketMQ's own protocol (``nameServer``),
  at least once: batches encoded column by column with Arrow, sent by the per-process pooled
  :class:`Producer`.
* :class:`~.remoting_transport.HalfMessageTransport`: the same protocol, exactly once: every
  row a half message of a transaction, sent in runs.
* :class:`~.grpc_transport.GrpcTransport`: a 5.x proxy (``endpoints``), at least once, through
  ``rocketmq_spark.client.grpc.GrpcProducer``, one ``Message`` object per row.

The delivery guarantee (:mod:`.delivery`) picks one. This module holds what they share: the
pipeline's view of a transport, and the process's pooled producers.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from ..client import pool
from ..client.send.backpressure import BusyLog
from ..client.send.pipeline import Outgoing
from ..client.send.producer import Producer
from ..client.protocol.route import MessageQueue
from .options import SinkOptions
from .rows import SinkRows


@dataclass
class Prepared:
    """Rows encoded for one transport.

    ``sizes``: bytes each row adds to a request. ``klass``: rows of different classes never
    share a request (None: one class). ``data``: the transport's own encoding."""

    rows: SinkRows
    sizes: np.ndarray
    klass: Optional[np.ndarray] = None
    data: Any = None


class Transport(ABC):
    """The sink's view of a protocol: queues, payloads, and the pipeline's Sender calls."""

    name = "transport"
    max_request_rows: Optional[int] = None  # rows per request, besides the byte limit

    @abstractmethod
    def queues(self, topic: str, refresh: bool = False) -> Sequence[MessageQueue]:
        """The topic's writable queues (for a new topic, those of the auto-create template)."""

    @abstractmethod
    def prepare(self, rows: SinkRows) -> Prepared:
        """Encode ``rows``; raise :class:`RowError` for a row this transport cannot send."""

    @abstractmethod
    def payload(self, prepared: Prepared, rows: np.ndarray, single: bool) -> Any:
        """The request for ``rows`` (indices into ``prepared``, all of one topic and class);
        ``single``: one message sent on its own (a delayed one)."""

    @abstractmethod
    def start(self, item: Outgoing, queue: MessageQueue) -> Any:
        """Send without waiting."""

    @abstractmethod
    def finish(self, handle: Any, timeout: float) -> Sequence[Any]:
        """Wait for the answer: results with a ``status`` each."""

    @property
    def busy_log(self) -> Optional[BusyLog]:
        """Where the process's producer counts and logs busy answers (once a minute)."""
        return getattr(getattr(self, "producer", None), "busy_log", None)

    def close(self) -> None:
        """Release what this task holds (pooled clients stay open for the next task)."""


def shared_producer(options: SinkOptions) -> Producer:
    """The process's remoting producer for these connection settings (connections and routes
    are shared by every task and micro-batch this Python worker runs)."""
    settings = options.connection
    return pool.shared(("sink-producer", settings),
                       lambda: Producer(list(settings.name_servers),
                                        config=settings.client_config()))


def shared_grpc_producer(options: SinkOptions, group: str) -> Any:
    from ..client.grpc import GrpcProducer  # only when endpoints are used

    return pool.shared(("sink-grpc", options.connection, group), lambda: GrpcProducer(
        options.endpoints, group=group, credentials=options.credentials, tls=options.tls,
        tls_verify=options.tls_verify, tls_ca_file=options.tls_ca_file,
        namespace=options.namespace, send_timeout=options.send_timeout_ms / 1000.0,
        topics=(options.topic,) if options.topic else ()))
