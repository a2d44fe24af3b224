"""One way for an object that holds secrets to show itself: a field marked secret shows only
whether it is set.

Settings, configs and options all hold the ACL credentials (and so the secret key and any
security token). Each declares that field with :func:`secret_field` and takes its ``repr``
and ``str`` from :class:`HidesSecrets`, so no log line, error or plan shows a key, and no
class has a hand-written ``repr`` that a new field could slip past.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Tuple

SECRET = "secret"
SET = "<set>"


def secret_field(default: Any = None) -> Any:
    """A dataclass field whose value is never shown (only whether it is set)."""
    return dataclasses.field(default=default, metadata={SECRET: True})


def shown(value: Any, secret: bool) -> str:
    """How a field's value reads in a ``repr``: a secret one as ``<set>`` or ``None``."""
    if secret:
        return SET if value is not None else "None"
    return repr(value)


def described(type_name: str, values: Iterable[Tuple[str, Any, bool]]) -> str:
    """``Type(name=value, ...)`` from ``(name, value, secret)``, secret values hidden."""
    parts = (f"{name}={shown(value, secret)}" for name, value, secret in values)
    return f"{type_name}({', '.join(parts)})"


def secret_safe_repr(obj: Any) -> str:
    """``Type(field=value, ...)`` over a dataclass's shown fields, secret ones hidden."""
    return described(type(obj).__name__,
                     ((f.name, getattr(obj, f.name), bool(f.metadata.get(SECRET)))
                      for f in dataclasses.fields(obj) if f.repr))


class HidesSecrets:
    """``repr`` and ``str`` by :func:`secret_safe_repr`. A dataclass using it says
    ``repr=False`` (else the dataclass writes a ``repr`` of its own over this one)."""

    def __repr__(self) -> str:
        return secret_safe_repr(self)

    __str__ = __repr__
