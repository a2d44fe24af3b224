"""The parsed form of an SQL92 filter expression: one class per Apache expression class.

Positions are 0-based offsets into the expression text (errors report them 1-based).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Tuple


@dataclass(frozen=True)
class Const:
    """ConstantExpression: None (NULL), bool, str, JInt, JLong or JDouble."""

    value: Any
    pos: int


@dataclass(frozen=True)
class Prop:
    """PropertyExpression: a message property, a String or missing (NULL)."""

    name: str
    pos: int


@dataclass(frozen=True)
class Negate:
    """UnaryExpression.createNegate: ``-x`` (NULL unless x is a number)."""

    operand: Any
    pos: int


@dataclass(frozen=True)
class Not:
    """UnaryExpression.createNOT."""

    operand: Any
    pos: int


@dataclass(frozen=True)
class BoolCast:
    """UnaryExpression.createBooleanCast: a bare property used as a condition."""

    operand: Prop
    pos: int


@dataclass(frozen=True)
class Logic:
    """LogicExpression: ``op`` is AND or OR."""

    op: str
    left: Any
    right: Any
    pos: int


@dataclass(frozen=True)
class Equal:
    """ComparisonExpression's equality (``=``; ``<>`` and IS NOT NULL wrap it in Not)."""

    left: Any
    right: Any
    pos: int


@dataclass(frozen=True)
class Compare:
    """ComparisonExpression ``<``, ``<=``, ``>``, ``>=``."""

    op: str
    left: Any
    right: Any
    pos: int


@dataclass(frozen=True)
class InList:
    """UnaryInExpression: ``prop [NOT] IN ('a', 'b')``."""

    prop: Prop
    values: frozenset
    negated: bool
    pos: int


@dataclass(frozen=True)
class StringMatch:
    """5.1.3's ``[NOT] CONTAINS``, ``[NOT] STARTSWITH``, ``[NOT] ENDSWITH`` (``op`` the keyword)."""

    op: str
    operand: Any
    search: str
    negated: bool
    pos: int


BOOLEAN_NODES = (Not, BoolCast, Logic, Equal, Compare, InList, StringMatch)


def is_boolean(node: Any) -> bool:
    """Whether Apache types ``node`` as a BooleanExpression (TRUE, FALSE and NULL literals are)."""
    if isinstance(node, Const):
        return node.value is None or isinstance(node.value, bool)
    return isinstance(node, BOOLEAN_NODES)


def children(node: Any) -> Tuple[Any, ...]:
    if isinstance(node, (Negate, Not, BoolCast, StringMatch)):
        return (node.operand,)
    if isinstance(node, (Logic, Equal, Compare)):
        return (node.left, node.right)
    if isinstance(node, InList):
        return (node.prop,)
    return ()


def walk(node: Any) -> Iterator[Any]:
    """Every node, depth first, left to right."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(children(current)))
