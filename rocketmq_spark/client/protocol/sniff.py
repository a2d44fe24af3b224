"""Naming the protocol of a peer that does not speak remoting, from the first bytes it sent.

A wrong port or a TLS mismatch otherwise surfaces as a frame length of a gigabyte ("HTTP" read
as a length is 1,213,486,160). No remoting frame can start with these bytes: both read as
lengths far above the 16 MiB frame limit, so the check runs only once a frame was refused.
"""
from __future__ import annotations

from typing import Optional

# TLS record content types: change_cipher_spec, alert, handshake, application_data.
_TLS_RECORD_TYPES = frozenset({0x14, 0x15, 0x16, 0x17})


def foreign_protocol(head: bytes) -> Optional[str]:
    """``"HTTP"`` or ``"TLS"`` when ``head`` (a peer's first bytes) starts an HTTP response or a
    TLS record, else None."""
    head = bytes(head[:5])
    if head.startswith(b"HTTP"):
        return "HTTP"
    if len(head) >= 3 and head[0] in _TLS_RECORD_TYPES and head[1] == 3 and head[2] <= 4:
        return "TLS"
    return None


def foreign_protocol_message(address: str, protocol: str, tls: bool) -> str:
    """What to tell the user about a peer that answered in ``protocol``."""
    if protocol == "HTTP":
        return (f"the server at {address} answered in HTTP, not RocketMQ's remoting protocol: "
                "is it a name server or broker port (9876, 10911)?")
    if tls:  # TLS records inside a TLS session: a proxy or a double wrap
        return (f"the server at {address} answered with TLS records inside the TLS session, "
                "not RocketMQ's remoting protocol")
    return (f"the server at {address} answered in TLS on a plaintext connection: it requires "
            "TLS (set tls=true)")
