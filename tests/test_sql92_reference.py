"""Hypothesis holds the SQL92 evaluator to tests/sql92_reference.py, an independently written
evaluator (eager, error-as-value, its own tokenizer and conversions: see its docstring), over
generated well-formed expressions and property maps with awkward values."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sql92_reference as reference  # tests/ is on sys.path
from rocketmq_spark.client.filter import EvaluationError, parse_sql92

pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")

PROPS = ("a", "b", "c")
VALUES = ("1", "2", "-3", "10", "007", "1.5", "2.0", "1e1", " 4", "+5", "abc", "x", "", "true",
          "TRUE", "false", "NaN", "Infinity", "-0.0", "0.0", "3000000000", "2147483647",
          "2147483648", "9223372036854775808", "0x1p4", "2.5f", "\u0663", "it's", "1_0")
INTS = ("0", "1", "2", "3", "5", "10", "5L", "2147483647", "2147483648", "3000000000")
FLOATS = ("1.5", "0.5", "2.0", "1e1", ".5", "10.", "3E0")
STRINGS = ("'x'", "'abc'", "'1'", "'it''s'", "''", "'true'", "'10'", "'b'", "'a'")

prop = st.sampled_from(PROPS)
number = st.tuples(st.sampled_from(("", "-", "+")), st.sampled_from(INTS + FLOATS)).map("".join)
string = st.sampled_from(STRINGS)
relational = st.sampled_from(("<", "<=", ">", ">="))


def _leaf():
    bounds = st.tuples(st.integers(-5, 12), st.integers(-5, 12)).map(sorted)
    return st.one_of(
        st.builds("{} {} {}".format, prop, relational, number),
        st.builds("{} {} {}".format, number, relational, prop),
        st.builds("{} {} {}".format, prop, relational, prop),
        st.builds("{} {} {}".format, prop, st.sampled_from(("=", "<>")),
                  st.one_of(number, string, prop, st.sampled_from(("TRUE", "FALSE")))),
        st.builds("{} {} {}".format, st.one_of(number, string), st.sampled_from(("=", "<>")),
                  prop),
        st.builds(lambda p, neg, lh: f"{p} {neg}BETWEEN {lh[0]} AND {lh[1]}", prop,
                  st.sampled_from(("", "NOT ")), bounds),
        st.builds(lambda p, neg, items: f"{p} {neg}IN ({', '.join(items)})", prop,
                  st.sampled_from(("", "NOT ")), st.lists(string, min_size=1, max_size=3)),
        st.builds("{} IS {}NULL".format, prop, st.sampled_from(("", "NOT "))),
        st.builds("{} {}{} {}".format, prop, st.sampled_from(("", "NOT ")),
                  st.sampled_from(("CONTAINS", "STARTSWITH", "ENDSWITH")), string),
        prop, st.builds("NOT {}".format, prop), st.sampled_from(("TRUE", "FALSE", "NULL")),
    )


def _extend(inner):
    compared = inner.filter(lambda text: text.strip("()") != "NULL")  # NULL = ...: refused
    return st.one_of(
        st.builds("{} {} {}".format, inner, st.sampled_from(("AND", "OR", "and", "Or")), inner),
        st.builds("({})".format, inner),
        st.builds("NOT ({})".format, inner),
        st.builds("({}) {}".format, compared, st.sampled_from(("= TRUE", "<> FALSE", "IS NULL",
                                                            "IS NOT NULL"))),
        st.builds("({}) = {}".format, compared, prop),
    )


expressions = st.recursive(_leaf(), _extend, max_leaves=6)
property_maps = st.dictionaries(prop, st.sampled_from(VALUES))


def _ours(expr, props):
    try:
        value = expr.evaluate_three_valued(props)
    except EvaluationError:
        return reference.ERR
    return None if value is None else ("Boolean", value)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expressions, st.lists(property_maps, min_size=1, max_size=4))
def test_evaluator_agrees_with_the_independent_reference(text, maps):
    expr = parse_sql92(text)
    for props in maps:
        expected = reference.evaluate(text, props)
        assert _ours(expr, props) == expected, (text, props)
        assert expr.evaluate(props) == (expected == ("Boolean", True))
