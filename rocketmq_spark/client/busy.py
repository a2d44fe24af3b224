"""A busy broker is back-pressure, not a failure: what a busy answer is, and the pace of the
waits after one. Senders (``send/``, ``txn/``, the gRPC producer) and readers (``read/``) all
act on it, each in its own way; this is what they share.

What is busy (:func:`is_busy`), from apache/rocketmq 4.9.8's broker and 5.x proxy:

* SYSTEM_BUSY (2), whatever the remark: ``[TIMEOUT_CLEAN_QUEUE]`` and ``[PCBUSY_CLEAN_QUEUE]``
  (``BrokerFastFailure``), ``[REJECTREQUEST]`` and ``[OVERLOAD]``
  (``NettyRemotingAbstract.processRequestCommand``);
* SYSTEM_ERROR (1) whose remark starts ``[PC_SYNCHRONIZED]`` (``SendMessageProcessor``: the
  page cache was busy, ``OS_PAGECACHE_BUSY``);
* FLOW_CONTROL (215);
* through a 5.x proxy: ``TOO_MANY_REQUESTS`` (42900, what the proxy answers for a busy broker)
  and gRPC ``RESOURCE_EXHAUSTED`` (except a message over gRPC's size limit, never transient).

Not busy: any other SYSTEM_ERROR (a broker fault: a retried attempt, ``retries``), timeouts and
lost connections (attempts too), and refusals (never retried).
"""
from __future__ import annotations

from .errors import ProxyError, ResponseError

SYSTEM_ERROR = 1
SYSTEM_BUSY = 2
FLOW_CONTROL = 215
PAGE_CACHE_BUSY_REMARK = "[PC_SYNCHRONIZED]"
PROXY_BUSY_NAMES = frozenset({"TOO_MANY_REQUESTS", "RESOURCE_EXHAUSTED"})

DEFAULT_BUSY_TIMEOUT = 60.0
# The broker's send queue drops requests older than 200 ms: start below that (at the time a
# request takes when answered, when that is shorter: about what the broker needs to work off
# what was in flight), and never wait much longer than a busy window lasts.
BACKOFF_FIRST = 0.02
BACKOFF_LEAST = 0.001
BACKOFF_MAX = 1.0
LOG_INTERVAL = 60.0


def is_busy(error: BaseException) -> bool:
    """Whether ``error`` is a broker (or proxy) saying it is too busy right now."""
    if isinstance(error, ProxyError):
        return error.transient and error.name in PROXY_BUSY_NAMES
    if not isinstance(error, ResponseError):
        return False
    if error.code in (SYSTEM_BUSY, FLOW_CONTROL):
        return True
    return error.code == SYSTEM_ERROR and error.remark.startswith(PAGE_CACHE_BUSY_REMARK)


def busy_remark(error: BaseException) -> str:
    """The broker's words for a busy answer (its remark, or the proxy's message)."""
    remark = getattr(error, "remark", "") or ""
    name = getattr(error, "name", "")
    return f"{name} {remark}".strip() if isinstance(error, ProxyError) else remark or str(error)
