"""What an embedded cluster's brokers hold, read from their stores (not through a client under
test): for tests that must see every stored message, visible or not."""
from __future__ import annotations

from typing import List, Tuple

from rocketmq_spark.client.protocol.message import decode_messages


def stored_messages(cluster, topic: str, queues: int = 4) -> List[Tuple[int, object]]:
    """(queue id, message) of every message of ``topic`` on every broker, in queue order."""
    out = []
    for b in cluster.brokers:
        store = cluster._broker(b.name).store
        for qid in range(queues):
            q = cluster._call(store.existing_queue, topic, qid)
            if q is None:
                continue
            records = cluster._call(lambda: [q.record(o) for o in range(q.min_offset,
                                                                         q.max_offset)])
            out.extend((qid, decode_messages(record)[0]) for record in records)
    return out
