"""The ``endpoints`` string of a 5.x proxy: ``host:port`` or several ``;``-separated.

One place turns it into the gRPC channel target and the ``Endpoints`` message the proxy wants
in QueryRoute and the settings (the access point the client used). IP addresses become an
``ipv4:``/``ipv6:`` target listing every address (gRPC balances over them); a name becomes a
``dns:`` target, as the official clients do.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import List, Tuple

from . import definition_pb2 as definition


@dataclass(frozen=True)
class ProxyEndpoints:
    """Parsed endpoints: ``addresses`` as (host, port) pairs, all of one scheme."""

    addresses: Tuple[Tuple[str, int], ...]
    scheme: int  # definition_pb2.AddressScheme

    @property
    def target(self) -> str:
        """The gRPC channel target."""
        if self.scheme == definition.DOMAIN_NAME:
            host, port = self.addresses[0]
            return f"dns:{host}:{port}"
        prefix = "ipv4:" if self.scheme == definition.IPv4 else "ipv6:"
        return prefix + ",".join(_hostport(h, p) for h, p in self.addresses)

    @property
    def first(self) -> Tuple[str, int]:
        return self.addresses[0]

    def __str__(self) -> str:
        return ";".join(_hostport(h, p) for h, p in self.addresses)

    def to_proto(self) -> definition.Endpoints:
        return definition.Endpoints(
            scheme=self.scheme,
            addresses=[definition.Address(host=h, port=p) for h, p in self.addresses])


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _scheme_of(host: str) -> int:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return definition.DOMAIN_NAME
    return definition.IPv4 if ip.version == 4 else definition.IPv6


def parse_endpoints(text: str, option: str = "endpoints") -> ProxyEndpoints:
    """Parse ``host:port[;host:port...]`` (IPv6 hosts in brackets); errors name ``option``."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{option} must be 'host:port' (the proxy's gRPC endpoint, e.g. "
                         f"'127.0.0.1:8081'), got {text!r}")
    addresses: List[Tuple[str, int]] = []
    for item in text.split(";"):
        item = item.strip()
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        host = host.strip()
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{option}: {item!r} is not host:port")
        addresses.append((host, int(port)))
    if not addresses:
        raise ValueError(f"{option} lists no address: {text!r}")
    schemes = {_scheme_of(h) for h, _ in addresses}
    if len(schemes) > 1:
        raise ValueError(f"{option} mixes IPv4, IPv6 and host names: {text!r}")
    scheme = schemes.pop()
    if scheme == definition.DOMAIN_NAME and len(addresses) > 1:
        raise ValueError(f"{option}: give one host name (DNS balances over its addresses) or "
                         f"several IP addresses, not several names: {text!r}")
    return ProxyEndpoints(tuple(addresses), scheme)
