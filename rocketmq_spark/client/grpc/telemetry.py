"""The Telemetry stream: a client declares its settings, the proxy answers with the settings in
force (for a producer: the largest body it takes, whether it checks message types, how to back
off). Official clients keep the stream open for the client's life; so does :class:`Session`.
"""
from __future__ import annotations

import queue
import threading
from typing import Iterator, Optional, Sequence

import grpc

from ..errors import ProxyError, RequestTimeout
from . import definition_pb2 as pb
from . import service_pb2 as spb
from . import status as S


def producer_settings(access_point: pb.Endpoints, topics: Sequence[pb.Resource],
                      request_timeout: float, version: str) -> pb.Settings:
    settings = pb.Settings(
        client_type=pb.PRODUCER, access_point=access_point,
        publishing=pb.Publishing(topics=list(topics), validate_message_type=True),
        user_agent=pb.UA(language=pb.PYTHON, version=version, platform="python",
                         hostname=""),
        metric=pb.Metric(on=False))
    settings.request_timeout.FromMilliseconds(int(request_timeout * 1000))
    return settings


class Session:
    """One open Telemetry stream. :meth:`start` sends the settings and waits for the answer."""

    def __init__(self, stub, metadata, address: str):
        self._stub = stub
        self._metadata = metadata
        self._address = address
        self._outgoing: "queue.SimpleQueue[Optional[spb.TelemetryCommand]]" = queue.SimpleQueue()
        self._call = None

    def _requests(self) -> Iterator[spb.TelemetryCommand]:
        while True:
            command = self._outgoing.get()
            if command is None:
                return
            yield command

    def start(self, settings: pb.Settings, timeout: float) -> pb.Settings:
        """Open the stream, send ``settings`` and return the proxy's answer (or raise)."""
        self._outgoing.put(spb.TelemetryCommand(settings=settings))
        self._call = self._stub.Telemetry(self._requests(), metadata=self._metadata)
        expired = threading.Event()

        def expire():
            expired.set()
            self._call.cancel()

        timer = threading.Timer(timeout, expire)
        timer.daemon = True
        timer.start()
        try:
            for command in self._call:
                if command.HasField("status"):
                    S.check(command.status, "Telemetry", self._address)
                if command.HasField("settings"):
                    return command.settings
        except grpc.RpcError as exc:
            if expired.is_set():
                self.close()
                raise RequestTimeout(self._address, "Telemetry (client settings)",
                                     timeout) from None
            self.close()
            raise S.rpc_error(exc, "Telemetry", self._address, timeout) from None
        except BaseException:
            self.close()
            raise
        finally:
            timer.cancel()
        self.close()
        raise ProxyError(0, "CANCELLED", "the proxy ended the settings stream without settings",
                         "Telemetry", self._address, transient=True)

    def close(self) -> None:
        self._outgoing.put(None)
        if self._call is not None:
            self._call.cancel()
