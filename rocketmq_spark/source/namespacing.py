"""The source's names on the wire under the option ``namespace`` (rules:
:mod:`rocketmq_spark.client.namespace`).

The options are turned into wire names once, when they are parsed (:func:`wire_names`): the
subscribed topics, the assigned queues, the queues of per-queue start and end offsets and the
consumer group are put into the namespace, as Java's consumer does with ``withNamespace`` /
``queueWithNamespace``. Everything after that (routes, pulls, offsets, commits, heartbeats,
Spark's checkpoint) uses the wire names; only what the user reads is unwrapped again: the
rows' ``topic`` column and :class:`.lag.RocketMQLagListener`'s report. A topic pattern is
matched against the names within the namespace, without it (:func:`pattern_topics`).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Dict, Iterable, List, Mapping

from ..client.namespace import (
    is_wrapped, unwrap, wrap, wrapped_name_problem,
)
from ..client.protocol.route import MessageQueue
from ..options import OptionError


def _topic(namespace: str, topic: str, option: str) -> str:
    wired = wrap(namespace, topic)
    problem = wrapped_name_problem(wired)
    if problem:
        raise OptionError(f"option {option}: in namespace {namespace!r}, {problem}")
    return wired


def _queues(namespace: str, queues: Mapping[MessageQueue, Any], option: str
            ) -> Dict[MessageQueue, Any]:
    return {MessageQueue(_topic(namespace, mq.topic, option), mq.broker_name, mq.queue_id): v
            for mq, v in queues.items()}


def wire_names(kw: Dict[str, Any]) -> None:
    """Put the names of the parsed source options ``kw`` (the SourceOptions fields) into
    the namespace of ``kw["connection"]``, in place; nothing changes without a namespace. Names
    already in the namespace stay as they are, so the checkpoint's own ``ns%T/broker/0`` keys
    may be given."""
    namespace = kw["connection"].namespace
    if not namespace:
        return
    kw["topics"] = tuple(dict.fromkeys(_topic(namespace, t, "subscribe")
                                       for t in kw.get("topics", ())))
    kw["assigned"] = tuple(sorted(_queues(namespace, dict.fromkeys(kw.get("assigned", ())),
                                          "assign")))
    for key, option in (("starting", "startingOffsets"), ("ending", "endingOffsets")):
        bound = kw.get(key)
        if bound is not None and bound.per_queue:
            kw[key] = dataclasses.replace(bound, per_queue=_queues(namespace, bound.per_queue,
                                                                   option))
    group = wrap(namespace, kw["consumer_group"])
    problem = wrapped_name_problem(group, "group")
    if problem:
        raise OptionError(f"option consumerGroup: in namespace {namespace!r}, {problem}")
    kw["consumer_group"] = group


def pattern_topics(topics: Iterable[str], pattern: str, namespace: str) -> List[str]:
    """The wire names of ``topics`` that ``pattern`` matches in full: with a namespace, only
    topics in it, matched by their name without it."""
    regex = re.compile(pattern)
    if not namespace:
        return [t for t in topics if regex.fullmatch(t)]
    return [t for t in topics
            if is_wrapped(t, namespace) and regex.fullmatch(unwrap(t, namespace))]


def queue_key_without_namespace(key: str, namespace: str) -> str:
    """A ``topic/brokerName/queueId`` key with the topic out of ``namespace``."""
    try:
        mq = MessageQueue.from_key(key)
    except ValueError:
        return key
    return MessageQueue(unwrap(mq.topic, namespace), mq.broker_name, mq.queue_id).key
