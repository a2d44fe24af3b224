"""From source options to RocketMQ clients, shared per Python process."""
from __future__ import annotations

import hashlib

from ..client import pool
from ..client.admin import Admin
from ..client.config import ClientConfig, make_tls_context
from .options import SourceOptions


def client_config(options: SourceOptions) -> ClientConfig:
    tls = None
    if options.tls:
        tls = make_tls_context(ca_file=options.tls_ca_file, verify=options.tls_verify,
                               check_hostname=options.tls_verify and not options.tls_ca_file)
    timeout = max(3.0, options.pull_timeout_ms / 1000.0)
    return ClientConfig(credentials=options.credentials, tls=tls, request_timeout=timeout)


def _key(options: SourceOptions) -> tuple:
    # The secret takes part only as a digest. The key holds the access key: never log it.
    secret = ""
    if options.credentials is not None:
        secret = hashlib.sha256(options.credentials.signature(b"pool").encode()).hexdigest()
    return (options.name_servers, options.credentials.access_key if options.credentials
            else None, secret, options.tls, options.tls_ca_file, options.tls_verify,
            options.pull_timeout_ms)


def shared_admin(options: SourceOptions) -> Admin:
    """The process's Admin (connections, route cache) for these options."""
    return pool.shared(("admin",) + _key(options),
                       lambda: Admin(list(options.name_servers), config=client_config(options)))
