"""The broker's C fast paths, handed to its remoting server.

The C module (:mod:`.accelerator`: ``native/embedded/rmq_serve.c`` and ``rmq_serve_tx.c``)
answers the commonest requests at the start of a received chunk without building a command
for each: plain FOUND pulls (a TAG ``*`` subscription in the request: SQL92 and other property
filters always go the Python way, :mod:`.property_filter`), and plain half sends and
END_TRANSACTION COMMIT/ROLLBACK. What it stores and answers is byte for byte what
:func:`.pull.handle_pull`, :func:`.send.handle_send` and
:class:`.transactions.EndTransactionHandler` do; tests hold them together. Everything from
the first frame it does not take goes the Python way.

The server knows none of this: it calls :meth:`BrokerFastPaths.answer_leading` when a chunk
may be taken (no ACL, no fault rules).
"""
from __future__ import annotations

import logging
import zlib
from typing import Callable, Dict, List, Optional, Tuple

from ..client.protocol.codes import ResponseCode
from ..client.protocol.frame import decode_payload, encode_frame
from ..client.protocol.message import pack_host
from . import accelerator
from .context import BrokerContext

log = logging.getLogger(__name__)

PullAnswers = Callable[[bytes], Tuple[List[bytes], int]]
TransactionAnswers = Callable[[bytes, str], Tuple[List[bytes], int, int, int]]


def pull_answers(context: BrokerContext) -> Optional[PullAnswers]:
    """The C answer to plain FOUND pulls: takes a received chunk, returns the answers to the
    pulls at its start and the bytes they used. None without the accelerator."""
    serve = accelerator.native_function("serve_pulls")
    if serve is None:
        return None
    topics, queues = context.store.topics, context.store.queues

    def answer(data) -> Tuple[List[bytes], int]:
        o = context.options
        return serve(data, topics, queues, o.max_transfer_count, o.max_transfer_bytes,
                     o.suggest_broker_id, o.version)
    return answer


def transaction_answers(context: BrokerContext) -> Optional[TransactionAnswers]:
    """The C answer to plain half sends and END_TRANSACTION COMMIT/ROLLBACK: takes a received
    chunk and the peer's address, returns the answers to the frames at its start that it took
    (oneway ones have none), the bytes they used and how many were sends and
    END_TRANSACTIONs. A frame whose Python call raised (the store's append, say) is answered
    as the server's dispatch answers a handler's exception (SYSTEM_ERROR); the frames before
    it stand and the run ends with it. None without the accelerator."""
    serve = accelerator.native_function("serve_tx")
    if serve is None:
        return None

    def answer(data, peer: str):
        o = context.options
        result = serve(data, context.store, context.long_poll, zlib.crc32,
                       pack_host(context.addr)[0], pack_host(peer)[0], o.cluster_name,
                       "true" if o.trace_on else "false", o.region, o.max_message_size,
                       o.version)
        got, used, sends, ends, failed = result
        if failed is not None:  # a Python call raised in the middle of the run
            exc, size = failed
            error = _system_error(context, bytes(data[used + 4:used + size]), exc)
            if error:
                got.append(error)
            used += size
        return got, used, sends, ends
    return answer


def _system_error(context: BrokerContext, payload: bytes, exc: Exception) -> bytes:
    """What the server's dispatch answers (and logs) when a handler raises ``exc`` on the
    request ``payload`` (a frame without its length prefix): SYSTEM_ERROR, the exception's
    type and text as remark; nothing for a oneway request."""
    try:
        cmd = decode_payload(payload)
    except Exception:  # pragma: no cover - the C path took only frames that decode
        raise exc from None
    log.error("%s: %s failed", context.name, cmd.describe(),
              exc_info=(type(exc), exc, exc.__traceback__))
    if cmd.is_oneway:
        return b""
    return encode_frame(cmd.make_response(ResponseCode.SYSTEM_ERROR,
                                          remark=f"{type(exc).__name__}: {exc}",
                                          version=context.options.version))


class BrokerFastPaths:
    """One broker's C answers, and how many frames the transactional one took."""

    def __init__(self, context: BrokerContext):
        self.pulls: Optional[PullAnswers] = pull_answers(context)
        # 5.1+ writes op entries in batches (.op_batches), which the C path does not do
        self.transactions: Optional[TransactionAnswers] = (
            None if context.options.at_least("5.1") else transaction_answers(context))
        self.transaction_stats: Dict[str, int] = {"frames": 0, "sends": 0, "ends": 0}

    @property
    def available(self) -> bool:
        return self.pulls is not None or self.transactions is not None

    def answer_leading(self, data, peer: str) -> Tuple[List[bytes], int]:
        """The answers to the frames at the start of ``data`` the C paths take, and the bytes
        those frames used (0: none taken). Raises when the transactional path failed; the
        server then closes the connection."""
        answers: List[bytes] = []
        pulls, transactions = self.pulls, self.transactions
        total = 0
        while data:
            used = 0
            if pulls is not None:
                got, used = pulls(data)
                if used:
                    answers += got
            if transactions is not None and len(data) > used:
                rest = memoryview(data)[used:] if used else data
                got, took, sends, ends = transactions(rest, peer)
                if took:
                    answers += got
                    stats = self.transaction_stats
                    stats["frames"] += sends + ends
                    stats["sends"] += sends
                    stats["ends"] += ends
                    used += took
            if not used:
                break
            total += used
            data = memoryview(data)[used:]
        return answers, total
