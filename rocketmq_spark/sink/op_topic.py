"""What a broker has settled: its op topic, read by the exactly-once sink.

A 4.x broker writes one op message (tag ``d``, body the half message's queue offset) to
``RMQ_SYS_TRANS_OP_HALF_TOPIC`` for every COMMIT or ROLLBACK it applied. Nothing on a broker
deduplicates END_TRANSACTION, so before committing a half message a second time (a restart
settling a half-ended batch, a check-back about a re-stored copy) the sink looks here.
"""
from __future__ import annotations

import logging
from typing import Dict, Set

from ..client.errors import RocketMQError
from ..client.protocol.message import decode_messages
from ..client.pull import PullRequest, PullStatus
from ..client.remoting import RemotingClient
from ..client.transaction import OP_TOPIC

log = logging.getLogger(__name__)
OP_LOOKUP_GROUP = "spark-rocketmq-sink-op-lookup"


class OpTopic:
    """Which half offsets a broker has settled: its op topic holds one message per COMMIT or
    ROLLBACK (tag ``d``, body the half message's queue offset)."""

    def __init__(self, remoting: RemotingClient):
        from ..client.broker import BrokerClient

        self.brokers = BrokerClient(remoting)
        self._seen: Dict[str, Set[int]] = {}
        self._from: Dict[str, int] = {}
        self._next: Dict[str, int] = {}

    def max_offset(self, address: str) -> int:
        from ..client.protocol.route import MessageQueue

        try:
            return self.brokers.get_max_offset(address, MessageQueue(OP_TOPIC, "", 0),
                                               timeout=5)
        except RocketMQError:  # no op topic yet: nothing settled so far
            return 0

    def settled(self, address: str, start: int) -> Set[int]:
        """Half offsets with an op message at or after op offset ``start`` (read
        incrementally: later calls read only what was added since)."""
        if address not in self._from or start < self._from[address]:
            self._from[address], self._next[address] = start, start
            self._seen[address] = set()
        offset, seen = self._next[address], self._seen[address]
        while True:
            request = PullRequest(OP_LOOKUP_GROUP, OP_TOPIC, 0, offset, max_msg_nums=32)
            try:
                result = self.brokers.pull(address, request, timeout=5)
            except RocketMQError as exc:
                log.warning("reading %s on %s failed: %s", OP_TOPIC, address, exc)
                break
            if result.status is PullStatus.FOUND:
                for m in decode_messages(result.body, verify_crc=False):
                    try:
                        seen.add(int(m.body.decode().strip()))
                    except ValueError:
                        pass
                offset = result.next_begin_offset
                continue
            if result.status is PullStatus.OFFSET_ILLEGAL and result.next_begin_offset > offset:
                offset = result.next_begin_offset
                continue
            break
        self._next[address] = offset
        return seen
