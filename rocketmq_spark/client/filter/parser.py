"""Recursive-descent parser for the SQL92 filter language, rule for rule as Apache's
SelectorParser.jj.

Precedence, loosest first: OR; AND; ``=`` ``<>`` ``IS [NOT] NULL``; ``<`` ``<=`` ``>`` ``>=``
BETWEEN IN CONTAINS...; unary ``+`` ``-`` NOT. NOT binds tighter than ``=``: ``NOT a = 'x'`` is
``(NOT a) = 'x'``.

The checks Apache makes while building the tree (ComparisonExpression, ConstantExpression,
SelectorParser.asBooleanExpression) are made here too, so an expression refused by the broker is
refused here, at the position of the part at fault.
"""
from __future__ import annotations

import math
from typing import Any, List, Optional, Tuple

from . import lexer as lx
from .errors import FilterSyntaxError
from .javavalues import INT_MAX, INT_MIN, LONG_MAX, EvaluationError, JDouble, JInt, JLong, \
    java_compare
from .nodes import BoolCast, Compare, Const, Equal, InList, Logic, Negate, Not, Prop, \
    StringMatch, is_boolean

DOUBLE_MIN_VALUE = 5e-324  # Java's Double.MIN_VALUE: the smallest positive double
_RELATIONAL = (">", ">=", "<", "<=")
_STRING_MATCHES = lx.KEYWORDS_5_1_3


def _describe(node: Any) -> str:
    if isinstance(node, Const):
        value = node.value
        if value is None:
            return "NULL"
        if isinstance(value, bool):
            return "TRUE" if value else "FALSE"
        if isinstance(value, str):
            return "'" + value.replace("'", "''") + "'"
        return repr(float(value)) if isinstance(value, JDouble) else str(int(value))
    if isinstance(node, Prop):
        return f"property {node.name}"
    return "a condition" if is_boolean(node) else "an expression"


class Parser:
    """One parse of one text; ``parse()`` returns (root node, ignored tail or None)."""

    def __init__(self, text: str, string_operators: bool):
        self.text = text
        self.string_operators = string_operators
        keywords = lx.KEYWORDS_4_9 + (_STRING_MATCHES if string_operators else ())
        self.tokens = lx.Lexer(text, keywords)

    # -- helpers ------------------------------------------------------------------------------
    def error(self, reason: str, pos: int) -> FilterSyntaxError:
        return FilterSyntaxError(reason, self.text, pos + 1)

    def expect(self, kind: str, what: str) -> lx.Token:
        token = self.tokens.peek()
        if token.kind != kind:
            raise self.error(f"expected {what}, found {token.describe()}", token.pos)
        return self.tokens.take()

    def as_boolean(self, node: Any) -> Any:
        """SelectorParser.asBooleanExpression: conditions pass, a bare property is cast."""
        if is_boolean(node):
            return node
        if isinstance(node, Prop):
            return BoolCast(node, node.pos)
        raise self.error(f"{_describe(node)} is not a condition (it gives no true/false value)",
                         node.pos)

    # -- grammar ------------------------------------------------------------------------------
    def parse(self) -> Tuple[Any, Optional[lx.Token]]:
        root = self.as_boolean(self.parse_or())
        following = self.tokens.peek()
        return root, (None if following.kind == lx.EOF else following)

    def parse_or(self) -> Any:
        left = self.parse_and()
        while self.tokens.peek().kind == "OR":
            op = self.tokens.take()
            right = self.parse_and()
            left = Logic("OR", self.as_boolean(left), self.as_boolean(right), op.pos)
        return left

    def parse_and(self) -> Any:
        left = self.parse_equality()
        while self.tokens.peek().kind == "AND":
            op = self.tokens.take()
            right = self.parse_equality()
            left = Logic("AND", self.as_boolean(left), self.as_boolean(right), op.pos)
        return left

    def parse_equality(self) -> Any:
        left = self.parse_comparison()
        while True:
            token = self.tokens.peek()
            if token.kind in ("=", "<>"):
                self.tokens.take()
                equal = self.create_equal(left, self.parse_comparison(), token.pos)
                left = equal if token.kind == "=" else Not(equal, token.pos)
            elif token.kind == "IS":
                self.tokens.take()
                if self.tokens.peek().kind == "NULL":
                    self.tokens.take()
                    left = Equal(left, Const(None, token.pos), token.pos)
                else:
                    self.expect("NOT", "NULL or NOT NULL after IS")
                    self.expect("NULL", "NULL after IS NOT")
                    left = Not(Equal(left, Const(None, token.pos), token.pos), token.pos)
            else:
                return left

    def parse_comparison(self) -> Any:
        left = self.parse_unary()
        while True:
            token = self.tokens.peek()
            kind = token.kind
            if kind in _RELATIONAL:
                self.tokens.take()
                left = self.create_relational(kind, left, self.parse_unary(), token.pos)
            elif kind in _STRING_MATCHES:
                self.tokens.take()
                left = StringMatch(kind, left, self.string_literal(kind), False, token.pos)
            elif kind == "BETWEEN":
                self.tokens.take()
                left = self.parse_between(left, False, token.pos)
            elif kind == "IN":
                self.tokens.take()
                left = self.parse_in(left, False, token.pos)
            elif kind == "NOT":
                left = self.parse_negated_comparison(left, token)
            else:
                return left

    def parse_negated_comparison(self, left: Any, not_token: lx.Token) -> Any:
        follower = self.tokens.peek(1)
        kind = follower.kind
        if kind not in self._comparison_words():
            words = "BETWEEN, IN" + (", CONTAINS, STARTSWITH or ENDSWITH"
                                     if self.string_operators else "")
            raise self.error(f"expected {words} after NOT, found {follower.describe()}",
                             follower.pos)
        self.tokens.take()
        self.tokens.take()
        if kind == "BETWEEN":
            return self.parse_between(left, True, not_token.pos)
        if kind == "IN":
            return self.parse_in(left, True, not_token.pos)
        return StringMatch(kind, left, self.string_literal(f"NOT {kind}"), True, not_token.pos)

    def _comparison_words(self) -> Tuple[str, ...]:
        return ("BETWEEN", "IN") + (_STRING_MATCHES if self.string_operators else ())

    def parse_between(self, value: Any, negated: bool, pos: int) -> Any:
        low = self.parse_unary()
        self.expect("AND", "AND between the bounds of BETWEEN")
        high = self.parse_unary()
        if negated:  # createNotBetween: no check of the bounds' order
            return Logic("OR", self.create_relational("<", value, low, pos),
                         self.create_relational(">", value, high, pos), pos)
        if isinstance(low, Const) and isinstance(high, Const):
            if low.value is None or high.value is None:
                raise self.error("the bounds of BETWEEN cannot be NULL", pos)
            try:
                reversed_bounds = java_compare(high.value, low.value) < 0
            except EvaluationError:
                raise self.error(f"the bounds of BETWEEN ({_describe(low)} and "
                                 f"{_describe(high)}) cannot be compared", pos) from None
            if reversed_bounds:
                raise self.error(f"the lower bound of BETWEEN ({_describe(low)}) must be less "
                                 f"than or equal to the upper bound ({_describe(high)})", pos)
        return Logic("AND", self.create_relational(">=", value, low, pos),
                     self.create_relational("<=", value, high, pos), pos)

    def parse_in(self, value: Any, negated: bool, pos: int) -> Any:
        self.expect("(", "'(' after IN")
        values: List[str] = [self.string_literal("IN")]
        while self.tokens.peek().kind == ",":
            self.tokens.take()
            values.append(self.string_literal("IN"))
        self.expect(")", "',' or ')' in the IN list")
        if not isinstance(value, Prop):
            raise self.error(f"IN needs a property on its left, not {_describe(value)}", pos)
        return InList(value, frozenset(values), negated, pos)

    def parse_unary(self) -> Any:
        token = self.tokens.peek()
        if token.kind == "+":
            self.tokens.take()
            return self.parse_unary()
        if token.kind == "-":
            self.tokens.take()
            return Negate(self.parse_unary(), token.pos)
        if token.kind == "NOT":
            self.tokens.take()
            return Not(self.as_boolean(self.parse_unary()), token.pos)
        return self.parse_primary()

    def parse_primary(self) -> Any:
        token = self.tokens.peek()
        kind = token.kind
        if kind == lx.ID:
            self.tokens.take()
            return Prop(token.text, token.pos)
        if kind == "(":
            self.tokens.take()
            inner = self.parse_or()
            self.expect(")", "')'")
            return inner
        if kind == lx.STRING:
            return Const(self.string_literal("a value"), token.pos)
        if kind in (lx.INTEGER, lx.FLOAT, "TRUE", "FALSE", "NULL"):
            self.tokens.take()
            return Const(self.literal_value(token), token.pos)
        raise self.error(f"expected a property, a literal or '(', found {token.describe()}",
                         token.pos)

    # -- literals -----------------------------------------------------------------------------
    def string_literal(self, after: str) -> str:
        token = self.expect(lx.STRING, f"a string literal in single quotes for {after}")
        return token.text[1:-1].replace("''", "'")

    def literal_value(self, token: lx.Token) -> Any:
        if token.kind == "TRUE":
            return True
        if token.kind == "FALSE":
            return False
        if token.kind == "NULL":
            return None
        if token.kind == lx.INTEGER:
            digits = token.text.rstrip("lL")
            value = int(digits) if len(digits) <= 19 else LONG_MAX + 1
            if value > LONG_MAX:
                raise self.error(f"{token.text} is out of range: integers go up to {LONG_MAX}",
                                 token.pos)
            return JInt(value) if INT_MIN <= value <= INT_MAX else JLong(value)
        value = float(token.text)  # Python's float() takes Java's float literal syntax
        if math.isinf(value):
            raise self.error(f"{token.text} is greater than the largest double", token.pos)
        if value < DOUBLE_MIN_VALUE:
            raise self.error(f"{token.text} is less than Double.MIN_VALUE (4.9E-324): a float "
                             "literal must be positive (write 0 rather than 0.0)", token.pos)
        return JDouble(value)

    # -- checks made when Apache builds a comparison ------------------------------------------
    def create_equal(self, left: Any, right: Any, pos: int) -> Equal:
        for side in (left, right):
            if isinstance(side, Const) and side.value is None:
                raise self.error("NULL cannot be compared with = or <> (use IS NULL or "
                                 "IS NOT NULL)", side.pos)
        if isinstance(left, Const) and isinstance(right, Const) and \
                isinstance(left.value, bool) and not isinstance(right.value, bool):
            raise self.error(f"{_describe(left)} cannot be compared with {_describe(right)}", pos)
        return Equal(left, right, pos)

    def create_relational(self, op: str, left: Any, right: Any, pos: int) -> Compare:
        for side in (left, right):
            if isinstance(side, Const):
                if not isinstance(side.value, (JInt, JLong, JDouble)):
                    raise self.error(f"{_describe(side)} cannot be compared with {op}: only "
                                     "numbers can (and properties, read as numbers)", side.pos)
            elif is_boolean(side):
                raise self.error(f"{_describe(side)} cannot be compared with {op}", side.pos)
        return Compare(op, left, right, pos)
