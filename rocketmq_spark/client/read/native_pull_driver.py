"""Drive a native pull loop (``_native.Puller``, see :mod:`.native_pull`) on a connection.

The loop reads and writes the connection's socket itself while it holds the reading role:
FOUND answers stay in C, and only what the loop cannot handle comes back here, where it is
treated as :meth:`.Connection.wait` would treat it (peer requests answered, other responses
handed to their futures, a broken connection failing every request in flight).
"""
from __future__ import annotations

import errno
import os
import ssl
from typing import Any, Optional, Tuple

from ..connection import Connection
from ..errors import RequestTimeout
from ..protocol.frame import RemotingCommand
from ..transport import error_reason

# What the native pull loop's run() returns (native/client/rmq_pull.c).
PULL_BATCH, PULL_END, PULL_RESPONSE, PULL_FOREIGN, PULL_TIMEOUT, PULL_CLOSED, PULL_ERROR, \
    PULL_PROTOCOL = range(8)


def run_puller(conn: Connection, puller: Any, offset: int, timeout: float, max_msgs: int,
               max_bytes: int) -> Tuple[int, int, Optional[RemotingCommand]]:
    """Run ``puller`` on ``conn`` from ``offset``; returns ``(reason, offset, response)``.

    ``reason`` is PULL_BATCH (the output holds ``max_msgs`` or ``max_bytes``), PULL_END
    (the range's end) or PULL_RESPONSE (``response`` answers the pull at ``offset`` and
    needs the Python reader). A closed or broken connection, a bad frame and ``timeout``
    seconds without an answer raise as the connection's own calls do.
    """
    with conn.reading_role(timeout, "PULL_MESSAGE"):
        conn.add_response_taker(puller)
        while True:
            reason, offset, extra = _run_once(conn, puller, offset, timeout, max_msgs,
                                              max_bytes)
            if reason in (PULL_BATCH, PULL_END):
                return reason, offset, None
            if reason == PULL_RESPONSE:
                return reason, offset, conn.decode_frame(extra)
            if reason == PULL_FOREIGN:
                response = _pass_on(conn, puller, offset, extra)
                if response is not None:
                    return PULL_RESPONSE, offset, response
                continue
            if reason == PULL_TIMEOUT:
                raise RequestTimeout(conn.address, "PULL_MESSAGE", timeout)
            if reason == PULL_CLOSED:
                conn.fail(conn.lost_reason("closed by the peer", True))
            elif reason == PULL_ERROR:
                conn.fail(conn.lost_reason(f"connection lost: {os.strerror(extra)}",
                                           extra == errno.ECONNRESET))
            else:  # PULL_PROTOCOL: resume_stream should have raised
                conn.fail("protocol error in the native pull loop")
            raise conn.closed_error()


def _run_once(conn: Connection, puller: Any, offset: int, timeout: float, max_msgs: int,
              max_bytes: int) -> Tuple[int, int, Any]:
    """One call into the loop, the stream handed to it and taken back around it."""
    try:
        result = puller.run(offset, timeout, max_msgs, max_bytes, conn.take_buffered())
    except (OSError, ssl.SSLError) as exc:  # from the TLS transport
        conn.fail(f"connection lost: {error_reason(exc)}")
        raise conn.closed_error() from None
    except BaseException as exc:  # e.g. MemoryError: the stream's position is lost
        conn.fail(f"native pull loop failed: {exc!r}")
        raise
    rest, consumed = puller.rest()
    conn.resume_stream(consumed, rest)  # a partial frame; or a bad one, which raises here
    return result


def _pass_on(conn: Connection, puller: Any, offset: int, frames) -> Optional[RemotingCommand]:
    """Dispatch the frames the loop read that are not its own; returns the answer to the
    pull at ``offset`` if one of them is it (a response to one of the loop's requests that
    nobody here waits for)."""
    for frame in frames:
        cmd = conn.decode_frame(frame)
        if cmd.is_response and not conn.awaits(cmd.opaque):
            claimed = puller.claim(cmd.opaque)
            if claimed == offset:
                return cmd
            if claimed is not None:
                continue  # asked again when the loop gets there
        conn.dispatch([cmd])
    return None
