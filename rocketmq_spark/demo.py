"""The quick-start demo: an embedded RocketMQ, 10,000 messages sent and read back.

Run it with ``ci/demo.sh`` (which sets everything up) or ``python -m rocketmq_spark.demo``.
"""
from __future__ import annotations

import argparse
import time

import pyarrow as pa

from .client import Message, Producer, QueueRangeReader, ReadSettings
from .client.admin import Admin
from .embedded import EmbeddedCluster


def run(messages: int = 10_000, brokers: int = 2, queues: int = 4) -> dict:
    """Produce ``messages`` to a fresh topic and read every queue back; returns the summary."""
    topic = "DemoTopic"
    with EmbeddedCluster(brokers=brokers) as cluster:
        print(f"embedded RocketMQ: name server {cluster.namesrv_addr}, brokers "
              + ", ".join(f"{b.name}@{b.addr}" for b in cluster.brokers))
        with Admin(cluster.namesrv_addr) as admin, Producer(cluster.namesrv_addr) as producer:
            admin.create_topic(topic, queues=queues)
            started = time.perf_counter()
            producer.send_many(Message(topic, f"message {i:05d}".encode(),
                                       tags="even" if i % 2 == 0 else "odd", keys=f"k{i}")
                               for i in range(messages))
            send_s = time.perf_counter() - started

            queue_list = admin.queues(topic)
            highs = admin.offsets("max", queue_list)
            settings = ReadSettings(consumer_group="demo-group")
            started = time.perf_counter()
            batches = []
            for mq in queue_list:
                reader = QueueRangeReader(admin.brokers, admin.address, mq, 0, highs[mq],
                                          settings)
                batches.extend(reader)
            read_s = time.perf_counter() - started
            table = pa.Table.from_batches(batches)

    bodies = sorted(table.column("body").to_pylist())
    summary = {
        "sent": messages,
        "read": table.num_rows,
        "distinct": len(set(bodies)),
        "queues": {mq.key: highs[mq] for mq in queue_list},
        "send_msgs_per_s": messages / send_s,
        "read_msgs_per_s": table.num_rows / read_s if read_s else float("inf"),
    }
    print(f"sent {messages} messages in {send_s:.2f} s ({summary['send_msgs_per_s']:,.0f} msg/s)")
    print(f"read {table.num_rows} messages back in {read_s:.2f} s "
          f"({summary['read_msgs_per_s']:,.0f} msg/s)")
    for key, high in summary["queues"].items():
        print(f"  {key:<28} {high:>6} messages")
    first = table.slice(0, 1).to_pylist()[0]
    print(f"first row: topic={first['topic']} queue={first['queue_id']} "
          f"offset={first['queue_offset']} tags={first['tags']} keys={first['keys']} "
          f"body={first['body']!r} msgId={first['msg_id']}")
    ok = summary["read"] == messages and summary["distinct"] == messages
    print("every message read back exactly once" if ok else "MISMATCH between sent and read")
    if not ok:
        raise SystemExit(1)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--brokers", type=int, default=2)
    parser.add_argument("--queues", type=int, default=4)
    args = parser.parse_args()
    run(args.messages, args.brokers, args.queues)


if __name__ == "__main__":
    main()
