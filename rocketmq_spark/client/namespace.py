"""RocketMQ namespaces: how a client puts topic and group names into a namespace and takes
them out again, by the rules of Apache RocketMQ's ``NamespaceUtil`` (remoting module, 5.x;
``common/protocol`` in 4.9.x, same rules) and ``ClientConfig.withNamespace`` /
``withoutNamespace`` / ``queueWithNamespace``.

* A name in namespace ``ns`` is ``ns%name``; a retry or dead-letter name keeps its prefix in
  front: ``%RETRY%ns%group``, ``%DLQ%ns%group``.
* System topics and groups (TopicValidator's system topics, the ``rmq_sys_`` prefix, groups
  starting ``CID_RMQ_SYS_``) belong to no namespace: they are never wrapped nor unwrapped.
* Wrapping a name already in the namespace leaves it as it is, so wrapping twice is harmless.

Pure functions on strings; the empty namespace means none.
"""
from __future__ import annotations

import re
from typing import Optional

SEPARATOR = "%"
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
SYSTEM_TOPIC_PREFIX = "rmq_sys_"
SYSTEM_GROUP_PREFIX = "CID_RMQ_SYS_"
# TopicValidator's SYSTEM_TOPIC_SET: 4.9.x's, and the names 5.x added.
SYSTEM_TOPICS = frozenset({
    "TBW102", "SCHEDULE_TOPIC_XXXX", "BenchmarkTest", "RMQ_SYS_TRANS_HALF_TOPIC",
    "RMQ_SYS_TRACE_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC",
    "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT",
    "CHECKPOINT_TOPIC", "RMQ_SYS_ROCKSDB_TRANS_HALF_TOPIC",
    "RMQ_SYS_ROCKSDB_TRANS_OP_HALF_TOPIC",
})
# A wrapped name must pass TopicValidator's ^[%|a-zA-Z0-9_-]+$; '%' is the separator, and
# NamespaceUtil cuts a name at its first '%', so a namespace holding one never comes back off.
NAMESPACE_CHARS = re.compile(r"^[|a-zA-Z0-9_-]+$")
TOPIC_MAX_LENGTH = 127
GROUP_MAX_LENGTH = 255
NAMESPACE_MAX_LENGTH = TOPIC_MAX_LENGTH - 2  # room for "%" and a one-letter topic


def is_system(name: str) -> bool:
    """A system topic or group: in no namespace (NamespaceUtil.isSystemResource)."""
    return bool(name) and (name in SYSTEM_TOPICS or name.startswith(SYSTEM_TOPIC_PREFIX)
                           or name.startswith(SYSTEM_GROUP_PREFIX))


def _split_prefix(name: str):
    """(``%RETRY%``, ``%DLQ%`` or "", the rest of the name)."""
    for prefix in (RETRY_PREFIX, DLQ_PREFIX):
        if name.startswith(prefix):
            return prefix, name[len(prefix):]
    return "", name


def is_wrapped(name: str, namespace: str) -> bool:
    """``name`` (a retry or dead-letter prefix aside) is already in ``namespace``."""
    if not namespace or not name or is_system(name):
        return False
    return _split_prefix(name)[1].startswith(namespace + SEPARATOR)


def wrap(namespace: str, name: str) -> str:
    """``name`` in ``namespace``: ``ns%name``, ``%RETRY%ns%group``, ``%DLQ%ns%group``;
    unchanged without a namespace, for a system name, or when it is in the namespace already."""
    if not namespace or not name or is_system(name) or is_wrapped(name, namespace):
        return name
    prefix, rest = _split_prefix(name)
    return f"{prefix}{namespace}{SEPARATOR}{rest}"


def unwrap(name: str, namespace: str) -> str:
    """``name`` without ``namespace`` (``ns%T`` -> ``T``, ``%RETRY%ns%g`` -> ``%RETRY%g``);
    a name in another namespace, in none, or a system name, is returned as it is."""
    if not namespace or not name or not is_wrapped(name, namespace):
        return name
    prefix, rest = _split_prefix(name)
    return prefix + rest[len(namespace) + 1:]


def namespace_of(name: str) -> str:
    """The namespace ``name`` is in ("" for none): the part before its first ``%``, a retry
    or dead-letter prefix aside (NamespaceUtil.getNamespaceFromResource)."""
    if not name or is_system(name):
        return ""
    rest = _split_prefix(name)[1]
    index = rest.find(SEPARATOR)
    return rest[:index] if index > 0 else ""


def retry_topic(namespace: str, group: str) -> str:
    """The retry topic of ``group`` in ``namespace``: ``%RETRY%ns%group``."""
    return RETRY_PREFIX + wrap(namespace, group)


def dead_letter_topic(namespace: str, group: str) -> str:
    """The dead-letter topic of ``group`` in ``namespace``: ``%DLQ%ns%group``."""
    return DLQ_PREFIX + wrap(namespace, group)


def namespace_problem(namespace: str) -> Optional[str]:
    """Why ``namespace`` cannot be used (None when it can; "" is no namespace)."""
    if not namespace:
        return None
    if not NAMESPACE_CHARS.match(namespace):
        return ("may hold only letters, digits, |, _ and - (its names must pass RocketMQ's "
                "topic check ^[%|a-zA-Z0-9_-]+$, and % separates the namespace from the name)")
    if len(namespace) > NAMESPACE_MAX_LENGTH:
        return (f"is longer than {NAMESPACE_MAX_LENGTH} characters (a topic in it, "
                f"namespace%topic, must fit in {TOPIC_MAX_LENGTH})")
    if namespace.startswith(SYSTEM_TOPIC_PREFIX) or namespace.startswith(SYSTEM_GROUP_PREFIX):
        return (f"starts like a system name ({SYSTEM_TOPIC_PREFIX}, {SYSTEM_GROUP_PREFIX}): the "
                "names in it would be system names, which RocketMQ never takes a namespace "
                "off again")
    return None


def wrapped_name_problem(name: str, kind: str = "topic") -> Optional[str]:
    """Why a wrapped topic (``kind="topic"``) or group name is too long (None when it fits)."""
    limit = TOPIC_MAX_LENGTH if kind == "topic" else GROUP_MAX_LENGTH
    if len(name) > limit:
        return f"{name!r} is longer than a {kind} name may be ({limit} characters)"
    return None
