"""A broker's whole tables on request, as 4.9.8's AdminBrokerProcessor answers them: what a
genuine slave's SlaveSynchronize asks its master for every 10 s (and ``mqadmin`` tools too).

* GET_ALL_TOPIC_CONFIG (21): TopicConfigManager's ``{"dataVersion":..,"topicConfigTable":..}``,
  with ``extFields`` ``{}`` (its response header class has no fields);
* GET_ALL_CONSUMER_OFFSET (43): ConsumerOffsetManager's ``{"offsetTable":{"topic@group":
  {queueId:offset}}}`` (fastjson: bare integer keys);
* GET_ALL_DELAY_OFFSET (45): the schedule service's ``{"offsetTable":{level:offset}}``;
* GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201): SubscriptionGroupManager's ``{"dataVersion":..,
  "subscriptionGroupTable":..}``, every SubscriptionGroupConfig field.

No remark on any of them. The tables iterate as their ConcurrentHashMaps do (2,048 bins for
topics and groups, 1,024 for offsets; the genuine capture's order). A table's dataVersion
counts the changes this module saw between answers (counter 0 and the time of the first answer
at first; a genuine broker counts every change from its start, so counters differ).
"""
from __future__ import annotations

import time
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from ..client.protocol.codes import ResponseCode
from ..client.protocol.frame import RemotingCommand
from ..client.protocol.properties import java_string_hash
from ..client.protocol.route import dumps_fastjson
from .context import BrokerContext
from .schedule import SCHEDULE_GROUP, SCHEDULE_TOPIC
from .topic_types import topic_config_json

GET_ALL_TOPIC_CONFIG = 21
GET_ALL_CONSUMER_OFFSET = 43
GET_ALL_DELAY_OFFSET = 45
GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
TABLE_BINS = 2048  # new ConcurrentHashMap(1024): tableSizeFor(1024 * 1.5 + 1)
OFFSET_BINS = 1024  # new ConcurrentHashMap(512)


def concurrent_hashmap_order(keys: Iterable[str], bins: int) -> List[str]:
    """The iteration order of a ConcurrentHashMap with ``bins`` bins holding String ``keys``
    (in insertion order within a bin)."""
    def bin_of(key: str) -> int:
        h = java_string_hash(key) & 0xFFFFFFFF
        return ((h ^ (h >> 16)) & 0x7FFFFFFF) & (bins - 1)
    return sorted(keys, key=bin_of)


class _DataVersion:
    """A table's dataVersion: a new counter and timestamp whenever the table changed."""

    def __init__(self) -> None:
        self.counter = 0
        self.timestamp: Optional[int] = None
        self._seen: object = None

    def of(self, snapshot: object) -> Dict[str, int]:
        if self.timestamp is None:
            self.timestamp, self._seen = int(time.time() * 1000), snapshot
        elif snapshot != self._seen:
            self.counter += 1
            self.timestamp, self._seen = int(time.time() * 1000), snapshot
        return {"counter": self.counter, "timestamp": self.timestamp}


class AdminTables:
    """The four GET_ALL_* handlers of one broker."""

    def __init__(self, context: BrokerContext):
        self.context = context
        self._topics_version = _DataVersion()
        self._groups_version = _DataVersion()

    def handlers(self) -> Dict[int, Callable]:
        """Request code -> handler, for the broker's dispatch table."""
        return {GET_ALL_TOPIC_CONFIG: self._topics, GET_ALL_CONSUMER_OFFSET: self._offsets,
                GET_ALL_DELAY_OFFSET: self._delay_offsets,
                GET_ALL_SUBSCRIPTIONGROUP_CONFIG: self._groups}

    def _answer(self, cmd: RemotingCommand, body: bytes,
                ext: Optional[Dict[str, str]] = None) -> RemotingCommand:
        return cmd.make_response(ResponseCode.SUCCESS, ext, None, body=body,
                                 version=self.context.options.version)

    def _topics(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        topics = self.context.store.topics
        table = {}
        for name in concurrent_hashmap_order(topics, TABLE_BINS):
            table[name] = topic_config_json(topics[name], self.context.options.at_least("5.1"))
        version = self._topics_version.of(table)
        return self._answer(cmd, dumps_fastjson(
            {"dataVersion": version, "topicConfigTable": table}), {})

    def _offset_tables(self) -> Tuple[Dict[str, Dict[int, int]], Dict[int, int]]:
        consumers: Dict[str, Dict[int, int]] = {}
        delays: Dict[int, int] = {}
        for (topic, group), table in self.context.store.offsets.items():
            if (topic, group) == (SCHEDULE_TOPIC, SCHEDULE_GROUP):
                delays = {queue_id + 1: offset for queue_id, offset in sorted(table.items())}
            else:
                consumers[f"{topic}@{group}"] = dict(sorted(table.items()))
        return consumers, delays

    def _offsets(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        consumers, _ = self._offset_tables()
        ordered = {key: consumers[key]
                   for key in concurrent_hashmap_order(consumers, OFFSET_BINS)}
        return self._answer(cmd, dumps_fastjson({"offsetTable": ordered}, standard=False))

    def _delay_offsets(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        _, delays = self._offset_tables()
        return self._answer(cmd, dumps_fastjson({"offsetTable": delays}, standard=False))

    def _groups(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        groups = self.context.clients.subscription_groups.table
        table = {}
        for name in concurrent_hashmap_order(groups, TABLE_BINS):
            g = groups[name]
            table[name] = {"brokerId": 0, "consumeBroadcastEnable": True, "consumeEnable": True,
                           "consumeFromMinEnable": True, "groupName": g.group_name,
                           "notifyConsumerIdsChangedEnable": True,
                           "retryMaxTimes": g.retry_max_times,
                           "retryQueueNums": g.retry_queue_nums,
                           "whichBrokerWhenConsumeSlowly": 1}
        version = self._groups_version.of(table)
        return self._answer(cmd, dumps_fastjson(
            {"dataVersion": version, "subscriptionGroupTable": table}))
