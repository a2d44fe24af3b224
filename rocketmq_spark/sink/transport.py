"""How a sink task's messages reach RocketMQ: the one seam between the sink and a protocol.

A :class:`Transport` turns checked rows (:class:`~.rows.SinkRows`) into request payloads and
sends them for a :class:`~rocketmq_spark.client.send.pipeline.SendPipeline` (it is the pipeline's
``Sender``). Two exist:

* :class:`RemotingTransport`: RocketMQ's own protocol (``nameServer``), batches encoded column
  by column with Arrow, sent by the per-process pooled :class:`Producer`.
* :class:`GrpcTransport`: a 5.x proxy (``endpoints``), through
  ``rocketmq_spark.client.grpc.GrpcProducer``, one ``Message`` object per row.

:func:`open_transport` picks one from the options.
"""
from __future__ import annotations

import hashlib
import logging
import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..client import pool
from ..client.send.pipeline import Outgoing
from ..client.send.producer import (
    BATCH_HEADER_PROPERTIES, MAX_PROPERTIES_SIZE, EncodedRequest, EncodedRun, Message, Producer,
)
from ..client.protocol import message, properties
from ..client.protocol.route import MessageQueue
from ..client.errors import RocketMQError
from ..client.send.backpressure import BusyLog, is_busy, refused_in_part
from ..client.txn.transaction import (
    TRANSACTION_PREPARED_TYPE, HalfSent, Outcome, collect_half_answers, end_transactions,
)
from ..client.protocol.send_encode import (
    ENTRY_HEAD_BYTES, byte_lengths, encode_entries, entries_body, join_pieces, property_piece,
    repeated,
)
from .options import SinkOptions
from .rows import RowError, SinkRows

COMPRESSED_SYS_FLAG = (message.SYSFLAG_COMPRESSED
                       | (message.COMPRESSION_ZLIB << message.COMPRESSION_SHIFT))
log = logging.getLogger(__name__)
ZLIB_LEVEL = 5  # Java's producer compresses with level 5
ENTRY_OVERHEAD = ENTRY_HEAD_BYTES + 2  # a batch entry's fixed part
# exactlyOnce: half messages written to a queue together (each its own request: brokers
# refuse transactional messages in a batch), so a row costs no system call of its own.
HALF_RUN_ROWS = 512


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


# ------------------------------------------------------------------------------- remoting


class RemotingTransport(Transport):
    """RocketMQ's remoting protocol through the pooled :class:`Producer` of this process."""

    name = "remoting"

    def __init__(self, producer: Producer, options: SinkOptions, group: str,
                 half_properties: Optional[Dict[str, str]] = None):
        self.producer = producer
        self.options = options
        self.group = group
        # exactlyOnce: every row a half message of its own (brokers refuse transactional
        # messages in a batch), with these properties (TRAN_MSG, PGROUP, query/batch/token).
        self.half_properties = half_properties
        # a run of half messages is a request per message: a pipeline may cut it (narrow)
        self.narrow = None
        if half_properties is not None:
            self.max_request_rows = HALF_RUN_ROWS
            self.narrow = self.narrow_run

    def queues(self, topic: str, refresh: bool = False) -> Sequence[MessageQueue]:
        return self.producer.queues(topic, refresh)

    def prepare(self, rows: SinkRows) -> Prepared:
        opts = self.options
        body = rows.body
        lengths = byte_lengths(body)
        klass = None
        if opts.compress_over >= 0:
            big = np.flatnonzero(lengths >= opts.compress_over)
            if len(big):
                squeezed = [zlib.compress(body[int(i)].as_buffer(), ZLIB_LEVEL) for i in big]
                mask = np.zeros(rows.count, dtype=bool)
                mask[big] = True
                body = pc.replace_with_mask(body, pa.array(mask),
                                            pa.array(squeezed, pa.large_binary()))
                klass = mask.astype(np.int8)
        sent = byte_lengths(body)
        too_big = np.flatnonzero(sent > opts.max_message_bytes)
        if len(too_big):
            i = int(too_big[0])
            raise RowError(f"{rows.where(i)}: the message for topic {rows.topic_of(i)!r} has "
                           f"a body of {int(lengths[i]):,} bytes"
                           + (f" ({int(sent[i]):,} compressed)" if sent[i] != lengths[i] else "")
                           + f"; the broker takes at most {opts.max_message_bytes:,} "
                             "(option maxMessageBytes)")
        pieces = [p for p in (rows.user_properties,) if p is not None]
        if rows.keys is not None:
            pieces.append(property_piece(properties.KEYS, rows.keys))
        if rows.tags is not None:
            pieces.append(property_piece(properties.TAGS, rows.tags))
        if rows.sharding_key is not None:
            pieces.append(property_piece(properties.SHARDING_KEY, rows.sharding_key))
        if rows.delay is not None and rows.delay.any():
            delay = pc.if_else(pa.array(rows.delay > 0),
                               pa.array(rows.delay).cast(pa.large_string()),
                               pa.scalar(None, pa.large_string()))
            pieces.append(property_piece(properties.DELAY, delay))
        pieces.append(property_piece(properties.UNIQ_KEY, rows.ids))
        if self.half_properties is not None:
            pieces.append(repeated(properties.encode_properties(self.half_properties).encode(),
                                   rows.count))
        pieces.append(repeated(f"{properties.WAIT}\x01true\x02".encode(), rows.count))
        props = join_pieces(pieces)
        props_len = byte_lengths(props)
        long_props = np.flatnonzero(props_len > MAX_PROPERTIES_SIZE)
        if len(long_props):
            i = int(long_props[0])
            raise RowError(f"{rows.where(i)}: the message for topic {rows.topic_of(i)!r} has "
                           f"{int(props_len[i]):,} bytes of properties; the broker takes at "
                           f"most {MAX_PROPERTIES_SIZE:,}")
        entries = encode_entries(body, props)
        sizes = ENTRY_OVERHEAD + sent + props_len
        return Prepared(rows, sizes, klass, (entries, body, props))

    def payload(self, prepared: Prepared, rows: np.ndarray, single: bool
                ) -> Union[EncodedRequest, EncodedRun]:
        entries, body, props = prepared.data
        first = int(rows[0])
        compressed = prepared.klass is not None and prepared.klass[first]
        sys_flag = COMPRESSED_SYS_FLAG if compressed else 0
        if self.half_properties is not None:
            taken = pa.array(rows)
            return EncodedRun(body.take(taken), props.take(taken),
                              prepared.rows.ids.take(taken).to_pylist(),
                              sys_flag | TRANSACTION_PREPARED_TYPE)
        first_id = prepared.rows.ids[first].as_py()
        if single:
            return EncodedRequest(body[first].as_py(), props[first].as_py().decode("utf-8"),
                                  sys_flag, 0, False, first_id)
        return EncodedRequest(entries_body(entries, rows), BATCH_HEADER_PROPERTIES, sys_flag, 0,
                              True, first_id)

    def start(self, item: Outgoing, queue: MessageQueue) -> Any:
        return self.producer.start(item, queue, self.group)

    def finish(self, handle: Any, timeout: float) -> Sequence[Any]:
        if self.half_properties is None:
            return self.producer.finish(handle, timeout)
        return self._finish_run(handle, timeout)

    def _finish_run(self, handle: Any, timeout: float) -> List[HalfSent]:
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
    def narrow_run(run: EncodedRun, positions: Sequence[int]) -> EncodedRun:
        """The run of just the messages at ``positions`` (those a busy broker refused)."""
        taken = pa.array(positions, pa.int64())
        return EncodedRun(run.bodies.take(taken), run.properties.take(taken),
                          [run.ids[i] for i in positions], run.sys_flag, run.flag)


def shared_producer(options: SinkOptions) -> Producer:
    """The process's remoting producer for these connection settings (connections and routes
    are shared by every task and micro-batch this Python worker runs)."""
    settings = options.connection()
    return pool.shared(("sink-producer",) + settings.pool_key(),
                       lambda: Producer(list(options.name_servers),
                                        config=settings.client_config()))


# ------------------------------------------------------------------------------- gRPC


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
        too_big = np.flatnonzero(sizes > self.options.max_message_bytes)
        if len(too_big):
            i = int(too_big[0])
            raise RowError(f"{rows.where(i)}: the message for topic {rows.topic_of(i)!r} has "
                           f"a body of {int(sizes[i]):,} bytes; the broker takes at most "
                           f"{self.options.max_message_bytes:,} (option maxMessageBytes)")
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


def shared_grpc_producer(options: SinkOptions, group: str) -> Any:
    from ..client.grpc import GrpcProducer  # only when endpoints are used

    secret = ""
    if options.credentials is not None:
        secret = hashlib.sha256(options.credentials.signature(b"pool").encode()).hexdigest()
    key = ("sink-grpc", options.endpoints, group, options.credentials.access_key
           if options.credentials else None, secret, options.tls, options.tls_verify,
           options.tls_ca_file, options.send_timeout_ms, options.namespace)
    return pool.shared(key, lambda: GrpcProducer(
        options.endpoints, group=group, credentials=options.credentials, tls=options.tls,
        tls_verify=options.tls_verify, tls_ca_file=options.tls_ca_file,
        namespace=options.namespace, send_timeout=options.send_timeout_ms / 1000.0,
        topics=(options.topic,) if options.topic else ()))


def open_transport(options: SinkOptions, group: str,
                   half_properties: Optional[Dict[str, str]] = None) -> Transport:
    """gRPC when the option ``endpoints`` is set, RocketMQ's remoting protocol otherwise;
    ``half_properties``: send half messages with these properties (exactlyOnce)."""
    if options.endpoints:
        if half_properties is not None:
            raise ValueError("half messages are sent over the remoting protocol only")
        return GrpcTransport(shared_grpc_producer(options, group), options)
    return RemotingTransport(shared_producer(options), options, group, half_properties)
