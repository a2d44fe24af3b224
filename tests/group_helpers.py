"""Helpers for the consumer-group tests: a background feeder of numbered messages, what the
brokers know of a group (members, lock holders), and exactly-once checks over several sinks."""
from __future__ import annotations

import re
import threading
from collections import Counter, defaultdict
from pathlib import Path
from typing import Dict, Iterable, List

from rocketmq_spark.client import Message, MessageQueue, Producer
from rocketmq_spark.client.admin import Admin
from feeder import PacedFeeder
from waiting import wait_until

TOPIC_QUEUES = 6  # per broker: 2 brokers x 6 queues

SINK_SCHEMA = "topic string, brokerName string, queueId int, queueOffset long, keys string"
GROUP_OPTIONS = {"membership": "group", "startingOffsets": "earliest"}


def member_query(spark, namesrv: str, topic: str, group: str, name: str, work: Path, **extra):
    reader = (spark.readStream.format("rocketmq").option("nameServer", namesrv)
              .option("subscribe", topic).option("consumerGroup", group)
              .option("memberName", name))
    for key, value in {**GROUP_OPTIONS, **extra}.items():
        reader = reader.option(key, str(value))
    query = (reader.load().select("topic", "brokerName", "queueId", "queueOffset", "keys")
             .writeStream.format("parquet").option("path", str(work / f"{name}-out"))
             .option("checkpointLocation", str(work / f"{name}-cp"))
             .trigger(processingTime="0 seconds").start())
    # Spark's Python source runners of one session share a map that two queries initialising
    # at the same instant can corrupt: start members one at a time.
    wait_until(lambda: not query.isActive or not query.status["message"].startswith(
        "Initializing"), 120, f"{name} to initialise")
    assert query.exception() is None, query.exception()
    return query


def queues_of(cluster, topic: str):
    with Admin(cluster.namesrv_addr) as admin:
        return admin.queues(topic, refresh=True)


def sink_rows(spark, work: Path, name: str):
    path = work / f"{name}-out"
    if not (path / "_spark_metadata").exists():
        return []
    # The schema is given: a sink with only empty batches so far has no file to infer it from.
    return spark.read.schema(SINK_SCHEMA).parquet(str(path)).collect()


class Feeder(PacedFeeder):
    """Sends ``n`` messages numbered 0..n-1 (key = number) round robin over the topic's queues
    at ``rate`` messages/s, in the background; ``queue_of[number]`` records each one's queue.
    :meth:`hold_at` makes it wait before message ``k`` until the returned event is set."""

    def __init__(self, namesrv: str, topic: str, n: int, rate: float = 1500.0,
                 chunk: int = 60):
        super().__init__(namesrv, n, rate)
        self.topic, self.chunk = topic, chunk
        self.queue_of: Dict[int, MessageQueue] = {}
        self._holds: Dict[int, threading.Event] = {}
        self._finish = threading.Event()

    def hold_at(self, k: int) -> threading.Event:
        """Stop before sending message ``k`` (a chunk boundary) until the event is set."""
        assert k % self.chunk == 0, "hold at a chunk boundary"
        return self._holds.setdefault(k, threading.Event())

    def finish(self) -> None:
        """Send no more chunks: ``n`` becomes what was sent (wait with :meth:`join`)."""
        self._finish.set()

    def feed(self, producer: Producer) -> None:
        queues = producer.queues(self.topic, refresh=True)
        for i, first in enumerate(range(0, self.n, self.chunk)):
            if self._finish.is_set():
                self.n = first
                break
            if first in self._holds:
                self._holds[first].wait(600)
                self.restart_pace()
            numbers = range(first, min(first + self.chunk, self.n))
            mq = queues[i % len(queues)]
            producer.send_batch([Message(self.topic, f"g{k}".encode(), keys=str(k))
                                 for k in numbers], queue=mq)
            for k in numbers:
                self.queue_of[k] = mq
            self.pace(len(numbers))


def lock_holders(cluster, group: str, retry: bool = False) -> Dict[MessageQueue, str]:
    """Unexpired queue locks of ``group`` on every broker: queue -> client id (``retry``:
    with those of the group's retry queues, which members lock too)."""
    out: Dict[MessageQueue, str] = {}
    for handle in cluster.brokers:
        broker = cluster._broker(handle.name)
        for (topic, name, qid), client in cluster._call(broker.lock_holders, group).items():
            if retry or not topic.startswith("%RETRY%"):
                out[MessageQueue(topic, name, qid)] = client
    return out


def members(cluster, group: str) -> List[str]:
    return sorted(set(cluster.consumer_clients(group, "broker-a"))
                  | set(cluster.consumer_clients(group, "broker-b")))


def shares(holders: Dict[MessageQueue, str]) -> Dict[str, int]:
    return dict(Counter(holders.values()))


def duplicates(keys: Iterable[int]) -> Dict[int, int]:
    counts = Counter(keys)
    return {k: c for k, c in counts.items() if c > 1}


def queues_read(rows) -> Dict[MessageQueue, int]:
    """Messages per queue in sink rows (topic, brokerName, queueId)."""
    out: Dict[MessageQueue, int] = defaultdict(int)
    for r in rows:
        out[MessageQueue(r["topic"], r["brokerName"], r["queueId"])] += 1
    return dict(out)


class LockHolder:
    """Another client of the group holding broker locks on ``queues`` (renewed every 0.5 s in
    the background), as a stuck orderly consumer would."""

    def __init__(self, cluster, group: str, queues: List[MessageQueue]):
        from rocketmq_spark.client.admin import Admin
        from rocketmq_spark.client.config import ClientConfig

        self.cluster, self.group = cluster, group
        self.held = set(queues)
        self.admin = Admin(cluster.namesrv_addr, config=ClientConfig(client_id="lock-holder"))
        self._stop = threading.Event()
        self._guard = threading.Lock()
        self._renew()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _renew(self) -> None:
        with self._guard:
            for mq in sorted(self.held):
                got = self.admin.brokers.lock_batch_mq(
                    self.cluster.broker(mq.broker_name).addr, self.group, [mq])
                assert got == [mq], f"{mq.key} is locked by someone else"

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self._renew()

    def start(self) -> "LockHolder":
        self._thread.start()
        return self

    def release(self, mq: MessageQueue) -> None:
        with self._guard:
            self.held.discard(mq)
            self.admin.brokers.unlock_batch_mq(self.cluster.broker(mq.broker_name).addr,
                                               self.group, [mq])

    def abandon(self, mq: MessageQueue) -> None:
        with self._guard:
            self.held.discard(mq)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.admin.close()


_MQ_KEY = re.compile(r'\{\s*"brokerName"\s*:\s*"([^"]*)"\s*,\s*"queueId"\s*:\s*(\d+)\s*,\s*'
                     r'"topic"\s*:\s*"([^"]*)"\s*\}\s*:')


def running_queues(cluster, group: str, client_id: str, topic: str) -> List[MessageQueue]:
    """The queues of ``topic`` a member reports reading (the keys of its ConsumerRunningInfo's
    ``mqTable``, as ``mqadmin consumerProgress`` reads them), asked through a broker."""
    with Admin(cluster.namesrv_addr) as admin:
        body = admin.brokers.get_consumer_running_info(cluster.broker("broker-a").addr, group,
                                                       client_id).decode("utf-8", "replace")
    return sorted(MessageQueue(t, b, int(q)) for b, q, t in _MQ_KEY.findall(body) if t == topic)
