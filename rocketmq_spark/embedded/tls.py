"""TLS for the embedded servers: modes, server contexts and a throwaway self-signed certificate.

A genuine broker's default ``tls.server.mode`` is ``permissive`` (plain and TLS on one port, told
apart by the first byte: 0x16 starts a TLS ClientHello) with a self-signed test certificate;
``enforcing`` accepts TLS only. The certificate is made with the ``openssl`` command-line tool,
which every CI image has, so the package needs no extra Python dependency.
"""
from __future__ import annotations

import shutil
import ssl
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

MODES = ("enforcing", "permissive")
TLS_HANDSHAKE_FIRST_BYTE = 0x16


def self_signed_cert(directory: Optional[str] = None, common_name: str = "localhost",
                     days: int = 3650) -> Tuple[str, str]:
    """Create a self-signed certificate and key (PEM) for 127.0.0.1/localhost.

    Returns (cert path, key path). Raises RuntimeError when ``openssl`` is not installed.
    """
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("the openssl command is needed to make a self-signed certificate; "
                           "install it or pass tls_cert/tls_key")
    out = Path(directory or tempfile.mkdtemp(prefix="rmq-embedded-tls-"))
    out.mkdir(parents=True, exist_ok=True)
    cert, key = out / "server.crt", out / "server.key"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256",
         "-days", str(days), "-subj", f"/CN={common_name}",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
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
