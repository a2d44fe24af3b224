"""Turns a parsed SQL92 expression into nested closures, so a broker filters a message without
walking the tree and dispatching on node types each time.

Each closure takes the message's properties and returns what Apache's ``evaluate`` returns:
None (SQL NULL, unknown), a bool, a str, or a JInt/JLong/JDouble, or raises EvaluationError where
Java throws. The common shapes (property against literal, IS NULL, IN) get closures of their own;
everything else goes through the generic rules of javavalues.
"""
from __future__ import annotations

import operator
from typing import Any, Callable, Mapping, Optional, Tuple

from .javavalues import INT_MAX, INT_MIN, LONG_MAX, LONG_MIN, NUMBER_TYPES, JDouble, JInt, \
    boolean_value_of, double_compare, double_value_of, java_compare, java_equals, \
    parse_java_integer, string_converter
from .nodes import BoolCast, Compare, Const, Equal, InList, Logic, Negate, Not, Prop, StringMatch

Evaluator = Callable[[Mapping[str, str]], Any]
_NO_CONSTANT: Tuple[bool, Any] = (False, None)
_ORDER = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
_FLIPPED = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}


def _constant(node: Any) -> Tuple[bool, Any]:
    """(True, value) when ``node`` always evaluates to ``value`` without error."""
    if isinstance(node, Const):
        return True, node.value
    if isinstance(node, Negate):
        if isinstance(node.operand, Prop):
            return True, None  # a property is a String: negating it gives NULL
        known, value = _constant(node.operand)
        if known:
            return True, (type(value)(-value) if type(value) in NUMBER_TYPES else None)
    return _NO_CONSTANT


def compile_node(node: Any) -> Evaluator:
    known, value = _constant(node)
    if known:
        return lambda props: value
    builder = _BUILDERS[type(node)]
    return builder(node)


def _prop(node: Prop) -> Evaluator:
    name = node.name
    return lambda props: props.get(name)


def _negate(node: Negate) -> Evaluator:
    inner = compile_node(node.operand)

    def negate(props):
        value = inner(props)
        return type(value)(-value) if type(value) in NUMBER_TYPES else None
    return negate


def _not(node: Not) -> Evaluator:
    inner = compile_node(node.operand)

    def negation(props):
        value = inner(props)
        return None if value is None else not value
    return negation


def _bool_cast(node: BoolCast) -> Evaluator:
    name = node.operand.name

    def cast(props):
        value = props.get(name)
        if value is None:
            return None
        return value if type(value) is bool else False  # a property (a String) is not true
    return cast


def _logic(node: Logic) -> Evaluator:
    """AND/OR. A chain ``x1 AND x2 AND x3`` (left-deep, as parsed) becomes one closure over its
    operands, so long generated chains need no deep recursion; the result, the order of
    evaluation and where it stops are those of the nested Java expressions."""
    operands = []
    current = node
    while isinstance(current, Logic) and current.op == node.op:
        operands.append(current.right)
        current = current.left
    operands.append(current)
    evaluators = [compile_node(operand) for operand in reversed(operands)]
    stop = node.op == "OR"  # the value that decides: True for OR, False for AND
    if len(evaluators) == 2:
        left, right = evaluators

        def pair(props):
            lv = left(props)
            if lv is stop:
                return stop
            rv = right(props)
            if rv is stop:
                return stop
            return None if lv is None or rv is None else not stop
        return pair

    def chain(props):
        unknown = False
        for evaluate in evaluators:
            value = evaluate(props)
            if value is stop:
                return stop
            if value is None:
                unknown = True
        return None if unknown else not stop
    return chain


def equal_values(lv: Any, rv: Any) -> Optional[bool]:
    """The ``=`` of ComparisonExpression: NULL = NULL is true, NULL on the left alone unknown,
    NULL on the right alone false; then equals, then compare (which may convert or fail)."""
    if lv is None:
        return True if rv is None else None
    if rv is None:
        return False
    if java_equals(lv, rv):
        return True
    return java_compare(lv, rv) == 0


def _equal(node: Equal) -> Evaluator:
    known, constant = _constant(node.right)
    if isinstance(node.left, Prop) and known:
        name = node.left.name
        if constant is None:  # IS NULL
            return lambda props: props.get(name) is None
        if type(constant) is str:
            def equal_string(props):
                value = props.get(name)
                return None if value is None else value == constant
            return equal_string
        if type(constant) is bool:
            def equal_boolean(props):
                value = props.get(name)
                return None if value is None else boolean_value_of(value) == constant
            return equal_boolean
        convert = string_converter(type(constant))

        def equal_number(props):
            value = props.get(name)
            if value is None:
                return None
            return _same_number(convert(value), constant)
        return equal_number
    left, right = compile_node(node.left), compile_node(node.right)
    return lambda props: equal_values(left(props), right(props))


def _same_number(converted: Any, constant: Any) -> bool:
    if type(constant) is JDouble:
        return double_compare(converted, constant) == 0
    return converted == constant


def _compare(node: Compare) -> Evaluator:
    op = node.op
    known_right, right_value = _constant(node.right)
    known_left, left_value = _constant(node.left)
    if isinstance(node.left, Prop) and known_right and type(right_value) in NUMBER_TYPES:
        return _property_against_number(node.left.name, op, right_value)
    if isinstance(node.right, Prop) and known_left and type(left_value) in NUMBER_TYPES:
        return _property_against_number(node.right.name, _FLIPPED[op], left_value)
    left, right = compile_node(node.left), compile_node(node.right)
    order = _ORDER[op]

    def compare(props):
        lv = left(props)
        if lv is None:
            return None
        rv = right(props)
        if rv is None:
            return None
        if type(lv) is str and type(rv) is str:  # two Strings compare as doubles
            return order(double_compare(double_value_of(lv), double_value_of(rv)), 0)
        return order(java_compare(lv, rv), 0)
    return compare


def _property_against_number(name: str, op: str, constant: Any) -> Evaluator:
    """``prop OP literal``: the String converts to the literal's class (or the match fails)."""
    convert = string_converter(type(constant))
    order = _ORDER[op]
    if type(constant) is JDouble:
        def compare_double(props):
            value = props.get(name)
            if value is None:
                return None
            return order(double_compare(convert(value), constant), 0)
        return compare_double
    bound = int(constant)
    low, high = (INT_MIN, INT_MAX) if type(constant) is JInt else (LONG_MIN, LONG_MAX)

    def compare_integer(props):
        value = props.get(name)
        if value is None:
            return None
        return order(parse_java_integer(value, low, high), bound)
    return compare_integer


def _in_list(node: InList) -> Evaluator:
    name, values, negated = node.prop.name, node.values, node.negated

    def in_list(props):
        value = props.get(name)
        if type(value) is not str:
            return None
        return (value in values) != negated
    return in_list


def _string_match(node: StringMatch) -> Evaluator:
    search, negated = node.search, node.negated
    if not search:
        return lambda props: False  # Apache answers false before even reading the property
    test = {"CONTAINS": lambda s: search in s, "STARTSWITH": lambda s: s.startswith(search),
            "ENDSWITH": lambda s: s.endswith(search)}[node.op]
    inner = compile_node(node.operand)

    def string_match(props):
        value = inner(props)
        if type(value) is not str:
            return False  # NULL or not a String: false, even under NOT
        return test(value) != negated
    return string_match


_BUILDERS = {Prop: _prop, Negate: _negate, Not: _not, BoolCast: _bool_cast, Logic: _logic,
             Equal: _equal, Compare: _compare, InList: _in_list, StringMatch: _string_match}
