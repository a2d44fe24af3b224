"""Writing to and damaging a broker's store without a client: the work behind the cluster's
test API (:meth:`.cluster.EmbeddedCluster.append`, ``corrupt`` and ``repair``).

Runs on the cluster's loop thread, like everything that touches a store.
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional

from ..client.protocol.message import encode_stored_message, record_layout
from ..client.protocol.properties import CLUSTER, KEYS, TAGS, encode_properties
from .context import BrokerContext
from .records import tag_code
from .store import BrokerStore, TopicConfig

CORRUPT_FIELDS = ("crc", "magic", "size", "body", "properties")


def append_messages(context: BrokerContext, topic: str, queue_id: int, bodies: List[bytes],
                    tags: Optional[str] = None, keys: Optional[str] = None,
                    properties: Optional[Mapping[str, str]] = None,
                    born_timestamp: Optional[int] = None,
                    store_timestamp: Optional[int] = None) -> int:
    """Store ``bodies`` in one queue as one run, creating the topic (at least 4 queues) if
    needed; returns the queue offset of the first. ``store_timestamp`` may not be older than
    the queue's last message: store times never go back along a queue."""
    store = context.store
    if topic not in store.topics:
        n = max(4, queue_id + 1)
        store.put_topic(TopicConfig(topic, n, n))
    props: Dict[str, str] = dict(properties or {})
    if keys:
        props[KEYS] = keys
    if tags:
        props[TAGS] = tags
    props[CLUSTER] = context.options.cluster_name
    props_text = encode_properties(props, trailing_separator=False)
    if store_timestamp is not None:
        queue = store.queue(topic, queue_id)
        last = queue.store_time(queue.max_offset - 1)
        if last is not None and store_timestamp < last:
            raise ValueError(f"store_timestamp {store_timestamp} is older than the last message "
                             f"of {topic}/{context.name}/{queue_id} ({last})")
    host = context.addr

    def encode(index: int, queue_offset: int, physical_offset: int, now: int) -> bytes:
        return encode_stored_message(
            topic=topic, queue_id=queue_id, queue_offset=queue_offset,
            physical_offset=physical_offset, body=bodies[index], properties=props_text,
            born_timestamp=now if born_timestamp is None else born_timestamp, born_host=host,
            store_timestamp=now, store_host=host)
    stored = context.records.append(topic, queue_id, encode, len(bodies),
                                    [tag_code(props_text)] * len(bodies), store_timestamp)
    return stored.queue_offset


def corrupt_record(store: BrokerStore, broker_name: str, topic: str, queue_id: int,
                   offset: int, field: str) -> bytes:
    """Damage the stored record at ``offset`` in place (see ``EmbeddedCluster.corrupt`` for
    the fields); returns the record as it was."""
    queue = store.existing_queue(topic, queue_id)
    if queue is None:
        raise KeyError(f"{broker_name} has no queue {topic}/{queue_id}")
    rec = bytearray(queue.record(offset))
    (total, _magic, _sys_flag, _born, _store, body_pos, body_len, _topic_pos, _topic_len,
     props_pos, props_len) = record_layout(rec, 0, len(rec))
    if field == "crc":
        rec[8:12] = (int.from_bytes(rec[8:12], "big") ^ 0x5A5A5A5A).to_bytes(4, "big")
    elif field == "magic":
        rec[4:8] = b"\xde\xad\xbe\xef"
    elif field == "size":
        rec[0:4] = (total + 0x01000000).to_bytes(4, "big")
    elif field == "body":
        if not body_len:
            raise ValueError(f"message {offset} has an empty body")
        rec[body_pos] ^= 0x01
    else:
        if not props_len:
            raise ValueError(f"message {offset} has no properties")
        rec[props_pos] = 0xFF  # never valid in UTF-8
    return queue.overwrite(offset, bytes(rec))


def restore_record(store: BrokerStore, topic: str, queue_id: int, offset: int,
                   original: bytes) -> None:
    """Put back a record :func:`corrupt_record` damaged, unless retention dropped it."""
    queue = store.existing_queue(topic, queue_id)
    if queue is not None and queue.min_offset <= offset < queue.max_offset:
        queue.overwrite(offset, original)

