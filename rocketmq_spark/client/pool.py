"""Clients shared by everything in one Python process (a Spark worker serves many tasks).

Connections are expensive to open and cheap to keep; Spark reuses its Python workers, so a
module-level cache lets every task of a query (and of later micro-batches) share them.
"""
from __future__ import annotations

import threading
from typing import Callable, Dict, Hashable, TypeVar

T = TypeVar("T")

_shared: Dict[Hashable, object] = {}
_lock = threading.Lock()


def shared(key: Hashable, factory: Callable[[], T]) -> T:
    """The object cached under ``key``, made by ``factory`` on first use."""
    value = _shared.get(key)
    if value is None:
        with _lock:
            value = _shared.get(key)
            if value is None:
                value = factory()
                _shared[key] = value
    return value  # type: ignore[return-value]


def clear() -> None:
    """Close and forget every shared client (tests; a worker that is shutting down)."""
    with _lock:
        values = list(_shared.values())
        _shared.clear()
    for value in values:
        close = getattr(value, "close", None)
        if close is not None:
            close()
