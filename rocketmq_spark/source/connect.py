"""From source options to RocketMQ clients, shared per Python process."""
from __future__ import annotations

from ..client import pool
from ..client.admin import Admin
from ..client.config import ClientConfig
from ..client.settings import ConnectionSettings
from .options import SourceOptions


def connection_settings(options: SourceOptions) -> ConnectionSettings:
    return ConnectionSettings(options.name_servers, options.credentials, options.tls,
                              options.tls_ca_file, options.tls_verify,
                              max(3.0, options.pull_timeout_ms / 1000.0))


def client_config(options: SourceOptions) -> ClientConfig:
    return connection_settings(options).client_config()


def shared_admin(options: SourceOptions) -> Admin:
    """The process's Admin (connections, route cache) for these options."""
    settings = connection_settings(options)
    return pool.shared(("admin",) + settings.pool_key(),
                       lambda: Admin(list(options.name_servers), config=settings.client_config()))
