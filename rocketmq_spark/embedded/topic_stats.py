"""GET_TOPIC_STATS_INFO (202) as 4.9.8's AdminBrokerProcessor.getTopicStatsInfo answers it.

* An unknown topic: TOPIC_NOT_EXIST, remark ``topic[<name>] not exist``, no extFields.
* Else SUCCESS, no extFields, no remark, and a TopicStatsTable: one row for each of the
  topic's first ``writeQueueNums`` queues (not its read queues) with the queue's min and max
  offset (0 when the queue holds nothing) and ``lastUpdateTimestamp``, the store time of the
  message at ``max - 1`` (0 for an empty queue, -1 when that message is gone).
* The body is fastjson's text of a ``HashMap<MessageQueue, TopicOffset>``: each key is the
  MessageQueue object itself (fields in name order), and the rows come in the map's iteration
  order (bins of a table sized for the row count, by MessageQueue.hashCode; rows sharing a bin
  in insertion order, i.e. by queue id: a topic's queues hash 31 apart, so few share a bin
  and none reaches the eight entries at which Java would make the bin a tree).

A slave answers the same from its copy. Slaves, masters and the 5.1 release alike: 5.1.4's
broker answers it with the same code.
"""
from __future__ import annotations

import json
from typing import List, Tuple

from ..client.protocol.codes import ResponseCode
from ..client.protocol.frame import RemotingCommand
from ..client.protocol.properties import java_string_hash
from .context import BrokerContext
from .headers import req_str


def _spread(h: int) -> int:
    """HashMap.hash: the hash with its high half folded into the low half."""
    h &= 0xFFFFFFFF
    return h ^ (h >> 16)


def message_queue_hash(topic: str, broker_name: str, queue_id: int) -> int:
    """MessageQueue.hashCode() (31-based over brokerName, queueId, topic), as 32 bits."""
    result = 31 + java_string_hash(broker_name)
    result = 31 * result + queue_id
    result = 31 * result + java_string_hash(topic)
    return result & 0xFFFFFFFF


def hashmap_order(entries: List[Tuple[int, object]]) -> List[object]:
    """The items of ``(hash, item)`` pairs, inserted in this order, as a HashMap iterates
    them (16 bins, doubled while more than three quarters full)."""
    capacity = 16
    while len(entries) > capacity * 0.75:
        capacity *= 2
    ranked = sorted(range(len(entries)),
                    key=lambda i: (_spread(entries[i][0]) & (capacity - 1), i))
    return [entries[i][1] for i in ranked]


def topic_stats_body(context: BrokerContext, topic: str, queue_count: int) -> bytes:
    rows = []
    for queue_id in range(queue_count):
        queue = context.store.existing_queue(topic, queue_id)
        low = max(queue.min_offset, 0) if queue is not None else 0
        high = max(queue.max_offset, 0) if queue is not None else 0
        last = 0
        if high > 0 and queue is not None:
            found = queue.store_time(high - 1)
            last = found if found is not None else -1
        key = json.dumps({"brokerName": context.name, "queueId": queue_id, "topic": topic},
                         separators=(",", ":"), ensure_ascii=False)
        value = f'{{"lastUpdateTimestamp":{last},"maxOffset":{high},"minOffset":{low}}}'
        rows.append((message_queue_hash(topic, context.name, queue_id), f"{key}:{value}"))
    return ('{"offsetTable":{' + ",".join(hashmap_order(rows)) + "}}").encode("utf-8")


def handle_topic_stats(context: BrokerContext, cmd: RemotingCommand) -> RemotingCommand:
    topic = req_str(cmd.fields, "topic")
    version = context.options.version
    config = context.store.topics.get(topic)
    if config is None:
        return cmd.make_response(ResponseCode.TOPIC_NOT_EXIST, None,
                                 f"topic[{topic}] not exist", version=version)
    return cmd.make_response(ResponseCode.SUCCESS, None, None,
                             body=topic_stats_body(context, topic, config.write_queue_nums),
                             version=version)

