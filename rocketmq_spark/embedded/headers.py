"""Reading request ext fields the way a 4.9.8 broker's header classes do.

A genuine broker decodes ext fields into typed header objects: a missing required field or a
number that does not parse makes the handler fail, and the client gets SYSTEM_ERROR with the
exception's text. :class:`HeaderError` carries that text; the transport turns it into the answer.
"""
from __future__ import annotations

from typing import Mapping, Optional


class HeaderError(Exception):
    """A header a genuine broker would reject: answered SYSTEM_ERROR with this text as remark."""


def _missing(key: str) -> HeaderError:
    return HeaderError("org.apache.rocketmq.remoting.exception.RemotingCommandException: "
                       f"the custom field <{key}> is null")


def _bad_number(text: str) -> HeaderError:
    return HeaderError(f'java.lang.NumberFormatException: For input string: "{text}"')


def req_str(fields: Mapping[str, str], key: str) -> str:
    value = fields.get(key)
    if value is None:
        raise _missing(key)
    return value


def opt_str(fields: Mapping[str, str], key: str, default: Optional[str] = None) -> Optional[str]:
    return fields.get(key, default)


def _parse_int(text: str, bits: int) -> int:
    """Java's parseInt/parseLong: optional sign, ASCII digits, within range."""
    digits = text[1:] if text[:1] in ("+", "-") else text
    if digits.isdigit() and digits.isascii():
        value = int(text)
        if -(1 << (bits - 1)) <= value < (1 << (bits - 1)):
            return value
    raise _bad_number(text)


def req_int(fields: Mapping[str, str], key: str) -> int:
    return _parse_int(req_str(fields, key), 32)


def req_long(fields: Mapping[str, str], key: str) -> int:
    return _parse_int(req_str(fields, key), 64)


def opt_int(fields: Mapping[str, str], key: str, default: Optional[int] = None) -> Optional[int]:
    value = fields.get(key)
    return default if value is None else _parse_int(value, 32)


def java_bool(value: Optional[str], default: bool = False) -> bool:
    """``Boolean.parseBoolean``: true only for "true" in any case; "1" is false."""
    if value is None:
        return default
    return value.lower() == "true"
