"""The error a malformed or refused SQL92 filter expression raises."""
from __future__ import annotations


class FilterSyntaxError(ValueError):
    """An SQL92 expression Apache's SelectorParser would refuse.

    ``position`` is the 1-based character offset in ``expression`` (the column, for a one-line
    expression); ``len(expression) + 1`` means "at the end". The message repeats the line and
    points at the position with a caret.
    """

    def __init__(self, reason: str, expression: str, position: int):
        self.reason = reason
        self.expression = expression
        self.position = position
        super().__init__(_render(reason, expression, position))


def _render(reason: str, expression: str, position: int) -> str:
    offset = max(0, min(position - 1, len(expression)))
    line_start = max(expression.rfind("\n", 0, offset), expression.rfind("\r", 0, offset)) + 1
    line_end = len(expression)
    for sep in ("\n", "\r"):
        found = expression.find(sep, offset)
        if found >= 0:
            line_end = min(line_end, found)
    line = expression[line_start:line_end]
    where = "at the end" if position > len(expression) else f"at position {position}"
    return (f"invalid SQL92 filter expression, {where}: {reason}\n"
            f"  {line}\n  {' ' * (offset - line_start)}^")
