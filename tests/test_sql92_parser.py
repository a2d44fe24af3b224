"""The SQL92 filter parser against the rules of Apache's SelectorParser.jj and the checks its
expression classes make while parsing (ComparisonExpression, ConstantExpression).

Cases are derived from Apache's filter/src/test ParserTest and ExpressionTest, rewritten."""
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketmq_spark.client.filter import FilterSyntaxError, parse_sql92
from rocketmq_spark.client.filter.nodes import BoolCast, Compare, Equal, Logic, Not, walk


@pytest.mark.parametrize("text", [
    "a=3 and b<>4 And c>5 AND d<=4",
    "a=3 or b<>4 Or c>5 OR d<=4",
    "a in ('3', '4', '5')",
    "(a not in ('6', '4', '5')) or (b in ('3', '4', '5'))",
    "(a between 2 and 10) AND (b not between 6 and 9)",
    "a is null", "a IS NOT NULL",
    "a <= now",                      # NOW is no keyword: a property
    "TAGS = 'TagA' AND KEYS IS NOT NULL",
    "$x = 'y' OR _y = 1 OR a1 > -2",
    "a > 10L AND b < 2147483648 AND c >= 1.5E3 AND d <= .5 AND e > 5.",
    "name = 'it''s'",
    "a = 1 /* block\n comment */ AND -- line comment\n b = 2",
    "TRUE", "FALSE", "NULL", "flag", "NOT flag",
    "a BETWEEN -10 AND -20",          # negated literals are not checked for order
    "a NOT BETWEEN 5 AND 1",          # NOT BETWEEN has no order check at all
    "'x' = TRUE",
    "+a > +1",
])
def test_accepted(text):
    assert parse_sql92(text).text == text


def test_keywords_in_any_case_give_the_same_tree():
    upper = parse_sql92("A = 3 AND B IS NOT NULL OR C IN ('x') AND D NOT BETWEEN 1 AND 2")
    lower = parse_sql92("A = 3 and B is not null or C in ('x') and D not between 1 and 2")
    assert _strip_positions(upper.root) == _strip_positions(lower.root)


def test_precedence_and_before_or_and_not_before_equals():
    root = parse_sql92("a = 1 OR b = 2 AND c = 3").root
    assert isinstance(root, Logic) and root.op == "OR"
    assert isinstance(root.right, Logic) and root.right.op == "AND"
    # NOT binds tighter than '=': (NOT a) = 'x', the pitfall docs/filters.md warns about
    root = parse_sql92("NOT a = 'x'").root
    assert isinstance(root, Equal) and isinstance(root.left, Not)
    assert isinstance(root.left.operand, BoolCast)


def test_literal_types_follow_constant_expression():
    # ConstantExpression.createFromDecimal: Integer when in int range (even with L), else Long
    values = [c.right.value for c in _comparisons("a > 5L AND b > 2147483647 AND c > 2147483648")]
    assert [type(v).__name__ for v in values] == ["JInt", "JInt", "JLong"]
    assert [type(c.right.value).__name__ for c in _comparisons("a > 1e2")] == ["JDouble"]


def test_identifiers_and_versions():
    expr = parse_sql92("b = 'x' AND a > 1 OR b IS NULL AND TAGS IN ('t')")
    assert expr.identifiers() == ("b", "a", "TAGS")
    assert expr.minimum_broker_version == "4.1.0"
    assert not expr.uses_string_match_operators
    for text in ("a CONTAINS 'x'", "a NOT STARTSWITH 'x'", "a ENDSWITH 'y' OR b = 1"):
        assert parse_sql92(text).minimum_broker_version == "5.1.3"


def test_string_operators_are_plain_names_for_a_4_9_8_broker():
    # 4.9.8's grammar has no CONTAINS: the word is a property name, and the parser stops there
    expr = parse_sql92("a CONTAINS 'x'", string_operators=False, allow_trailing_text=True)
    assert isinstance(expr.root, BoolCast) and expr.ignored_tail == "CONTAINS 'x'"
    assert parse_sql92("contains = 'x'", string_operators=False).identifiers() == ("contains",)
    with pytest.raises(FilterSyntaxError):
        parse_sql92("contains = 'x'")


def test_trailing_text_refused_by_default_ignored_like_apache_on_request():
    with pytest.raises(FilterSyntaxError) as info:
        parse_sql92("a = 1 b = 2")
    assert info.value.position == 7
    expr = parse_sql92("a = 1 b = 2", allow_trailing_text=True)
    assert expr.ignored_tail == "b = 2" and expr.identifiers() == ("a",)
    # a '--' comment at the very end needs a line break: otherwise it is two minus signs
    with pytest.raises(FilterSyntaxError, match="line break"):
        parse_sql92("a = 1 -- note")
    assert parse_sql92("a = 1 -- note\n").ignored_tail is None


@pytest.mark.parametrize("text,position,fragment", [
    ("a and between 2 and 10", 7, "expected a property"),           # ParserTest invalid
    (" a between 10 and 0", 4, "lower bound"),                       # ParserTest illegalBetween
    ("a > 100000000000000000000000", 5, "out of range"),             # ParserTest decimal overflow
    ("a > 1" + "1" * 400 + ".5", 5, "greater than the largest"),     # ParserTest float overflow
    ("a > " + "9" * 5000, 5, "out of range"),
    ("a = NULL", 5, "IS NULL"),
    ("NULL <> a", 1, "IS NULL"),
    ("a BETWEEN NULL AND 3", 3, "cannot be NULL"),
    ("a BETWEEN 1 AND 'z'", 3, "cannot be compared"),
    ("a > 'x'", 5, "only numbers"),
    ("a <= TRUE", 6, "only numbers"),
    ("(a > 1) > 2", 4, "cannot be compared"),
    ("TRUE = 1", 6, "cannot be compared"),
    ("3", 1, "not a condition"),
    ("a AND 3", 7, "not a condition"),
    ("NOT 'x'", 5, "not a condition"),
    ("1 IN ('a')", 3, "needs a property"),
    ("a IN ()", 7, "string literal"),
    ("a IN (1)", 7, "string literal"),
    ("a IN ('x' 'y')", 11, "',' or ')'"),
    ("a = 1 NOT x", 11, "after NOT"),
    ("a IS 3", 6, "after IS"),
    ("a IS NOT 3", 10, "NULL"),
    ("0.0 = a", 1, "Double.MIN_VALUE"),
    ("1e-400 < a", 1, "Double.MIN_VALUE"),
    ("007 = a", 1, "not a condition"),
    ("a = 'abc", 5, "unterminated string"),
    ("a # 1", 3, "unexpected character"),
    ("a = 1 /* open", 7, "unterminated /*"),
    ("a.b = 1", 2, "'.'"),
    ("a != 1", 3, "<>"),
    ('a = "x"', 5, "single quotes"),
    ("(a = 1", 7, "')'"),
    ("a CONTAINS 1", 12, "string literal"),
    ("", 1, "expected a property"),
])
def test_refused_with_position(text, position, fragment):
    with pytest.raises(FilterSyntaxError) as info:
        parse_sql92(text)
    error = info.value
    assert isinstance(error, ValueError)
    assert (error.position, error.expression) == (position, text)
    assert fragment in str(error)


def test_message_points_at_the_position_with_a_caret():
    with pytest.raises(FilterSyntaxError) as info:
        parse_sql92("a = 1 AND\nb >> 2")
    lines = str(info.value).splitlines()
    assert lines[0].startswith("invalid SQL92 filter expression, at position 14")
    assert lines[1] == "  b >> 2" and lines[2] == "     ^"


def test_capture_expressions_refused_locally():
    # The expressions the 4.9.8 capture sent; the broker lets all messages through for them
    # (tests/test_embedded_sql92.py), but they do not parse.
    for text in ("a >>> 3 AND", "a IN"):
        with pytest.raises(FilterSyntaxError):
            parse_sql92(text, allow_trailing_text=True, string_operators=False)


def _comparisons(text):
    return [n for n in _nodes(parse_sql92(text).root) if isinstance(n, Compare)]


def _nodes(node):
    return list(walk(node))


def _strip_positions(node):
    """The tree as nested tuples, without positions (which differ with the spelling)."""
    if not dataclasses.is_dataclass(node):
        return node
    return (type(node).__name__,) + tuple(
        _strip_positions(getattr(node, f.name))
        for f in dataclasses.fields(node) if f.name != "pos")


_PIECES = ["a", "b", "TAGS", " ", "(", ")", "'x'", "''", "'", "1", "0", "2147483648", "1.5",
           ".", "e3", "L", "=", "<>", "<", ">=", "AND", "OR", "NOT", "IN", "BETWEEN", "IS",
           "NULL", "TRUE", "CONTAINS", ",", "-", "+", "--", "\n", "/*", "*/", "#", "é"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=14).map(" ".join),
       st.booleans(), st.booleans())
def test_any_text_parses_or_raises_filter_syntax_error(text, trailing, string_operators):
    try:
        expr = parse_sql92(text, allow_trailing_text=trailing, string_operators=string_operators)
    except FilterSyntaxError as error:
        assert 1 <= error.position <= len(text) + 1
        return
    for props in ({}, {"a": "1", "b": "x", "TAGS": "1.5"}):
        assert expr.evaluate(props) in (True, False)


def test_long_generated_chains_and_deep_nesting():
    chain = " OR ".join(["a = '2'"] * 3000) + " OR a = '1'"
    assert parse_sql92(chain).evaluate({"a": "1"})
    with pytest.raises(FilterSyntaxError, match="nested too deeply"):
        parse_sql92("(" * 400 + "a = 1" + ")" * 400)
