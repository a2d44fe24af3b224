"""Client settings shared by every connection: credentials, TLS, timeouts, identity."""
from __future__ import annotations

import os
import socket
import ssl
import time
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Union

from .acl import Credentials
from .protocol.codes import CLIENT_VERSION
from .secret_repr import HidesSecrets, secret_field


def _default_client_id() -> str:
    try:
        ip = socket.gethostbyname(socket.gethostname())
    except OSError:
        ip = "127.0.0.1"
    return f"{ip}@{os.getpid()}#{time.monotonic_ns()}"


def make_tls_context(ca_file: Optional[str] = None, verify: bool = True,
                     check_hostname: bool = True) -> ssl.SSLContext:
    """A client TLS context. ``verify=False`` trusts any certificate, as RocketMQ's clients do
    in TLS test mode (brokers then use a self-signed certificate)."""
    context = ssl.create_default_context(cafile=ca_file)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context.check_hostname = check_hostname
    return context


@dataclass(frozen=True, repr=False)
class ClientConfig(HidesSecrets):
    """How to reach and identify to RocketMQ. Safe to log: the credentials never show."""

    credentials: Optional[Credentials] = secret_field()
    tls: Optional[ssl.SSLContext] = field(default=None, compare=False)
    connect_timeout: float = 3.0
    request_timeout: float = 5.0
    client_id: str = field(default_factory=_default_client_id)
    version: int = CLIENT_VERSION


def parse_name_servers(value: Union[str, Sequence[str]]) -> List[str]:
    """``"host:port;host:port"`` (commas also accepted) to a list; rejects malformed entries."""
    items = value if not isinstance(value, str) else value.replace(",", ";").split(";")
    out = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"name server address {item!r} is not host:port")
        out.append(item)
    if not out:
        raise ValueError("no name server address given")
    return out
