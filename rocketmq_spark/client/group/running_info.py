"""What a group member answers GET_CONSUMER_RUNNING_INFO with: a ConsumerRunningInfo as a Java
consumer sends it (fastjson, queues as object keys), so ``mqadmin consumerProgress`` shows each
queue of ``mqTable`` with this member's address and ``consumerStatus`` the rest."""
from __future__ import annotations

import json
from typing import Dict, Iterable, List, Mapping

from ..protocol.properties import java_string_hash, split_tags_expression
from ..protocol.route import MessageQueue


def _compact(value) -> str:
    return json.dumps(value, separators=(",", ":"))


def _queue_entry(mq: MessageQueue, committed: int, locked_at_ms: int) -> str:
    key = _compact({"brokerName": mq.broker_name, "queueId": mq.queue_id, "topic": mq.topic})
    info = {"cachedMsgCount": 0, "cachedMsgMaxOffset": 0, "cachedMsgMinOffset": 0,
            "cachedMsgSizeInMiB": 0, "commitOffset": committed, "droped": False,
            "lastConsumeTimestamp": 0, "lastLockTimestamp": locked_at_ms,
            "lastPullTimestamp": 0, "locked": locked_at_ms > 0, "tryUnlockTimes": 0,
            "transactionMsgCount": 0, "transactionMsgMaxOffset": 0,
            "transactionMsgMinOffset": 0}
    return f"{key}:{_compact(info)}"


def running_info_body(*, group: str, client_id: str, strategy: str, orderly: bool,
                      started_ms: int, name_servers: Iterable[str], expression: str,
                      held: List[MessageQueue], committed: Mapping[MessageQueue, int],
                      locked_at_ms: Mapping[MessageQueue, int], topics: List[str],
                      expression_type: str = "TAG", sub_version: int = 0) -> bytes:
    """The body of the answer. ``locked_at_ms``: when each locked queue's lock was last
    granted (epoch ms); a queue not in it is not locked. A SQL92 subscription has no tags."""
    entries = [_queue_entry(mq, committed.get(mq, 0), locked_at_ms.get(mq, 0)) for mq in held]
    properties: Dict[str, str] = {
        "PROP_CONSUME_TYPE": "CONSUME_ACTIVELY", "PROP_CONSUMEORDERLY": str(orderly).lower(),
        "PROP_CONSUMER_START_TIMESTAMP": str(started_ms),
        "PROP_NAMESERVER_ADDR": ";".join(name_servers), "consumerGroup": group,
        "messageModel": "CLUSTERING", "allocateMessageQueueStrategy": strategy,
        "clientId": client_id}
    tags = split_tags_expression(expression) if expression_type == "TAG" else []
    codes = [java_string_hash(t) for t in tags]
    subscriptions = [{"classFilterMode": False, "codeSet": codes,
                      "expressionType": expression_type, "subString": expression or "*",
                      "subVersion": sub_version, "tagsSet": tags,
                      "topic": topic} for topic in topics]
    return ('{"mqTable":{' + ",".join(entries) + '},"properties":' + _compact(properties)
            + ',"statusTable":{},"subscriptionSet":' + _compact(subscriptions)
            + "}").encode("utf-8")
