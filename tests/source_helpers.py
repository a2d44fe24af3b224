"""Helpers shared by the Spark source tests: producing numbered messages and running queries."""
from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Dict, Iterable, List, Optional

from rocketmq_spark.client import Message, MessageQueue, Producer
from rocketmq_spark.client.admin import Admin

_query_ids = itertools.count(1)


def produce(namesrv: str, topic: str, ids: Iterable[int], tags: Optional[str] = None,
            queues: Optional[List[MessageQueue]] = None, prefix: str = "m"
            ) -> Dict[MessageQueue, List[int]]:
    """Send one message per id (body ``f"{prefix}{id}"``, key ``str(id)``), spread round robin
    over the topic's queues; returns the ids sent to each queue, in queue order."""
    with Producer(namesrv) as producer:
        if queues is None:
            queues = producer.queues(topic, refresh=True)
        by_queue: Dict[MessageQueue, List[int]] = defaultdict(list)
        for i, n in enumerate(ids):
            by_queue[queues[i % len(queues)]].append(n)
        for mq, numbers in by_queue.items():
            for chunk in range(0, len(numbers), 256):
                part = numbers[chunk:chunk + 256]
                producer.send_batch([Message(topic, f"{prefix}{n}".encode(), keys=str(n),
                                             tags=tags) for n in part], queue=mq)
    return dict(by_queue)


def reader(spark, namesrv: str, topic: str, **options):
    r = spark.readStream.format("rocketmq").option("nameServer", namesrv) \
        .option("subscribe", topic)
    for k, v in options.items():
        r = r.option(k, str(v))
    return r.load()


def run_available_now(spark, df, checkpoint: str, sink: Optional[str] = None,
                      timeout: float = 180):
    """Run a query to completion with Trigger.AvailableNow; returns the finished query."""
    name = f"q{next(_query_ids)}"
    writer = df.writeStream.option("checkpointLocation", checkpoint).trigger(availableNow=True)
    if sink is None:
        writer = writer.format("memory").queryName(name)
    else:
        writer = writer.format("parquet").option("path", sink)
    query = writer.start()
    assert query.awaitTermination(timeout), "the query did not finish in time"
    if query.exception() is not None:
        raise AssertionError(f"query failed: {query.exception()}")
    query.table_name = name
    return query


def start_memory(df, name: str, checkpoint: str):
    """Start a running (not AvailableNow) query into the memory table ``name``."""
    return df.writeStream.format("memory").queryName(name) \
        .option("checkpointLocation", checkpoint).start()


def ids_of(rows) -> List[int]:
    return sorted(int(r["keys"]) for r in rows)


def committed(namesrv: str, topic: str, group: str) -> Dict[str, Optional[int]]:
    with Admin(namesrv) as admin:
        queues = admin.queues(topic, refresh=True)
        return {mq.key: v for mq, v in admin.offsets("committed", queues, group=group).items()}


def max_offsets(namesrv: str, topic: str) -> Dict[str, int]:
    with Admin(namesrv) as admin:
        queues = admin.queues(topic, refresh=True)
        return {mq.key: v for mq, v in admin.offsets("max", queues).items()}


def assert_read_in_queue_order(df, queues: int) -> None:
    """Every one of ``queues`` queues read, each as offsets 0..n-1 with no gap or repeat."""
    per_queue = defaultdict(list)
    for r in df.select("brokerName", "queueId", "queueOffset").collect():
        per_queue[(r.brokerName, r.queueId)].append(r.queueOffset)
    assert len(per_queue) == queues
    for offsets in per_queue.values():
        assert sorted(offsets) == list(range(len(offsets)))


def available_now_with_lag_listener(spark, listener_options: Dict[str, str], df,
                                    checkpoint: str):
    """Run ``df`` as an AvailableNow query with a RocketMQLagListener, waiting for its report
    of every batch (it reports after each progress); returns the listener (closed) and the
    query."""
    from rocketmq_spark import RocketMQLagListener
    from waiting import wait_until

    lag = RocketMQLagListener(listener_options)
    spark.streams.addListener(lag)
    try:
        query = run_available_now(spark, df, checkpoint)
        batches = len(query.recentProgress)
        wait_until(lambda: len(lag.reports(query.id)) == batches, 60, "a report per batch")
    finally:
        spark.streams.removeListener(lag)
        lag.close()
    return lag, query
