"""How a Spark task reaches RocketMQ: addresses, credentials, TLS and timeouts, as one hashable
value, the key of the per-process client pool (:mod:`.pool`)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Optional, Tuple

from .acl import Credentials
from .config import ClientConfig, make_tls_context


@dataclass(frozen=True)
class ConnectionSettings:
    """Everything that decides whether two clients may share connections.

    ``repr`` and :meth:`pool_key` never show the secret key (the key holds a digest of a
    signature made with it)."""

    name_servers: Tuple[str, ...]
    credentials: Optional[Credentials] = field(default=None, repr=False)
    tls: bool = False
    tls_ca_file: Optional[str] = None
    tls_verify: bool = True
    request_timeout: float = 5.0

    def client_config(self) -> ClientConfig:
        tls = None
        if self.tls:
            tls = make_tls_context(ca_file=self.tls_ca_file, verify=self.tls_verify,
                                   check_hostname=self.tls_verify and not self.tls_ca_file)
        return ClientConfig(credentials=self.credentials, tls=tls,
                            request_timeout=self.request_timeout)

    def pool_key(self) -> tuple:
        secret = ""
        if self.credentials is not None:
            secret = hashlib.sha256(self.credentials.signature(b"pool").encode()).hexdigest()
        return (self.name_servers, self.credentials.access_key if self.credentials else None,
                secret, self.tls, self.tls_ca_file, self.tls_verify, self.request_timeout)
