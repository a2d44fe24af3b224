"""The Telemetry stream: a client declares its settings, the proxy answers with the settings in
force (for a producer: the largest body it takes, whether it checks message types, how to back
off). Official clients keep the stream open for the client's life; so does :class:`Session`.

A producer's settings list the topics it publishes to: Apache's proxy registers the producer
once per topic and refuses settings that list none (5.0: gRPC INVALID_ARGUMENT "there is no
publishing or subscription data in settings"). When the producer meets a new topic it sends its
settings again, with the grown list, on the same stream and waits for the proxy's answer
(:meth:`Session.update`), as the official clients wait for the settings answer of a session
before sending through it.
"""
from __future__ import annotations

import asyncio
import collections
from typing import Deque, Optional, Sequence

import grpc
from grpc import aio

from ..errors import ProxyError, RequestTimeout
from . import definition_pb2 as definition
from . import service_pb2 as service
from . import status


def producer_settings(access_point: definition.Endpoints, topics: Sequence[definition.Resource],
                      request_timeout: float, version: str) -> definition.Settings:
    settings = definition.Settings(
        client_type=definition.PRODUCER, access_point=access_point,
        publishing=definition.Publishing(topics=list(topics), validate_message_type=True),
        user_agent=definition.UA(language=definition.PYTHON, version=version, platform="python",
                         hostname=""),
        metric=definition.Metric(on=False))
    settings.request_timeout.FromMilliseconds(int(request_timeout * 1000))
    return settings


def topic_resources(topics: Sequence[str], namespace: str) -> list:
    """The ``Resource`` of each topic name, in ``namespace``."""
    return [definition.Resource(name=t, resource_namespace=namespace) for t in topics]


class Session:
    """One open Telemetry stream on the producer's event loop. :meth:`start` sends the
    settings and waits for the answer, :meth:`update` sends them again; the proxy's later
    commands are read all along (settings answers go to the :meth:`update` waiting for them,
    the rest are dropped: a producer acts on none) so that the stream never stalls. Once the
    stream has ended, :attr:`ended` holds the error that ended it."""

    def __init__(self, stub, metadata, address: str):
        self._stub = stub
        self._metadata = metadata
        self._address = address
        self._call = None
        self._reader: Optional[asyncio.Task] = None
        self._first_status = None
        self._waiting: Deque[asyncio.Future] = collections.deque()
        self.ended: Optional[BaseException] = None

    async def start(self, settings: definition.Settings, timeout: float) -> definition.Settings:
        """Open the stream, send ``settings`` and return the proxy's answer (or raise)."""
        self._call = self._stub.Telemetry(metadata=self._metadata)
        self._call.add_done_callback(self._record_status)
        try:
            return await asyncio.wait_for(self._exchange(settings), timeout)
        except asyncio.TimeoutError:
            self.close()
            raise RequestTimeout(self._address, "Telemetry (client settings)", timeout) \
                from None
        except grpc.RpcError as exc:
            self.close()
            raise status.rpc_error(exc, "Telemetry", self._address, timeout) from None
        except BaseException:
            self.close()
            raise

    async def _exchange(self, settings: definition.Settings) -> definition.Settings:
        # Read while writing: a proxy that refuses the client (ACL) answers and ends the
        # stream without reading, which fails the write; its answer is what tells why.
        reading = asyncio.ensure_future(self._call.read())
        write_failed = False
        try:
            await self._call.write(service.TelemetryCommand(settings=settings))
        except (grpc.RpcError, asyncio.InvalidStateError):
            write_failed = True  # the read says what became of the call
        except BaseException:
            reading.cancel()
            raise
        while True:
            try:
                command = await reading
            except aio.AioRpcError as exc:
                if write_failed and exc.code() is grpc.StatusCode.INTERNAL:
                    raise self._real_error(exc) from None
                raise
            if command is aio.EOF:
                raise ProxyError(0, "CANCELLED", "the proxy ended the settings stream without "
                                 "settings", "Telemetry", self._address, transient=True)
            if command.HasField("status"):
                status.check(command.status, "Telemetry", self._address)
            if command.HasField("settings"):
                self._reader = asyncio.get_running_loop().create_task(self._read_on())
                return command.settings
            reading = asyncio.ensure_future(self._call.read())

    def _record_status(self, call) -> None:
        """The call's first status, kept: grpc.aio reports a write to a stream the server has
        already ended (a refusal) as INTERNAL, replacing the status the server sent."""
        if self._first_status is None:
            self._first_status = (_settled(call.code()), _settled(call.details()))

    def _real_error(self, internal: aio.AioRpcError) -> aio.AioRpcError:
        code, details = self._first_status or (None, None)
        if code is None or code is grpc.StatusCode.INTERNAL:
            return internal
        return aio.AioRpcError(code, aio.Metadata(), aio.Metadata(), details)

    async def update(self, settings: definition.Settings, timeout: float) -> definition.Settings:
        """Send ``settings`` again on the open stream and return the proxy's answer (or raise:
        a proxy that refuses them ends the stream, and that error is raised)."""
        if self.ended is not None:
            raise self.ended
        answer = asyncio.get_running_loop().create_future()
        self._waiting.append(answer)
        try:
            await self._call.write(service.TelemetryCommand(settings=settings))
        except (grpc.RpcError, asyncio.InvalidStateError):
            pass  # the stream has ended: the reader reports why
        try:
            return await asyncio.wait_for(asyncio.shield(answer), timeout)
        except asyncio.TimeoutError:
            raise RequestTimeout(self._address, "Telemetry (client settings)", timeout) \
                from None
        finally:
            if answer in self._waiting:
                self._waiting.remove(answer)

    async def _read_on(self) -> None:
        """(loop) Read the stream until it ends, answering :meth:`update`'s waiters."""
        try:
            while True:
                command = await self._call.read()
                if command is aio.EOF:
                    self._end(ProxyError(0, "CANCELLED", "the proxy ended the settings stream",
                                         "Telemetry", self._address, transient=True))
                    return
                if command.HasField("settings") and self._waiting:
                    waiter = self._waiting.popleft()
                    if not waiter.done():
                        if command.HasField("status") and \
                                command.status.code not in status.OK_CODES:
                            waiter.set_exception(status.status_error(command.status, "Telemetry",
                                                              self._address))
                        else:
                            waiter.set_result(command.settings)
        except asyncio.CancelledError:
            self._end(ProxyError(0, "CANCELLED", "the settings stream was closed", "Telemetry",
                                 self._address, transient=True))
            raise
        except (grpc.RpcError, asyncio.InvalidStateError) as exc:
            if isinstance(exc, aio.AioRpcError):
                exc = self._real_error(exc)
                self._end(status.rpc_error(exc, "Telemetry", self._address, 0.0))
            else:
                self._end(ProxyError(0, "CANCELLED", "the settings stream ended", "Telemetry",
                                     self._address, transient=True))

    def _end(self, error: BaseException) -> None:
        self.ended = error
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_exception(error)

    def close(self) -> None:
        """End the stream (on the loop thread)."""
        if self._reader is not None:
            self._reader.cancel()
        if self._call is not None:
            self._call.cancel()


def _settled(coro):
    """The value of a call's coroutine accessor once the call is done (it returns without
    waiting then); None if it would wait."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    return None
