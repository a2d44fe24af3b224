"""Delayed messages (``DELAY`` 1-18), as a 4.9.8 broker's ScheduleMessageService keeps them.

* A single message whose ``DELAY`` property is above 0 is not stored in its topic: it goes to
  ``SCHEDULE_TOPIC_XXXX``, queue ``level - 1`` (a level above the table's last is lowered to
  it), with two more properties, ``REAL_TOPIC`` and ``REAL_QID``. Its properties are
  serialized again from the broker's HashMap, ``WAIT`` included (CommitLog.putMessage). The
  send's answer keeps the requested queue id and gives the schedule queue's offset.
* Once ``store time + the level's delay`` has passed, the message is stored again in its real
  topic and queue: same body, flags, born time and host, a new store time, and the same
  properties text (``DELAY``, ``REAL_TOPIC`` and ``REAL_QID`` stay, as in 4.9.8, whose
  messageTimeup serializes the properties before clearing ``DELAY``).
* A batch whose header carries ``DELAY`` is refused (MESSAGE_ILLEGAL); a ``DELAY`` inside a
  batch's own messages is stored as it is and not delayed, as on the genuine broker.

The delay table is the broker's ``messageDelayLevel`` (``ServerOptions.message_delay_level``;
tests shorten it). How far each level has been delivered is kept like a consumer offset
(group ``%SCHEDULE%``), so it survives a restart with a data directory.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Optional, Tuple

from ..client.protocol.message import decode_message, encode_stored_message
from ..client.protocol.properties import (
    CLUSTER, DELAY, decode_properties, encode_properties, java_hashmap_order,
)
from .background import BackgroundService
from .context import BrokerContext
from .records import properties_text, tag_code

log = logging.getLogger(__name__)

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
SCHEDULE_GROUP = "%SCHEDULE%"
REAL_TOPIC = "REAL_TOPIC"
REAL_QID = "REAL_QID"


def delay_level(properties: Optional[str]) -> int:
    """The message's ``DELAY`` level (0 when absent or not a number)."""
    value = decode_properties(properties or "").get(DELAY, "")
    return int(value) if value.strip().lstrip("-").isdigit() else 0


def schedule_target(properties: Optional[str], topic: str, queue_id: int,
                    cluster: Optional[str], max_level: int) -> Optional[Tuple[str, int, str]]:
    """Where a single message with a delay is stored: (SCHEDULE_TOPIC_XXXX, level - 1, its
    properties text); None when it has no delay. ``cluster`` is the CLUSTER property a send
    adds (None: a sent-back message, which keeps its own)."""
    level = delay_level(properties)
    if level <= 0:
        return None
    level = min(level, max_level)
    props = decode_properties(properties or "")
    props[DELAY] = str(level)
    if cluster is not None:
        props[CLUSTER] = cluster
    props[REAL_TOPIC] = topic
    props[REAL_QID] = str(queue_id)
    text = encode_properties({k: props[k] for k in java_hashmap_order(props)},
                             trailing_separator=False)
    return SCHEDULE_TOPIC, level - 1, text


class ScheduleService(BackgroundService):
    """Moves due messages from SCHEDULE_TOPIC_XXXX to their real queues, on the broker's
    loop, every ``interval`` seconds."""

    def __init__(self, context: BrokerContext, interval: float = 0.05):
        self.context = context
        self.interval = interval
        self.levels = context.options.delay_levels

    async def _run(self) -> None:
        while True:
            try:
                self.deliver_due()
            except Exception:  # pragma: no cover - keep delivering
                log.exception("%s: delivering delayed messages failed", self.context.name)
            await asyncio.sleep(self.interval)

    def deliver_due(self, now_ms: Optional[int] = None) -> int:
        """Store every message whose delay has passed in its real queue; returns how many."""
        store = self.context.store
        moved = 0
        for index, delay in enumerate(self.levels):
            queue = store.existing_queue(SCHEDULE_TOPIC, index)
            if queue is None:
                continue
            offset = max(store.query_offset(SCHEDULE_GROUP, SCHEDULE_TOPIC, index),
                         queue.min_offset)
            now = store.now() if now_ms is None else now_ms
            start = offset
            while offset < queue.max_offset and queue.store_time(offset) + delay * 1000 <= now:
                self._deliver(queue.record(offset))
                offset += 1
            if offset != start:
                store.commit_offset(SCHEDULE_GROUP, SCHEDULE_TOPIC, index, offset)
                moved += offset - start
        return moved

    def _deliver(self, record: bytes) -> None:
        msg, _ = decode_message(record, verify_crc=False, decompress=False)
        text = properties_text(record)
        props = msg.properties
        topic, queue_id = props.get(REAL_TOPIC), props.get(REAL_QID, "")
        if not topic or not queue_id.isdigit():
            log.error("%s: delayed message %s has no REAL_TOPIC/REAL_QID; dropped",
                      self.context.name, msg.offset_msg_id)
            return
        store_host = self.context.addr
        self.context.records.append(
            topic, int(queue_id), lambda _, queue_offset, physical_offset, now:
            encode_stored_message(
                topic=topic, queue_id=int(queue_id), queue_offset=queue_offset,
                physical_offset=physical_offset, body=msg.stored_body, properties=text,
                flag=msg.flag, sys_flag=msg.sys_flag, born_timestamp=msg.born_timestamp,
                born_host=msg.born_host, store_timestamp=now, store_host=store_host,
                reconsume_times=msg.reconsume_times),
            codes=[tag_code(text)], wake_after_answer=False)
