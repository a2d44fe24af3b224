"""Where queues that join a group member start: at the group's committed offset, or, for a
queue the group has no offset for, where the query's start positions say (see
:class:`.membership.GroupMember`)."""
from __future__ import annotations

import logging
from typing import Callable, Dict, List, Tuple

from ..admin import Admin
from ..errors import RocketMQError
from ..protocol.route import MessageQueue

log = logging.getLogger(__name__)

# (queues, first) -> where each starts, for queues with no committed offset in the group;
# ``first``: this plans the query's first batch (``startingOffsets`` applies).
StartPositions = Callable[[List[MessageQueue], bool], Dict[MessageQueue, int]]


def joining_positions(admin: Admin, group: str, joining: List[MessageQueue],
                      start: Dict[MessageQueue, int], start_positions: StartPositions,
                      first: bool) -> Tuple[Dict[MessageQueue, int], Dict[MessageQueue, int]]:
    """(queues read on from ``start``, queues entering at a position) among ``joining``. A
    queue whose offsets cannot be read now is in neither: it joins at a later batch."""
    committed = admin.offsets("committed", joining, group=group)
    failed = [mq for mq in joining if isinstance(committed.get(mq), RocketMQError)]
    for mq in failed[:3]:
        log.warning("cannot read the group's offset of %s (%s); it joins later", mq.key,
                    committed[mq])
    fresh = [mq for mq in joining if mq not in failed and committed.get(mq) is None]
    try:
        entries = start_positions(fresh, first) if fresh else {}
    except RocketMQError as exc:
        log.warning("cannot resolve where %d joining queue(s) start (%s); they join later",
                    len(fresh), exc)
        failed += fresh
        entries = {}
    read_on: Dict[MessageQueue, int] = {}
    entering: Dict[MessageQueue, int] = {}
    for mq in joining:
        if mq in failed:
            continue
        group_offset = committed.get(mq)
        if mq in start:
            # Planned by this query before (a restart): read on from the checkpoint unless
            # another member moved the group past it meanwhile; then the queue leaves this
            # batch and joins the next one at the group's offset, so the messages in between
            # are not read twice.
            if group_offset is None or group_offset <= start[mq]:
                read_on[mq] = start[mq]
        else:
            entering[mq] = group_offset if group_offset is not None else entries[mq]
    return read_on, entering
