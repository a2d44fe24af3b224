"""The driver's check that the brokers a filtered read plans for will filter as asked."""
from __future__ import annotations

from typing import Dict, Iterable, List, Mapping

from ..client.admin import Admin
from ..client.protocol.route import MessageQueue
from ..client.read.filter_support import check_filter_support
from .options import SourceOptions
from .planning import QueueRange


def check_brokers_filter(options: SourceOptions, admin: Admin,
                         groups: Iterable[List[QueueRange]],
                         addresses: Mapping[str, str]) -> None:
    """With ``filterType=SQL92``, one probing pull per broker the planned ranges read from:
    a broker without ``enablePropertyFilter=true`` fails the query here, on the driver, with
    an error naming that setting, before any task runs (see :func:`check_filter_support`)."""
    if options.filter_type == "TAG":
        return
    queues: Dict[str, MessageQueue] = {}
    for group in groups:
        for queue_range in group:
            address = addresses.get(queue_range.queue.broker_name)
            if address:
                queues.setdefault(address, queue_range.queue)
    check_filter_support(admin.brokers, queues, options.consumer_group, options.filter,
                         options.filter_type, options.filter_version,
                         options.pull_timeout_ms / 1000.0)
