"""Java's values and conversions as the SQL92 filter's ComparisonExpression uses them.

Property values are Java Strings; literals are Integer (a decimal in int range), Long (a larger
one, or one written with ``L``), Double (a float) or Boolean. Comparing a String with a number
converts the String with ``Integer.valueOf``, ``Long.valueOf`` or ``Double.valueOf`` -- whose rules
differ from Python's ``int()``/``float()`` (no blanks or ``_`` in integers; ``Double.valueOf`` trims
control characters and blanks, takes ``NaN``, ``Infinity``, ``1.5f``, ``0x1p3``). A String that does
not convert is an evaluation error, which makes the whole expression not match.
"""
from __future__ import annotations

import math
import re
from typing import Any

INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1
LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1


class EvaluationError(ValueError):
    """What Java throws while evaluating: the broker then counts the message as not matching."""


class JInt(int):
    """java.lang.Integer."""

    __slots__ = ()


class JLong(int):
    """java.lang.Long."""

    __slots__ = ()


class JDouble(float):
    """java.lang.Double (compareTo orders -0.0 before 0.0 and NaN after everything)."""

    __slots__ = ()


NUMBER_TYPES = (JInt, JLong, JDouble)

_JAVA_INTEGER = re.compile(r"[+-]?\d+")  # \d: Character.digit takes any Unicode decimal digit
_JAVA_DECIMAL = re.compile(r"([+-]?)(NaN|Infinity|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)[fFdD]?",
                           re.ASCII)
_JAVA_HEX_FLOAT = re.compile(r"([+-]?)0[xX]((?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+))"
                             r"[pP]([+-]?[0-9]+)[fFdD]?")


def parse_java_integer(text: str, low: int, high: int) -> int:
    """``Integer.parseInt``/``Long.parseLong`` (by the range): an optional sign then decimal
    digits (any Unicode decimal digit, as Character.digit), no blanks, no ``_``."""
    if not (text.isascii() and text.isdigit()) and _JAVA_INTEGER.fullmatch(text) is None:
        raise EvaluationError(f"For input string: {text!r}")
    value = int(text)
    if not low <= value <= high:
        raise EvaluationError(f"For input string: {text!r} (out of range)")
    return value


def integer_value_of(text: str) -> JInt:
    """``Integer.valueOf``."""
    return JInt(parse_java_integer(text, INT_MIN, INT_MAX))


def long_value_of(text: str) -> JLong:
    """``Long.valueOf``."""
    return JLong(parse_java_integer(text, LONG_MIN, LONG_MAX))


def _java_trim(text: str) -> str:
    """``String.trim``: drops leading and trailing chars up to U+0020."""
    start, end = 0, len(text)
    while start < end and text[start] <= " ":
        start += 1
    while end > start and text[end - 1] <= " ":
        end -= 1
    return text[start:end]


def double_value_of(text: str) -> JDouble:
    """``Double.valueOf``: Java's floating-point syntax (decimal or hex), after ``trim``."""
    trimmed = _java_trim(text)
    match = _JAVA_DECIMAL.fullmatch(trimmed)
    if match is not None:
        sign, body = match.groups()
        if body == "NaN":
            if trimmed[-1] != "N":
                raise EvaluationError(f"For input string: {text!r}")
            return JDouble(math.nan)
        if body == "Infinity":
            if trimmed[-1] != "y":
                raise EvaluationError(f"For input string: {text!r}")
            return JDouble(-math.inf if sign == "-" else math.inf)
        return JDouble(float(sign + body))
    match = _JAVA_HEX_FLOAT.fullmatch(trimmed)
    if match is not None:
        sign, mantissa, exponent = match.groups()
        return JDouble(float.fromhex(f"{sign}0x{mantissa}p{exponent}"))
    raise EvaluationError(f"For input string: {text!r}")


def boolean_value_of(text: str) -> bool:
    """``Boolean.valueOf(String)``: true for "true" in any case, false for anything else."""
    return len(text) == 4 and text.isascii() and text.lower() == "true"


def double_compare(a: float, b: float) -> int:
    """``Double.compare``: NaN equals NaN and is above +Infinity; -0.0 is below 0.0."""
    if a < b:
        return -1
    if a > b:
        return 1
    a_nan, b_nan = a != a, b != b
    if a_nan or b_nan:
        return (a_nan and not b_nan) - (b_nan and not a_nan)
    if a == 0.0:  # and b == 0.0
        return (math.copysign(1.0, a) > 0) - (math.copysign(1.0, b) > 0)
    return 0


def java_equals(lv: Any, rv: Any) -> bool:
    """``lv.equals(rv)`` for two non-null values: same class and same value."""
    if type(lv) is not type(rv):
        return False
    if type(lv) is JDouble:
        return double_compare(lv, rv) == 0
    return lv == rv


def _compare_same(lv: Any, rv: Any) -> int:
    """``compareTo`` of two values of one class."""
    if type(lv) is JDouble:
        return double_compare(lv, rv)
    # Strings: only "equal or not" matters where this is reached, and that agrees with Java.
    return (lv > rv) - (lv < rv)


def java_compare(lv: Any, rv: Any) -> int:
    """ComparisonExpression.__compare with string conversion on (the only way the broker runs
    it): widen or convert one side to the other's class, else -1 for classes it cannot mix."""
    lc, rc = type(lv), type(rv)
    if lc is rc:
        return _compare_same(lv, rv)
    if lc is bool:
        if rc is str:
            # Java casts the Boolean itself to String here: a ClassCastException.
            raise EvaluationError("cannot compare a boolean with a string")
        return -1
    if lc is str:
        if rc is bool:
            return _compare_same(boolean_value_of(lv), rv)
        converter = _STRING_CONVERTERS.get(rc)
        if converter is None:
            return -1
        return _compare_same(converter(lv), rv)
    # lc is a number class
    if rc is str:
        return _compare_same(lv, _STRING_CONVERTERS[lc](rv))
    if rc is bool:
        return -1
    if lc is JDouble or rc is JDouble:
        return double_compare(float(lv), float(rv))
    return (lv > rv) - (lv < rv)  # Integer against Long: both widen to long


_STRING_CONVERTERS = {JInt: integer_value_of, JLong: long_value_of, JDouble: double_value_of}


def string_converter(number_type: type):
    """The ``valueOf`` a String compared with a literal of ``number_type`` goes through."""
    return _STRING_CONVERTERS[number_type]
