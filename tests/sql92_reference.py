"""A second, independent SQL92 filter evaluator, for the hypothesis tests to hold the real one to.

It shares no code with rocketmq_spark.client.filter and works the other way round: one regex
tokenizes the whole text; a precedence-climbing parser computes each value *while parsing*
(eagerly, no tree, no closures); a Java exception is a value (ERR) that the combining rules pass
on in Java's evaluation order instead of a raised exception; Java values are (class name, value)
pairs; Double.compareTo is done on the IEEE bit patterns; the String to number conversions are
hand-written scanners. It only needs to handle well-formed expressions (the tests generate
those); the rules come from Apache's ComparisonExpression, LogicExpression, UnaryExpression.
"""
import re
import struct
import unicodedata

ERR = "<java exception>"
_TOKEN = re.compile(r"\s*(?:(?P<num>\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?"
                    r"|\d+[eE][+-]?\d+|\d+[lL]?)|(?P<str>'(?:[^']|'')*')|(?P<word>[A-Za-z_$][\w$]*)"
                    r"|(?P<op><>|<=|>=|[=<>(),+-]))", re.ASCII)
_KEYWORDS = {"AND", "OR", "NOT", "BETWEEN", "IN", "IS", "NULL", "TRUE", "FALSE", "CONTAINS",
             "STARTSWITH", "ENDSWITH"}
_RANK = {"Integer": 0, "Long": 1, "Double": 2}


def _java_integer(text, bits):
    digits, sign = text, 1
    if digits[:1] in ("+", "-"):
        sign, digits = (-1 if digits[0] == "-" else 1), digits[1:]
    if not digits:
        return ERR
    total = 0
    for ch in digits:
        d = unicodedata.decimal(ch, None)
        if d is None:
            return ERR
        total = total * 10 + d
    total *= sign
    return total if -(2 ** (bits - 1)) <= total < 2 ** (bits - 1) else ERR


def _java_double(text):
    s = text
    while s and ord(s[0]) <= 32:
        s = s[1:]
    while s and ord(s[-1]) <= 32:
        s = s[:-1]
    body = s[1:] if s[:1] in ("+", "-") else s
    negative = s[:1] == "-"
    if body in ("NaN", "Infinity"):
        return float("nan") if body == "NaN" else (float("-inf") if negative else float("inf"))
    if body.lower().startswith("0x"):
        try:
            return float.fromhex(s.rstrip("fFdD"))
        except ValueError:
            return ERR
    if body[-1:] in ("f", "F", "d", "D"):
        body = body[:-1]
    mantissa, _, exponent = body.replace("E", "e").partition("e")
    whole, _, fraction = mantissa.partition(".")
    ok = (whole + fraction) and all(c in "0123456789" for c in whole + fraction)
    if "e" in body:
        exp_digits = exponent[1:] if exponent[:1] in "+-" and exponent else exponent
        ok = ok and exp_digits and all(c in "0123456789" for c in exp_digits)
    if not ok or mantissa.count(".") > 1:
        return ERR
    return float(("-" if negative else "") + body)


def _double_key(x):
    if x != x:
        x = float("nan")
    bits = struct.unpack(">q", struct.pack(">d", x))[0]
    if x != x:
        bits = 0x7FF8000000000000
    return bits if bits >= 0 else bits ^ 0x7FFFFFFFFFFFFFFF


def _cmp(a, b):
    return (a > b) - (a < b)


def _compare(left, right):
    """ComparisonExpression.__compare with string conversion: an int, or ERR."""
    (lt, lv), (rt, rv) = left, right
    if lt != rt:
        if lt == "Boolean":
            return ERR if rt == "String" else -1
        if lt == "String":
            if rt == "Boolean":
                lt, lv = "Boolean", lv.upper() == "TRUE" and lv.isascii()
            elif rt in _RANK:
                lv = _convert(lv, rt)
                lt = rt
                if lv is ERR:
                    return ERR
            else:
                return -1
        elif rt == "String":
            rv, rt = _convert(rv, lt), lt
            if rv is ERR:
                return ERR
        elif rt == "Boolean":
            return -1
        else:
            wide = max(lt, rt, key=_RANK.get)
            lt = rt = wide
            if wide == "Double":
                lv, rv = float(lv), float(rv)
    if lt == "Double":
        return _cmp(_double_key(lv), _double_key(rv))
    return _cmp(lv, rv)


def _convert(text, java_class):
    if java_class == "Double":
        return _java_double(text)
    return _java_integer(text, 32 if java_class == "Integer" else 64)


def _equals(lv, rv):
    if lv[0] != rv[0]:
        return False
    if lv[0] == "Double":
        return _double_key(lv[1]) == _double_key(rv[1])
    return lv[1] == rv[1]


class _Reader:
    def __init__(self, text, props):
        self.tokens, pos = [], 0
        while text[pos:].strip():
            m = _TOKEN.match(text, pos)
            kind = m.lastgroup
            value = m.group(kind)
            if kind == "word" and value.upper() in _KEYWORDS:
                kind, value = value.upper(), value.upper()
            elif kind == "op":
                kind = value
            self.tokens.append((kind, value))
            pos = m.end()
        self.tokens.append(("end", None))
        self.i, self.props = 0, props

    def peek(self, k=0):
        return self.tokens[self.i + k]

    def take(self):
        self.i += 1
        return self.tokens[self.i - 1]


def _as_bool(item):
    value, kind = item
    if kind == "prop":
        return value if value in (None, ERR) else ("Boolean", False)
    return value


def evaluate(text, props):
    """('Boolean', True/False), None or ERR for a well-formed expression."""
    reader = _Reader(text, props)
    return _as_bool(_or(reader))


def _or(r):
    left = _and(r)
    while r.peek()[0] == "OR":
        r.take()
        lv, rv = _as_bool(left), _as_bool(_and(r))
        if lv is ERR or lv == ("Boolean", True):
            left = (lv, "bool")
        elif rv is ERR or rv == ("Boolean", True):
            left = (rv, "bool")
        else:
            left = (None if lv is None or rv is None else ("Boolean", False), "bool")
    return left


def _and(r):
    left = _equality(r)
    while r.peek()[0] == "AND":
        r.take()
        lv, rv = _as_bool(left), _as_bool(_equality(r))
        if lv is ERR or lv == ("Boolean", False):
            left = (lv, "bool")
        elif rv is ERR or rv == ("Boolean", False):
            left = (rv, "bool")
        else:
            left = (None if lv is None or rv is None else ("Boolean", True), "bool")
    return left


def _equal(lv, rv):
    if lv is ERR or rv is ERR:
        return ERR
    if lv is None or rv is None:
        return ("Boolean", True) if lv is rv else (None if lv is None else ("Boolean", False))
    if _equals(lv, rv):
        return ("Boolean", True)
    c = _compare(lv, rv)
    return ERR if c is ERR else ("Boolean", c == 0)


def _negate(value):
    if value is ERR or value is None:
        return value
    return ("Boolean", not value[1])


def _equality(r):
    left = _comparison(r)
    while r.peek()[0] in ("=", "<>", "IS"):
        op = r.take()[0]
        if op == "IS":
            negated = r.peek()[0] == "NOT"
            if negated:
                r.take()
            r.take()  # NULL
            result = _equal(left[0], None)
        else:
            result = _equal(left[0], _comparison(r)[0])
            negated = op == "<>"
        left = (_negate(result) if negated else result, "bool")
    return left


def _relational(op, lv, rv):
    if lv is ERR or lv is None:
        return lv
    if rv is ERR or rv is None:
        return rv
    if lv[0] == rv[0] == "String":
        a, b = _java_double(lv[1]), _java_double(rv[1])
        if a is ERR or b is ERR:
            return ERR
        c = _cmp(_double_key(a), _double_key(b))
    else:
        c = _compare(lv, rv)
        if c is ERR:
            return ERR
    return ("Boolean", {"<": c < 0, "<=": c <= 0, ">": c > 0, ">=": c >= 0}[op])


def _comparison(r):
    left = _unary(r)
    while True:
        kind = r.peek()[0]
        negated = kind == "NOT"
        if negated:
            r.take()
            kind = r.peek()[0]
        if kind in ("<", "<=", ">", ">="):
            r.take()
            left = (_relational(kind, left[0], _unary(r)[0]), "bool")
        elif kind == "BETWEEN":
            r.take()
            low = _unary(r)[0]
            r.take()  # AND
            high = _unary(r)[0]
            if negated:
                below, above = _relational("<", left[0], low), _relational(">", left[0], high)
                left = _or_values(below, above)
            else:
                at_least = _relational(">=", left[0], low)
                at_most = _relational("<=", left[0], high)
                left = _and_values(at_least, at_most)
        elif kind == "IN":
            r.take()
            r.take()  # (
            items = [_unquote(r.take()[1])]
            while r.take()[0] == ",":
                items.append(_unquote(r.take()[1]))
            value = left[0]
            left = (None if value is None else ("Boolean", (value[1] in items) != negated), "bool")
        elif kind in ("CONTAINS", "STARTSWITH", "ENDSWITH"):
            r.take()
            search, value = _unquote(r.take()[1]), left[0]
            if not search:
                left = (("Boolean", False), "bool")
            elif value is ERR:
                left = (ERR, "bool")
            elif value is None or value[0] != "String":
                left = (("Boolean", False), "bool")
            else:
                text = value[1]
                hit = {"CONTAINS": search in text, "STARTSWITH": text[:len(search)] == search,
                       "ENDSWITH": text[len(text) - len(search):] == search}[kind]
                left = (("Boolean", hit != negated), "bool")
        else:
            return left


def _and_values(lv, rv):
    if lv is ERR or lv == ("Boolean", False):
        return (lv, "bool")
    if rv is ERR or rv == ("Boolean", False):
        return (rv, "bool")
    return (None if lv is None or rv is None else ("Boolean", True), "bool")


def _or_values(lv, rv):
    if lv is ERR or lv == ("Boolean", True):
        return (lv, "bool")
    if rv is ERR or rv == ("Boolean", True):
        return (rv, "bool")
    return (None if lv is None or rv is None else ("Boolean", False), "bool")


def _unquote(token):
    return token[1:-1].replace("''", "'")


def _unary(r):
    kind, text = r.take()
    if kind == "+":
        return _unary(r)
    if kind == "-":
        value = _unary(r)[0]
        if value in (ERR, None) or value[0] not in _RANK:
            return (value if value is ERR else None, "other")
        return ((value[0], -value[1]), "other")
    if kind == "NOT":
        return (_negate(_as_bool(_unary(r))), "bool")
    if kind == "(":
        inner = _or(r)
        r.take()  # )
        return inner
    if kind == "word":
        value = r.props.get(text)
        return (None if value is None else ("String", value), "prop")
    if kind == "str":
        return (("String", _unquote(text)), "other")
    if kind in ("TRUE", "FALSE"):
        return (("Boolean", kind == "TRUE"), "bool")
    if kind == "NULL":
        return (None, "bool")
    if "." in text or "e" in text.lower():
        return (("Double", float(text)), "other")
    number = int(text.rstrip("lL"))
    return (("Integer" if -2 ** 31 <= number < 2 ** 31 else "Long", number), "other")
