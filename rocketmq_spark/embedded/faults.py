"""Fault injection for tests: fail, delay or drop the next N matching requests.

A dropped request is read and ignored: no effect and no answer (for oneway requests such as
END_TRANSACTION, a frame lost on its way).

Rules are shared by every server of a cluster and consumed in the order they were added; a
request matches a rule when its code is in the rule's codes (any code when none are given) and
its server is one of the rule's servers (any server, name server included, when none are given).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import FrozenSet, List, Optional


@dataclass
class FaultRule:
    kind: str                      # "fail", "delay" or "drop"
    remaining: int
    code: int = 1
    remark: str = ""
    seconds: float = 0.0
    request_codes: Optional[FrozenSet[int]] = None
    servers: Optional[FrozenSet[str]] = None

    def matches(self, server: str, request_code: int) -> bool:
        return ((self.request_codes is None or request_code in self.request_codes)
                and (self.servers is None or server in self.servers))


class FaultInjector:
    """The pending rules of one cluster (touched only on its event loop)."""

    def __init__(self) -> None:
        self.rules: List[FaultRule] = []

    def add(self, rule: FaultRule) -> None:
        if rule.remaining > 0:
            self.rules.append(rule)

    def clear(self) -> None:
        self.rules.clear()

    def take(self, server: str, request_code: int) -> Optional[FaultRule]:
        """The first rule matching this request, with one use consumed; None if none."""
        if not self.rules:
            return None
        for rule in self.rules:
            if rule.matches(server, request_code):
                rule.remaining -= 1
                if rule.remaining <= 0:
                    self.rules.remove(rule)
                return rule
        return None
