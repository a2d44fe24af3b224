"""Connections by address: open on first use, reopen after a failure, close idle ones.

Requests go out with ROCKETMQ binary headers: every 4.x and 5.x server decodes them, a 4.x
broker answers in the request's format (cheaper to read than JSON; 5.x servers answer in JSON
whatever the request used), and responses are decoded per frame in either format.
"""
from __future__ import annotations

import threading
from typing import Dict, List, Optional, Sequence, Tuple, Type

from .config import ClientConfig
from .connection import Connection, RequestHandler, ResponseFuture
from .errors import BrokerUnavailable, ClientClosed, RemotingConnectionError
from .protocol.codes import SerializeType
from .protocol.frame import RemotingCommand


class RemotingClient:
    """A cache of :class:`Connection` objects, one per address, shared by many callers."""

    def __init__(self, config: Optional[ClientConfig] = None,
                 request_handler: Optional[RequestHandler] = None,
                 serialize_type: int = SerializeType.ROCKETMQ):
        self.config = config or ClientConfig()
        self.serialize_type = serialize_type
        self._request_handler = request_handler
        self._connections: Dict[str, Connection] = {}
        self._locks: Dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._closed = False

    def connection(self, address: str,
                   unavailable: Type[RemotingConnectionError] = BrokerUnavailable) -> Connection:
        """The open connection to ``address``, connecting (once, under a per-address lock)."""
        conn = self._connections.get(address)
        if conn is not None and conn.poll():
            return conn
        if self._closed:
            raise ClientClosed("the remoting client is closed")
        with self._lock:
            lock = self._locks.setdefault(address, threading.Lock())
        with lock:
            conn = self._connections.get(address)
            if conn is None or not conn.poll():
                conn = Connection(address, connect_timeout=self.config.connect_timeout,
                                  tls=self.config.tls, credentials=self.config.credentials,
                                  request_handler=self._request_handler, unavailable=unavailable,
                                  serialize_type=self.serialize_type)
                self._connections[address] = conn
            return conn

    def send(self, address: str, cmd: RemotingCommand,
             unavailable: Type[RemotingConnectionError] = BrokerUnavailable
             ) -> Tuple[Connection, ResponseFuture]:
        """Send without waiting; pass the pair to :meth:`wait`."""
        cmd.version = self.config.version
        conn = self.connection(address, unavailable)
        return conn, conn.send_request(cmd)

    def send_many(self, address: str, cmds: Sequence[RemotingCommand],
                  unavailable: Type[RemotingConnectionError] = BrokerUnavailable
                  ) -> List[Tuple[Connection, ResponseFuture]]:
        """Send several requests to one address in a single write."""
        for cmd in cmds:
            cmd.version = self.config.version
        conn = self.connection(address, unavailable)
        return [(conn, future) for future in conn.send_requests(cmds)]

    def wait(self, pending: Tuple[Connection, ResponseFuture],
             timeout: Optional[float] = None) -> RemotingCommand:
        conn, future = pending
        return conn.wait(future, self.config.request_timeout if timeout is None else timeout)

    def invoke(self, address: str, cmd: RemotingCommand, timeout: Optional[float] = None,
               unavailable: Type[RemotingConnectionError] = BrokerUnavailable) -> RemotingCommand:
        return self.wait(self.send(address, cmd, unavailable), timeout)

    def invoke_oneway(self, address: str, cmd: RemotingCommand,
                      unavailable: Type[RemotingConnectionError] = BrokerUnavailable) -> None:
        cmd.version = self.config.version
        self.connection(address, unavailable).invoke_oneway(cmd)

    def existing_connection(self, address: str) -> Optional[Connection]:
        """The connection to ``address`` if one was made (open or closed), without connecting:
        for callers that watch a peer's connection rather than talk to it."""
        return self._connections.get(address)

    def close(self) -> None:
        self._closed = True
        for conn in list(self._connections.values()):
            conn.close()
        self._connections.clear()

    def __enter__(self) -> "RemotingClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
