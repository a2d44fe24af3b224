"""The SQL92 evaluator, one rule per test, each named after the Apache class (filter module,
org.apache.rocketmq.filter.expression) whose behaviour it pins down. A property map is what the
broker's MessageEvaluationContext holds: every value a String, a missing name is NULL."""
import pytest

from rocketmq_spark.client.filter import EvaluationError, parse_sql92


def matches(text, **props):
    return parse_sql92(text).evaluate(props)


def three_valued(text, **props):
    return parse_sql92(text).evaluate_three_valued(props)


def test_property_expression_missing_is_null_and_only_is_null_matches():
    assert three_valued("a = 'x'") is None
    assert not matches("a = 'x'") and not matches("a <> 'x'") and not matches("a > 1")
    assert matches("a IS NULL") and not matches("a IS NOT NULL")
    assert not matches("a IS NULL", a="") and matches("a IS NOT NULL", a="")


def test_comparison_expression_string_converts_to_an_integer_literal():
    # __compare: String against Integer goes through Integer.valueOf
    assert matches("a = 3", a="3") and matches("a = 3", a="+3") and matches("a = 3", a="003")
    assert matches("a = 3", a="\u0663")           # Character.digit takes Arabic-Indic digits
    for text in ("3.0", " 3", "3 ", "3L", "1_0", "", "x"):
        assert not matches("a = 3", a=text) and not matches("a <> 3", a=text)
    with pytest.raises(EvaluationError):
        three_valued("a = 3", a="3.0")


def test_constant_expression_int_and_long_literals_convert_differently():
    # createFromDecimal gives Integer in int range: a value beyond it does not convert
    assert not matches("a > 5", a="3000000000")
    assert matches("a > 2147483648", a="3000000000")     # a Long literal: Long.valueOf
    assert matches("a > 5L", a="7") and not matches("a > 5L", a="3000000000")  # 5L is Integer
    assert matches("a < 9223372036854775807", a="-9223372036854775808")


def test_comparison_expression_string_converts_to_a_double_literal_by_double_value_of():
    assert matches("a > 1.5", a="2") and matches("a > 1.5", a=" 2\t")    # trimmed
    assert matches("a > 1.5", a="1e1") and matches("a > 1.5", a="2.5f")
    assert matches("a > 1.5", a="0x1p4") and matches("a > 1.5", a="Infinity")
    assert matches("a > 1.5", a="NaN")                  # Double.compareTo puts NaN on top
    assert not matches("a > 1.5", a="nan") and not matches("a > 1.5", a="inf")
    assert not matches("a > 1.5", a="1_0") and not matches("a > 1.5", a="NaNd")


def test_comparison_expression_two_strings_under_less_than_compare_as_doubles():
    assert not matches("a < b", a="10", b="9")          # as text "10" < "9"; as numbers not
    assert matches("a < b", a="9", b="10") and matches("a <= b", a="1.0", b="1")
    assert matches("a < b", a="-0.0", b="0.0")           # Double.compare: -0.0 < 0.0
    assert not matches("a < b", a="x", b="1") and not matches("a > b", a="x", b="y")
    assert matches("a = b", a="x", b="x") and not matches("a = b", a="1.0", b="1")


def test_comparison_expression_equality_null_rules_are_asymmetric():
    # doCreateEqual: NULL = NULL is true; NULL on the left unknown; NULL on the right false
    assert matches("a = b")                              # both missing
    assert not matches("a <> b")
    assert three_valued("a = 'x'") is None and three_valued("'x' = a") is False
    assert matches("'x' <> a") and not matches("a <> 'x'")


def test_comparison_expression_boolean_literal_uses_boolean_value_of():
    assert matches("f = TRUE", f="true") and matches("f = TRUE", f="TrUe")
    assert not matches("f = TRUE", f="1") and not matches("f = TRUE", f="yes")
    assert matches("f = FALSE", f="no") and matches("f = FALSE", f="false")
    assert not matches("f = FALSE")                       # missing: unknown


def test_unary_expression_boolean_cast_of_a_property_never_matches():
    assert not matches("f", f="true") and not matches("f")
    assert matches("NOT f", f="true") and not matches("NOT f")
    # NOT binds tighter than '=': (NOT a) = 'x' compares a boolean with a string
    assert not matches("NOT a = 'x'", a="y") and matches("NOT (a = 'x')", a="y")


def test_unary_in_expression_missing_is_null_so_not_in_does_not_match_it():
    assert matches("a IN ('x', 'y')", a="y") and not matches("a IN ('x', 'y')", a="z")
    assert matches("a NOT IN ('x')", a="z") and not matches("a NOT IN ('x')")
    assert matches("a IN ('1')", a="1") and not matches("a IN ('1')", a="01")  # no conversion


def test_contains_expressions_answer_false_for_null_even_negated():
    # ContainsExpression and friends (5.1.3): NULL gives false, not unknown
    assert matches("a CONTAINS 'b'", a="abc") and not matches("a CONTAINS 'b'")
    assert not matches("a NOT CONTAINS 'b'") and matches("NOT (a CONTAINS 'b')")
    assert matches("a STARTSWITH 'ab'", a="abc") and matches("a NOT STARTSWITH 'b'", a="abc")
    assert matches("a ENDSWITH 'bc'", a="abc") and not matches("a NOT ENDSWITH 'c'", a="abc")
    assert not matches("a CONTAINS ''", a="abc") and not matches("a NOT CONTAINS ''", a="abc")


def test_logic_expression_three_valued_and_or_not():
    cases = {("a = '1' AND b = '1'", "1", None): None, ("a = '1' AND b = '1'", "0", None): False,
             ("a = '1' OR b = '1'", "1", None): True, ("a = '1' OR b = '1'", "0", None): None,
             ("NOT (a = '1' AND b = '1')", "1", None): None}
    for (text, a, b), expected in cases.items():
        props = {"a": a} if b is None else {"a": a, "b": b}
        assert parse_sql92(text).evaluate_three_valued(props) is expected, text


def test_expression_message_filter_an_error_anywhere_is_no_match_but_short_circuit_avoids_it():
    # ExpressionMessageFilter catches the exception and answers false for the whole message
    assert not matches("b = 'x' OR a > 5", b="y", a="zz")
    assert matches("b = 'x' OR a > 5", b="x", a="zz")     # OR stops at the true left side
    assert not matches("a > 5 OR b = 'x'", b="x", a="zz")
    assert not matches("NOT (a > 5)", a="zz")
    assert not matches("a > 5 AND b = 'x'", a="1", b="x")
    assert matches("NOT (b = 'y' AND a > 5)", b="x", a="zz")  # AND stops at a false left side


def test_comparison_expression_between_is_both_bounds_inclusive():
    assert [i for i in range(15) if matches("a BETWEEN 3 AND 12", a=str(i))] == list(range(3, 13))
    assert [i for i in range(6) if matches("a NOT BETWEEN 2 AND 3", a=str(i))] == [0, 1, 4, 5]
    assert not matches("a NOT BETWEEN 2 AND 3")


def test_unary_expression_negate_of_a_property_is_null():
    assert matches("a > -5", a="-4") and not matches("a > -5", a="-6")
    assert three_valued("-a = 5", a="-5") is None
    assert matches("a = -2147483648", a="-2147483648")    # a negated Long literal


def test_system_properties_tags_and_keys_are_ordinary_properties():
    props = {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "AC11"}
    assert parse_sql92("TAGS = 'TagA' AND KEYS IS NOT NULL").evaluate(props)
    assert not parse_sql92("tags = 'TagA'").evaluate(props)   # property names are case-sensitive


@pytest.mark.parametrize("text,props,expected", [
    # cases after Apache's filter ExpressionTest, with every value a String as on the broker
    ("a=3 and b<>4 And c>5 AND d<=4", dict(a="3", b="5", c="6", d="1"), True),
    ("a=3 and b<>4 And c>5 AND d<=4", dict(a="4", b="5", c="6", d="1"), False),
    ("a=3 or b<>4 Or c>5 OR d<=4", dict(a="4", b="4", c="3", d="2"), True),
    ("a=3 or b<>4 Or c>5 OR d<=4", dict(a="4", b="4", c="3", d="10"), False),
    ("a in ('3', '4', '5')", dict(a="4"), True),
    ("a not in ('3', '4', '5')", dict(a="8"), True),
    ("a between 2 and 10", dict(a="10"), True),
    ("a not between 2 and 10", dict(a="11"), True),
    ("a is null", dict(abc="2"), True),
    ("a is not null and a='hello'", {}, False),
    ("a=TRUE OR b=FALSE", dict(a="false", b="true"), False),
    ("a is null OR a='hello'", dict(a="abc"), False),
    ("TAGS is not null and TAGS='''''tag'''''", dict(TAGS="''tag''"), True),
    ("a > 3.1E10", dict(a="3.1415E10"), True),
    ("a > b", dict(a="20", b="10"), True),
    ("a between up and low", dict(a="3.14"), False),
    ("key is not null and key between 0 and 100", dict(key="con"), False),
    ("a<>b", dict(a="3.14", b="3.141"), True),
])
def test_cases_after_apaches_expression_test(text, props, expected):
    assert parse_sql92(text).evaluate(props) is expected
