"""Before a filtered read: does every broker it reads from filter by SQL92?"""
from __future__ import annotations

import logging
from typing import Mapping, Set, Tuple

from ..errors import FilterNotSupportedError, RocketMQError
from ..protocol.route import MessageQueue
from ..pull import TAG_TYPE, PullRequest

_log = logging.getLogger(__name__)


# (broker address, expression type) pairs a broker has accepted in this process.
_FILTER_ACCEPTED: Set[Tuple[str, str]] = set()


def check_filter_support(brokers, queues: Mapping[str, MessageQueue], consumer_group: str,
                         subscription: str, expression_type: str, sub_version: int = 0,
                         timeout: float = 10.0) -> None:
    """Before a filtered read is planned: one pull (of at most one message) at each broker
    (``queues``: address -> one of its queues) with the read's subscription, so a broker that
    refuses SQL92 fails the query on the driver, not in its tasks. Raises
    :class:`~..errors.FilterNotSupportedError`; any other fault is left for the reads to meet.
    A broker that accepted is not asked again in this process. ``brokers``: a
    :class:`~..broker.BrokerClient`."""
    if expression_type.upper() == TAG_TYPE:
        return
    for address, mq in sorted(queues.items()):
        key = (address, expression_type)
        if key in _FILTER_ACCEPTED:
            continue
        request = PullRequest(
            consumer_group=consumer_group, topic=mq.topic, queue_id=mq.queue_id,
            queue_offset=0, broker_name=mq.broker_name, max_msg_nums=1,
            subscription=subscription, expression_type=expression_type,
            sub_version=sub_version)
        try:
            brokers.pull(address, request, timeout)
        except FilterNotSupportedError:
            raise
        except RocketMQError as exc:
            _log.info("could not check %s's filter support: %s", address, exc)
            continue
        _FILTER_ACCEPTED.add(key)
