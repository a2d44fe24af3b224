"""A broker's subscription groups (the genuine SubscriptionGroupManager), as 4.9.8 keeps them.

A consumer group's retry settings live here: how many queues its retry topic ``%RETRY%<group>``
gets (``retryQueueNums``, 1) and after how many redeliveries a sent-back message goes to its
dead-letter topic ``%DLQ%<group>`` instead (``retryMaxTimes``, 16). A group the broker has
never seen is created with the defaults on first use when ``autoCreateSubscriptionGroup`` is on
(the default), and always for the system groups (``CID_RMQ_SYS_`` prefix); otherwise the
lookup finds nothing and the request is refused with SUBSCRIPTION_GROUP_NOT_EXIST.

Groups are kept in memory only (a genuine broker also writes ``subscriptionGroup.json``): an
auto-created group comes back the same after a restart, a group set with :meth:`put` does not.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Dict, Optional

from ..client.protocol.codes import ResponseCode
from ..client.protocol.frame import RemotingCommand

UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200  # RequestCode
SYSTEM_GROUP_PREFIX = "CID_RMQ_SYS_"  # MixAll.isSysConsumerGroup
DEFAULT_RETRY_MAX_TIMES = 16


@dataclass
class SubscriptionGroupConfig:
    """The genuine SubscriptionGroupConfig's fields that the embedded broker acts on."""

    group_name: str
    retry_queue_nums: int = 1
    retry_max_times: int = DEFAULT_RETRY_MAX_TIMES


class SubscriptionGroups:
    """Group name to its config, created on demand as the genuine broker does."""

    def __init__(self) -> None:
        self.table: Dict[str, SubscriptionGroupConfig] = {}

    def find(self, group: str, auto_create: bool,
             retry_max_times: int = DEFAULT_RETRY_MAX_TIMES) -> Optional[SubscriptionGroupConfig]:
        """findSubscriptionGroupConfig: the group's config, created with the defaults (and
        ``retry_max_times``, the embedded broker's default for new groups) when the broker
        auto-creates groups or the group is a system group; None otherwise."""
        config = self.table.get(group)
        if config is None and (auto_create or group.startswith(SYSTEM_GROUP_PREFIX)):
            config = self.table[group] = SubscriptionGroupConfig(
                group, retry_max_times=retry_max_times)
        return config

    def put(self, config: SubscriptionGroupConfig) -> None:
        """Create or replace a group's config (``mqadmin updateSubGroup``)."""
        self.table[config.group_name] = config


def handle_update_subscription_group(groups: SubscriptionGroups, cmd: RemotingCommand,
                                     version: int) -> RemotingCommand:
    """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200, ``mqadmin updateSubGroup``): the body is the
    group's SubscriptionGroupConfig as JSON; fields left out keep Java's defaults. Answered
    SUCCESS with no remark (AdminBrokerProcessor.updateAndCreateSubscriptionGroup)."""
    try:
        data = json.loads(cmd.body.decode("utf-8") or "null")
        if data is not None:
            if not isinstance(data, dict):
                raise ValueError("the body is not a JSON object")
            groups.put(SubscriptionGroupConfig(
                str(data.get("groupName") or ""),
                retry_queue_nums=_json_int(data, "retryQueueNums", 1),
                retry_max_times=_json_int(data, "retryMaxTimes", DEFAULT_RETRY_MAX_TIMES)))
    except (UnicodeDecodeError, ValueError, TypeError) as exc:
        return cmd.make_response(ResponseCode.SYSTEM_ERROR, None,
                                 f"com.alibaba.fastjson.JSONException: {exc}", version=version)
    return cmd.make_response(ResponseCode.SUCCESS, None, None, version=version)


def _json_int(data: dict, key: str, default: int) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{key} is not a number: {value!r}")
    return int(value)
