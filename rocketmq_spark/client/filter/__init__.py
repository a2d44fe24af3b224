"""RocketMQ's SQL92 message filter language (Apache's SelectorParser and expression classes).

``parse_sql92(text)`` checks an expression as the broker's parser does and returns an
``Expression`` that evaluates a message's properties as the broker would. No Spark here: the
source validates user expressions with it and the embedded broker filters pulls with it.
"""
from __future__ import annotations

from .errors import FilterSyntaxError
from .expression import SQL92_SINCE, STRING_MATCH_SINCE, Expression
from .javavalues import EvaluationError
from .parser import Parser


def parse_sql92(text: str, *, allow_trailing_text: bool = False,
                string_operators: bool = True) -> Expression:
    """Parse an SQL92 filter expression or raise FilterSyntaxError (a ValueError).

    ``allow_trailing_text``: Apache's parser stops after the first complete expression and
    ignores what follows (``a = 1 b`` is ``a = 1``); by default that is refused here, as it is
    almost always a mistake; the embedded broker passes True to behave as the genuine one.
    ``string_operators``: CONTAINS, STARTSWITH, ENDSWITH are keywords (5.1.3 and later); with
    False they are ordinary property names, as on a 4.9.8 broker.
    """
    if not isinstance(text, str):
        raise TypeError(f"an SQL92 expression must be a str, not {type(text).__name__}")
    parser = Parser(text, string_operators)
    try:
        root, following = parser.parse()
        tail = None
        if following is not None:
            if not allow_trailing_text:
                hint = ""
                if text.startswith("--", following.pos):
                    hint = " (a -- comment needs a line break after it)"
                raise parser.error(f"unexpected {following.describe()} after a complete "
                                   f"expression{hint}", following.pos)
            tail = text[following.pos:]
        return Expression(text, root, tail)
    except RecursionError:
        raise FilterSyntaxError("parentheses, NOT or minus signs nested too deeply", text,
                                1) from None


__all__ = ["parse_sql92", "Expression", "FilterSyntaxError", "EvaluationError", "SQL92_SINCE",
           "STRING_MATCH_SINCE"]
