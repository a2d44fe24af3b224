"""Topic and group permissions of 4.9's plain ACL, for the embedded brokers.

An account given only a secret (``EmbeddedCluster(acl={"ak": "sk"})``) may do everything, as
before. An account also given permissions (``acl_permissions={"ak": {...}}``, the fields of a
``plain_acl.yml`` account: ``admin``, ``defaultTopicPerm``, ``defaultGroupPerm``,
``topicPerms``, ``groupPerms``) is checked as Apache 4.9.8 checks it, read from its source
(module ``acl``, rocketmq-all-4.9.x): ``PlainAccessValidator.parse`` names the permissions a
request needs, ``PlainPermissionManager.checkPerm`` compares them with the account's, and
``Permission.checkPermission`` decides each one. No stricter than that: ``parse`` has no case
for SEND_BATCH_MESSAGE, so a batch send needs no permission on its topic (the gap
docs/security.md describes), and requests it does not name need none either.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional

from ..client.protocol.codes import RequestCode

QUERY_MESSAGE, CONSUMER_SEND_MSG_BACK = 12, 36  # request codes the client does not send
DENY, ANY, PUB, SUB = 1, 1 << 1, 1 << 2, 1 << 3
_PERMS = {"DENY": DENY, "ANY": ANY, "PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB,
          "SUB|PUB": PUB | SUB}
RETRY_PREFIX = "%RETRY%"
PERMISSION_FRAME = ("org.apache.rocketmq.acl.plain.PlainPermissionManager.checkPerm"
                    "(PlainPermissionManager.java)")


def parse_perm(text: Optional[str]) -> int:
    """``Permission.parsePermFromString``: an unknown or missing permission is DENY."""
    return DENY if text is None else _PERMS.get(text.strip(), DENY)


@dataclass(frozen=True)
class AccountPermissions:
    """One account's permissions, resources keyed as 4.9 keys them (a group by its retry
    topic)."""

    admin: bool = False
    default_topic_perm: int = DENY
    default_group_perm: int = DENY
    resources: Optional[Dict[str, int]] = field(default=None)  # None: none configured

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "AccountPermissions":
        unknown = set(config) - {"admin", "defaultTopicPerm", "defaultGroupPerm", "topicPerms",
                                 "groupPerms"}
        if unknown:
            raise ValueError(f"acl_permissions: unknown fields {sorted(unknown)}")
        resources: Dict[str, int] = {}
        for group, perm in dict(config.get("groupPerms") or {}).items():
            resources[RETRY_PREFIX + group] = parse_perm(perm)
        for topic, perm in dict(config.get("topicPerms") or {}).items():
            resources[topic] = parse_perm(perm)
        return cls(bool(config.get("admin", False)), parse_perm(config.get("defaultTopicPerm")),
                   parse_perm(config.get("defaultGroupPerm")), resources or None)


def needed_permissions(code: int, fields: Mapping[str, str]) -> Dict[str, int]:
    """What 4.9's ``PlainAccessValidator.parse`` asks of a request (resource -> permission);
    the requests it does not name (SEND_BATCH_MESSAGE among them) ask nothing. HEART_BEAT and
    UNREGISTER_CLIENT are not checked here (their groups and topics are in the body)."""
    out: Dict[str, int] = {}
    if code == RequestCode.SEND_MESSAGE:
        topic = fields.get("topic", "")
        if topic.startswith(RETRY_PREFIX):
            out[RETRY_PREFIX + fields.get("group", "")] = SUB
        else:
            out[topic] = PUB
    elif code == RequestCode.SEND_MESSAGE_V2:
        topic = fields.get("b", "")
        if topic.startswith(RETRY_PREFIX):
            out[RETRY_PREFIX + fields.get("a", "")] = SUB
        else:
            out[topic] = PUB
    elif code == CONSUMER_SEND_MSG_BACK:
        out[RETRY_PREFIX + fields.get("group", "")] = SUB
    elif code == RequestCode.PULL_MESSAGE:
        out[fields.get("topic", "")] = SUB
        out[RETRY_PREFIX + fields.get("consumerGroup", "")] = SUB
    elif code == QUERY_MESSAGE:
        out[fields.get("topic", "")] = SUB
    elif code == RequestCode.GET_CONSUMER_LIST_BY_GROUP:
        out[RETRY_PREFIX + fields.get("consumerGroup", "")] = SUB
    elif code == RequestCode.UPDATE_CONSUMER_OFFSET:
        out[RETRY_PREFIX + fields.get("consumerGroup", "")] = SUB
        out[fields.get("topic", "")] = SUB
    return out


def permission_error(account: AccountPermissions, needed: Mapping[str, int]) -> Optional[str]:
    """``PlainPermissionManager.checkPerm``: the AclException message, or None."""
    if not needed or (account.resources is None and account.admin):
        return None
    owned = account.resources or {}
    for resource, perm in needed.items():
        group = resource.startswith(RETRY_PREFIX)
        have = owned.get(resource)
        if have is None:
            have = account.default_group_perm if group else account.default_topic_perm
        if not check_permission(perm, have):
            name = f"group:{resource[len(RETRY_PREFIX):]}" if group else f"topic:{resource}"
            return f"No default permission for {name}"
    return None


def check_permission(needed: int, owned: int) -> bool:
    """``Permission.checkPermission``."""
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)
