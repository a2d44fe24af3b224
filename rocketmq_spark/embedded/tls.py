"""TLS for the embedded servers: modes, server contexts and a throwaway test certificate.

A genuine broker's default ``tls.server.mode`` is ``permissive`` (plain and TLS on one port, told
apart by the first byte: 0x16 starts a TLS ClientHello) with a self-signed test certificate;
``enforcing`` accepts TLS only. The certificate is made with ``trustme`` (the ``embedded`` extra:
``pip install rocketmq-spark[embedded]``), imported only when a certificate is asked for, so a
server without TLS does not need it.
"""
from __future__ import annotations

import datetime
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

MODES = ("enforcing", "permissive")
TLS_HANDSHAKE_FIRST_BYTE = 0x16


def self_signed_cert(directory: Optional[str] = None, common_name: str = "localhost",
                     days: int = 3650) -> Tuple[str, str]:
    """Create a test certificate and key (PEM) for 127.0.0.1/localhost, valid ``days`` days.

    Returns (cert path, key path). The cert file holds the server's certificate followed by the
    throwaway CA that signed it, so the same file serves as the server's chain and as the CA
    file a client trusts. Raises RuntimeError when ``trustme`` is not installed."""
    try:
        import trustme
    except ImportError:
        raise RuntimeError("a test certificate needs the trustme package: pip install "
                           "rocketmq-spark[embedded] (or pass tls_cert/tls_key)") from None
    authority = trustme.CA(key_type=trustme.KeyType.RSA)
    leaf = authority.issue_cert(
        "localhost", "127.0.0.1", common_name=common_name, key_type=trustme.KeyType.RSA,
        not_after=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=days))
    out = Path(directory or tempfile.mkdtemp(prefix="rmq-embedded-tls-"))
    out.mkdir(parents=True, exist_ok=True)
    cert, key = out / "server.crt", out / "server.key"
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems)
                     + authority.cert_pem.bytes())
    key.write_bytes(leaf.private_key_pem.bytes())
    key.chmod(0o600)
    return str(cert), str(key)


@dataclass(frozen=True)
class TlsSettings:
    """How a server listens: ``mode`` is "enforcing" or "permissive"."""

    mode: str
    certfile: str
    keyfile: str

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"tls mode must be one of {MODES}, got {self.mode!r}")

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.certfile, self.keyfile)
        return ctx


def client_context(cafile: Optional[str] = None) -> ssl.SSLContext:
    """A client context for tests: trusts ``cafile`` if given, else (test mode) anything."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if cafile:
        ctx.load_verify_locations(cafile)
    else:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx
