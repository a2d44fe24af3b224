"""Channel credentials for a TLS proxy endpoint.

``verify=True`` checks the proxy's certificate against ``ca_file`` (or the system's roots) and
its name against the address, as any TLS client does. gRPC has no switch to skip the check, so
``verify=False`` fetches the certificate the proxy presents, trusts exactly that one for the
channel's life and takes the name in it: right for the self-signed certificate a proxy makes in
TLS test mode (the default), which RocketMQ's own clients accept without a check. A proxy whose
certificate is signed by a CA should be verified with ``ca_file`` instead.
"""
from __future__ import annotations

import socket
import ssl
from typing import List, Optional, Tuple

import grpc

from ..errors import ProxyError


def channel_credentials(host: str, port: int, verify: bool, ca_file: Optional[str],
                        timeout: float) -> Tuple[grpc.ChannelCredentials, List[tuple]]:
    """(credentials, extra channel options) for a TLS channel to ``host:port``."""
    if verify:
        root = None
        if ca_file:
            try:
                with open(ca_file, "rb") as f:
                    root = f.read()
            except OSError as exc:
                raise ValueError(f"tls_ca_file {ca_file!r} cannot be read: {exc.strerror}") \
                    from None
        return grpc.ssl_channel_credentials(root_certificates=root), []
    pem, names = _presented_certificate(host, port, timeout)
    options = []
    if host not in names and names:
        options.append(("grpc.ssl_target_name_override", names[0]))
    return grpc.ssl_channel_credentials(root_certificates=pem.encode("ascii")), options


def _presented_certificate(host: str, port: int, timeout: float) -> Tuple[str, List[str]]:
    """The PEM certificate ``host:port`` presents and the names it is issued for."""
    where = f"{host}:{port}"
    try:
        pem = ssl.get_server_certificate((host, port), timeout=timeout)
    except (OSError, ssl.SSLError) as exc:
        hint = (" (the endpoint does not speak TLS: for a plaintext proxy set tls=False, "
                "option tls=false)" if "WRONG_VERSION_NUMBER" in str(exc) else "")
        raise ProxyError(0, "UNAVAILABLE", f"cannot fetch the proxy's TLS certificate: "
                                           f"{exc}{hint}",
                         "TLS handshake", where, transient=not hint) from None
    # Read the names by trusting the certificate itself for one more handshake.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_flags |= getattr(ssl, "VERIFY_X509_PARTIAL_CHAIN", 0)
    context.load_verify_locations(cadata=pem)
    names: List[str] = []
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            with context.wrap_socket(raw) as tls:
                cert = tls.getpeercert() or {}
    except (OSError, ssl.SSLError):
        return pem, names  # not self-contained: verification will name the problem
    for kind, value in cert.get("subjectAltName", ()):
        if kind in ("DNS", "IP Address"):
            names.append(value)
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and value not in names:
                names.append(value)
    return pem, names
