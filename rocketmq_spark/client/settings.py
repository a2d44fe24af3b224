"""How a Spark task reaches RocketMQ: addresses, credentials, TLS, namespace and timeout, as
one hashable value. The value itself is the key of the per-process client pool
(:mod:`.pool`): two settings that compare equal may share connections, routes and producers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from .acl import Credentials
from .config import ClientConfig, make_tls_context
from .secret_repr import HidesSecrets, secret_field

# The shortest time one remoting request may take, whatever the option asked: a shorter
# pull or send timeout still bounds the whole pull or send, just not each request alone.
MIN_REQUEST_TIMEOUT = 3.0


@dataclass(frozen=True, repr=False)
class ConnectionSettings(HidesSecrets):
    """Everything that decides whether two clients may share connections.

    ``name_servers`` (remoting) or ``endpoints`` (a 5.x proxy over gRPC). ``timeout``: the
    user's per-request timeout in seconds (``pullTimeoutMs``, ``sendTimeoutMs``).
    ``credentials`` compare by access key and secret (:class:`Credentials`), and never show."""

    name_servers: Tuple[str, ...] = ()
    endpoints: Optional[str] = None
    credentials: Optional[Credentials] = secret_field()
    tls: bool = False
    tls_ca_file: Optional[str] = None
    tls_verify: bool = True
    namespace: str = ""
    timeout: float = 5.0

    @property
    def request_timeout(self) -> float:
        """One remoting request's timeout (at least :data:`MIN_REQUEST_TIMEOUT`)."""
        return max(MIN_REQUEST_TIMEOUT, self.timeout)

    def client_config(self) -> ClientConfig:
        """The remoting client's config: the one place these settings become one."""
        tls = None
        if self.tls:
            tls = make_tls_context(ca_file=self.tls_ca_file, verify=self.tls_verify,
                                   check_hostname=self.tls_verify and not self.tls_ca_file)
        return ClientConfig(credentials=self.credentials, tls=tls,
                            request_timeout=self.request_timeout)
