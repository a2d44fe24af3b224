"""The remoting proxy's own connections to its brokers (a genuine proxy is a remoting client of
them, MQClientAPIExt in cluster mode).

One connection per broker address, opened on first use and kept; requests are pipelined on it
and matched to their answers by opaque. A broker holds a suspended pull on this connection and
answers it later, which is how long polling reaches the proxy's client. Requests a broker starts
go to ``on_request``: the proxy passes a check-back on to its client (:mod:`.proxy_transactions`)
and drops the rest.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
from dataclasses import replace
from typing import Callable, Dict, Optional, Tuple

from ..client.protocol.frame import FrameDecoder, RemotingCommand, encode_frame
from ..client.protocol.route import split_address

log = logging.getLogger(__name__)


class BrokerLink(asyncio.Protocol):
    """One open connection to a broker, with the proxy's requests under way on it. Each
    request has a callback, called once with the answer or an exception (no task per request:
    the proxy relays every pull this way)."""

    def __init__(self, address: str, on_request: Optional[Callable] = None):
        self.address = address
        self.on_request = on_request  # on_request(link, cmd): a request the broker sent
        self.transport: Optional[asyncio.Transport] = None
        self.closed = False
        self._decoder = FrameDecoder()
        self._calls: Dict[int, Tuple[Callable, asyncio.TimerHandle]] = {}
        self._opaque = itertools.count(1)

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            commands = self._decoder.feed(data)
        except Exception as exc:  # a broker that sends no frames: drop the link
            log.warning("proxy: closing the link to %s: %s", self.address, exc)
            self.transport.abort()
            return
        for cmd in commands:
            if not cmd.is_response:
                if self.on_request is not None:
                    self.on_request(self, cmd)
                continue
            call = self._calls.pop(cmd.opaque, None)
            if call is not None:
                call[1].cancel()
                call[0](cmd)

    def connection_lost(self, exc) -> None:
        self.closed = True
        calls, self._calls = self._calls, {}
        for callback, timer in calls.values():
            timer.cancel()
            callback(ConnectionError(f"the channel to {self.address} closed"))

    def call(self, cmd: RemotingCommand, timeout: float, callback: Callable) -> None:
        """Send ``cmd`` under the link's own opaque; ``callback`` gets its answer, or a
        TimeoutError after ``timeout`` seconds (RemotingTimeoutException's words)."""
        opaque = next(self._opaque)

        def expire() -> None:
            if self._calls.pop(opaque, None) is not None:
                callback(TimeoutError(f"wait response on the channel <{self.address}> "
                                      f"timeout, {int(timeout * 1000)}(ms)"))

        timer = asyncio.get_running_loop().call_later(timeout, expire)
        self._calls[opaque] = (callback, timer)
        self.transport.write(encode_frame(replace(cmd, opaque=opaque)))

    def oneway(self, cmd: RemotingCommand) -> None:
        self.transport.write(encode_frame(replace(cmd, opaque=next(self._opaque))))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()


class BrokerLinks:
    """The proxy's links, by broker address."""

    def __init__(self, tls: bool = False, on_request: Optional[Callable] = None):
        self._on_request = on_request
        self._ssl = None
        if tls:  # the brokers' own (often self-signed) certificate: encrypt, do not verify
            self._ssl = ssl.create_default_context()
            self._ssl.check_hostname = False
            self._ssl.verify_mode = ssl.CERT_NONE
        self._links: Dict[str, BrokerLink] = {}
        self._opening: Dict[str, asyncio.Future] = {}

    def open_link(self, address: str) -> Optional[BrokerLink]:
        """The open link to ``address``, or None (then :meth:`link` opens one)."""
        link = self._links.get(address)
        return link if link is not None and not link.closed else None

    async def link(self, address: str) -> BrokerLink:
        link = self._links.get(address)
        if link is not None and not link.closed:
            return link
        opening = self._opening.get(address)
        if opening is not None:
            return await asyncio.shield(opening)
        loop = asyncio.get_running_loop()
        opening = self._opening[address] = loop.create_future()
        try:
            host, port = split_address(address)
            try:
                _, link = await loop.create_connection(
                    lambda: BrokerLink(address, self._on_request), host, port, ssl=self._ssl)
            except OSError:
                raise ConnectionError(f"connect to {address} failed") from None
            self._links[address] = link
            opening.set_result(link)
            return link
        except BaseException as exc:
            opening.set_exception(exc)
            opening.exception()  # retrieved: nobody else may be waiting
            raise
        finally:
            self._opening.pop(address, None)

    def close(self) -> None:
        for link in self._links.values():
            link.close()
        self._links.clear()
