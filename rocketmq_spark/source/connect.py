"""From source options to RocketMQ clients, shared per Python process."""
from __future__ import annotations

from ..client import pool
from ..client.admin import Admin
from ..client.config import ClientConfig
from .options import SourceOptions


def client_config(options: SourceOptions) -> ClientConfig:
    return options.connection.client_config()


def shared_admin(options: SourceOptions) -> Admin:
    """The process's Admin (connections, route cache) for these options' connection."""
    settings = options.connection
    return pool.shared(("admin", settings),
                       lambda: Admin(list(settings.name_servers), config=settings.client_config()))
