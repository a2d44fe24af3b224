"""Tokens of RocketMQ's SQL92 filter language, read as Apache's SelectorParser.jj (JavaCC)
reads them.

The lexer is lazy on purpose: JavaCC reads a token only when the parser asks for it, so text after
a complete expression is never read unless the parser peeks at it. A bad character there is an
error only when the genuine parser would have looked at it.

Token rules (SelectorParser.jj, 4.9.8 and 5.x alike): blanks are space, tab, CR, LF and form feed
only; ``--`` comments run to a line break (one is required: at the very end of the text ``--`` is
two minus signs); ``/* */`` comments; keywords in any case; identifiers
``[a-zA-Z_$][a-zA-Z0-9_$]*``; integers ``0`` or ``[1-9][0-9]*`` with an optional ``L`` (no hex, no
octal); floats with a ``.`` and/or an exponent; strings in single quotes with ``''`` for a quote.
The longest match wins, so ``007`` is three tokens and ``0L`` is ``0`` then the identifier ``L``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional

from .errors import FilterSyntaxError

# Token kinds.
EOF = "end of expression"
ID = "identifier"
INTEGER = "integer"
FLOAT = "float"
STRING = "string"
KEYWORDS_4_9 = ("NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS")
# Reserved from 5.1.3 on; a 4.9.8 broker reads these words as property names.
KEYWORDS_5_1_3 = ("CONTAINS", "STARTSWITH", "ENDSWITH")
OPERATORS = ("<>", "<=", ">=", "=", "<", ">", "(", ")", ",", "+", "-")

_BLANKS = " \t\n\r\f"
_FLOAT = re.compile(r"[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?"
                    r"|[0-9]+[eE][+-]?[0-9]+")
_INTEGER = re.compile(r"0|[1-9][0-9]*[lL]?")
_IDENT = re.compile(r"[a-zA-Z_$][a-zA-Z0-9_$]*")
_STRING = re.compile(r"'(?:''|[^'])*'")
_BLOCK_COMMENT = re.compile(r"/\*[^*]*\*+(?:[^*/][^*]*\*+)*/")


@dataclass(frozen=True)
class Token:
    """One token: ``kind`` is a keyword, an operator or one of the kinds above; ``pos`` 0-based."""

    kind: str
    text: str
    pos: int

    def describe(self) -> str:
        if self.kind == EOF:
            return "the end of the expression"
        return repr(self.text)


class Lexer:
    """Tokens on demand: ``peek(k)`` reads up to the k-th next token, ``take()`` consumes one."""

    def __init__(self, text: str, keywords: tuple):
        self._text = text
        self._keywords = frozenset(keywords)
        self._pos = 0
        self._ahead: List[Token] = []

    def peek(self, k: int = 0) -> Token:
        while len(self._ahead) <= k:
            self._ahead.append(self._read())
        return self._ahead[k]

    def take(self) -> Token:
        token = self.peek()
        self._ahead.pop(0)
        return token

    def _skip_blanks_and_comments(self) -> None:
        text, n = self._text, len(self._text)
        while self._pos < n:
            ch = text[self._pos]
            if ch in _BLANKS:
                self._pos += 1
            elif text.startswith("--", self._pos):
                end = _line_comment_end(text, self._pos)
                if end is None:
                    return  # no line break follows: two minus signs, as JavaCC reads them
                self._pos = end
            elif text.startswith("/*", self._pos):
                match = _BLOCK_COMMENT.match(text, self._pos)
                if match is None:
                    raise FilterSyntaxError("unterminated /* comment", text, self._pos + 1)
                self._pos = match.end()
            else:
                return

    def _read(self) -> Token:
        self._skip_blanks_and_comments()
        text, pos = self._text, self._pos
        if pos >= len(text):
            return Token(EOF, "", pos)
        ch = text[pos]
        token = self._read_literal_or_name(text, pos, ch)
        if token is None:
            token = _read_operator(text, pos)
        self._pos = pos + len(token.text)
        return token

    def _read_literal_or_name(self, text: str, pos: int, ch: str) -> Optional[Token]:
        if ch == "'":
            match = _STRING.match(text, pos)
            if match is None:
                raise FilterSyntaxError("unterminated string literal (a quote inside a string "
                                        "is written '')", text, pos + 1)
            return Token(STRING, match.group(), pos)
        if ch.isascii() and (ch.isdigit() or ch == "."):
            floating = _FLOAT.match(text, pos)
            integer = _INTEGER.match(text, pos)
            f_len = len(floating.group()) if floating else 0
            i_len = len(integer.group()) if integer else 0
            if f_len == 0 and i_len == 0:
                return None  # a lone '.': _read_operator explains it
            if f_len > i_len:
                return Token(FLOAT, floating.group(), pos)
            return Token(INTEGER, integer.group(), pos)
        match = _IDENT.match(text, pos)
        if match is not None:
            word = match.group()
            upper = word.upper()
            if upper in self._keywords:
                return Token(upper, word, pos)
            return Token(ID, word, pos)
        return None


def _read_operator(text: str, pos: int) -> Token:
    for op in OPERATORS:
        if text.startswith(op, pos):
            return Token(op, op, pos)
    ch = text[pos]
    hint = ""
    if ch == "!":
        hint = " (not-equal is written <>)"
    elif ch == '"':
        hint = " (strings are written in single quotes)"
    elif ch == ".":
        hint = " (property names cannot contain '.', and a number needs a digit after it)"
    raise FilterSyntaxError(f"unexpected character {ch!r}{hint}", text, pos + 1)


def _line_comment_end(text: str, pos: int) -> Optional[int]:
    """Where a ``--`` comment starting at ``pos`` ends (after its line break), or None."""
    cr = text.find("\r", pos)
    lf = text.find("\n", pos)
    ends = [i for i in (cr, lf) if i >= 0]
    if not ends:
        return None
    end = min(ends)
    if text[end] == "\r" and text.startswith("\n", end + 1):
        return end + 2
    return end + 1
