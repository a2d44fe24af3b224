"""What a broker has settled: its op topic, read by the exactly-once sink.

A broker writes op messages (tag ``d``) to ``RMQ_SYS_TRANS_OP_HALF_TOPIC`` for the COMMITs and
ROLLBACKs it applied. Their body names the half messages' queue offsets in one of two forms:

* up to 5.0 (``TransactionalMessageBridge.putOpMessage``): one message per END_TRANSACTION,
  the body one decimal offset (``"17"``);
* from 5.1.0 on (``TransactionalMessageServiceImpl.deletePrepareMessage`` and
  ``TransactionalOpBatchService``): the offsets are buffered and written together, every
  offset followed by a comma (``"2,3,1,0,4,"``, about 4 KiB a message), at the latest
  ``transactionOpBatchInterval`` (3 s) after the END_TRANSACTION.

Nothing on a broker deduplicates END_TRANSACTION, so before committing a half message a second
time (a restart settling a half-ended batch, a check-back about a re-stored copy) the sink looks
here. A body in neither form, or a tag other than ``d``, raises :class:`OpTopicError` naming
the broker and the op offset: skipping it would take a settled half message for an unsettled
one, and a second COMMIT stores its row again.
"""
from __future__ import annotations

import logging
from typing import Dict, List, Set, Tuple

from ..errors import ResponseError, RocketMQError
from ..protocol.codes import ResponseCode
from ..protocol.message import decode_messages
from ..pull import PullRequest, PullStatus
from ..remoting import RemotingClient
from .transaction import OP_TOPIC

log = logging.getLogger(__name__)
OP_LOOKUP_GROUP = "spark-rocketmq-sink-op-lookup"
REMOVE_TAG = "d"
# How long after an END_TRANSACTION a 5.1+ broker may still hold its op entry in memory
# (transactionOpBatchInterval, 3 s by default), with a margin for a busy broker.
OP_WRITE_DELAY_S = 4.0


class OpTopicError(RocketMQError):
    """An op message the sink cannot read, or an op topic it cannot reach: deciding without it
    could commit a settled half message a second time."""


def half_offsets(body: bytes, tag: str, where: str) -> List[int]:
    """The half offsets an op message names: ``b"17"`` (up to 5.0) or ``b"2,3,1,"`` (5.1+).
    Raises :class:`OpTopicError` naming ``where`` (the broker and op offset) for anything
    else."""
    if tag != REMOVE_TAG:
        raise OpTopicError(f"{where}: op message has tag {tag!r}, not {REMOVE_TAG!r}; the "
                           "sink cannot tell what it settled")
    try:
        text = body.decode("ascii")
    except UnicodeDecodeError:
        text = None
    parts = text.split(",") if text else []
    if parts and parts[-1] == "" and len(parts) > 1:
        parts.pop()  # the 5.1+ form ends with a comma
    if not parts or not all(p.isdigit() for p in parts):
        shown = body[:64]
        raise OpTopicError(f"{where}: op message body {shown!r}{'...' if len(body) > 64 else ''}"
                           f" ({len(body)} bytes) is neither a half offset nor a comma-joined "
                           "list of half offsets")
    return [int(p) for p in parts]


class OpTopic:
    """Which half offsets a broker has settled, read incrementally from its op topic."""

    def __init__(self, remoting: RemotingClient):
        from ..broker import BrokerClient

        self.brokers = BrokerClient(remoting)
        # check-backs answered COMMIT: uniq key -> (the copy's half offset, when); a 5.1+
        # broker may ask about a newer copy before that COMMIT's op entry is written
        self.commits_answered: Dict[str, Tuple[int, float]] = {}
        self._seen: Dict[str, Set[int]] = {}
        self._from: Dict[str, int] = {}
        self._next: Dict[str, int] = {}

    def max_offset(self, address: str) -> int:
        from ..protocol.route import MessageQueue

        try:
            return self.brokers.get_max_offset(address, MessageQueue(OP_TOPIC, "", 0),
                                               timeout=5)
        except RocketMQError:  # no op topic yet: nothing settled so far
            return 0

    def settled(self, address: str, start: int) -> Set[int]:
        """Half offsets with an op message at or after op offset ``start`` (read
        incrementally: later calls read only what was added since). Raises
        :class:`OpTopicError` when the op topic cannot be read or holds a body it cannot
        parse."""
        if address not in self._from or start < self._from[address]:
            self._from[address], self._next[address] = start, start
            self._seen[address] = set()
        offset, seen = self._next[address], self._seen[address]
        while True:
            request = PullRequest(OP_LOOKUP_GROUP, OP_TOPIC, 0, offset, max_msg_nums=32)
            try:
                result = self.brokers.pull(address, request, timeout=5)
            except ResponseError as exc:
                if exc.code == ResponseCode.TOPIC_NOT_EXIST:
                    break  # no op topic yet: nothing settled on that broker so far
                self._next[address] = offset
                raise OpTopicError(f"reading {OP_TOPIC} on the broker at {address} from op "
                                   f"offset {offset} failed: {exc}") from exc
            except RocketMQError as exc:
                self._next[address] = offset
                raise OpTopicError(f"reading {OP_TOPIC} on the broker at {address} from op "
                                   f"offset {offset} failed: {exc}") from exc
            if result.status is PullStatus.FOUND:
                for m in decode_messages(result.body, verify_crc=False):
                    where = f"{OP_TOPIC} on the broker at {address}, op offset {m.queue_offset}"
                    seen.update(half_offsets(m.body, m.tags or "", where))
                offset = result.next_begin_offset
                self._next[address] = offset
                continue
            if result.status is PullStatus.OFFSET_ILLEGAL and result.next_begin_offset > offset:
                offset = result.next_begin_offset
                continue
            break
        self._next[address] = offset
        return seen
