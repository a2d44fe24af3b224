"""The Telemetry stream: a client declares its settings, the proxy answers with the settings in
force (for a producer: the largest body it takes, whether it checks message types, how to back
off). Official clients keep the stream open for the client's life; so does :class:`Session`.
"""
from __future__ import annotations

import asyncio
from typing import Optional, Sequence

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


class Session:
    """One open Telemetry stream on the producer's event loop. :meth:`start` sends the
    settings and waits for the answer; later commands from the proxy are read and dropped
    (a producer acts on none of them) so that the stream never stalls."""

    def __init__(self, stub, metadata, address: str):
        self._stub = stub
        self._metadata = metadata
        self._address = address
        self._call = None
        self._reader: Optional[asyncio.Task] = None
        self._first_status = None

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
                self._reader = asyncio.get_running_loop().create_task(self._drain())
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

    async def _drain(self) -> None:
        try:
            while await self._call.read() is not aio.EOF:
                pass
        except (grpc.RpcError, asyncio.CancelledError, asyncio.InvalidStateError):
            pass

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
