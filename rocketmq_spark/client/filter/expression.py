"""The public face of a parsed SQL92 filter expression: its properties, the broker version it
needs, and the match a broker would make for a message's properties."""
from __future__ import annotations

from typing import Any, Mapping, Optional, Tuple

from .compiler import compile_node
from .javavalues import EvaluationError
from .nodes import Prop, StringMatch, walk

SQL92_SINCE = "4.1.0"        # first Apache release with SQL92 property filters
STRING_MATCH_SINCE = "5.1.3"  # CONTAINS, STARTSWITH, ENDSWITH (and their NOT forms)


class Expression:
    """A parsed SQL92 filter. ``evaluate`` is what the broker decides for one message;
    ``evaluate_three_valued`` is the raw Java result (True, False, or None for unknown)."""

    def __init__(self, text: str, root: Any, ignored_tail: Optional[str] = None):
        self.text = text
        self.root = root
        # Text after the first complete expression: Apache's parser stops there without
        # reading it (only with parse_sql92(..., allow_trailing_text=True)).
        self.ignored_tail = ignored_tail
        self._evaluator = compile_node(root)

    def __repr__(self) -> str:
        return f"Expression({self.text!r})"

    def identifiers(self) -> Tuple[str, ...]:
        """The property names the expression reads, in order of first use."""
        names = dict.fromkeys(node.name for node in walk(self.root) if isinstance(node, Prop))
        return tuple(names)

    @property
    def uses_string_match_operators(self) -> bool:
        """Whether it uses CONTAINS/STARTSWITH/ENDSWITH, which brokers before 5.1.3 lack."""
        return any(isinstance(node, StringMatch) for node in walk(self.root))

    @property
    def minimum_broker_version(self) -> str:
        """The oldest Apache broker that understands the expression as written."""
        return STRING_MATCH_SINCE if self.uses_string_match_operators else SQL92_SINCE

    def evaluate_three_valued(self, properties: Mapping[str, str]) -> Optional[bool]:
        """Apache's ``evaluate``: True, False or None (unknown); raises EvaluationError where
        Java throws (a property that does not convert to the literal's number type)."""
        return self._evaluator(properties)

    def evaluate(self, properties: Mapping[str, str]) -> bool:
        """Whether a broker delivers a message with these properties: only a true result
        matches; unknown (NULL) and evaluation errors do not."""
        try:
            return self._evaluator(properties) is True
        except (EvaluationError, RecursionError):  # Java: an exception, or its stack overflow
            return False
