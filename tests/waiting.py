"""The tests' one way to wait for something: poll a predicate until it holds or time runs out.

Waits are for events (a row arrived, a broker answered, a process died), never fixed sleeps:
on a busy machine a fixed sleep is either too short or wasted, a poll is neither.
"""
from __future__ import annotations

import time
from typing import Callable, Optional, TypeVar

T = TypeVar("T")

FIRST_INTERVAL = 0.01  # seconds: quick events are seen at once ...
MAX_INTERVAL = 0.2  # ... and slow ones cost at most five polls a second


def wait_until(predicate: Callable[[], T], timeout: float, what: str,
               interval: Optional[float] = None) -> T:
    """Call ``predicate`` until it returns something true and return that.

    Polls start every 10 ms and slow down to every 200 ms; a fixed ``interval`` is for a state
    that lasts only a moment (a batch between its offset and commit logs). On timeout, fails
    with an AssertionError naming ``what`` was awaited and the last value the predicate gave.
    """
    deadline = time.monotonic() + timeout
    fixed = interval is not None
    interval = interval if fixed else FIRST_INTERVAL
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what} "
                                 f"(last value: {value!r})")
        time.sleep(interval)
        if not fixed:
            interval = min(interval * 2, MAX_INTERVAL)
