"""The embedded proxy's clients: the settings each declared over Telemetry, accepted or refused
as Apache RocketMQ 5.0's proxy does, and the Heartbeat answer that depends on them.

Read from apache/rocketmq 5.0's ``grpc/v2/client/ClientActivity.java``
(``processAndWriteClientSettings``, ``processTelemetryException``, ``heartbeat``) and
``grpc/v2/common/GrpcClientSettingsManager.java``:

* A producer is registered once for each topic of ``publishing.topics`` (each name checked as
  GrpcValidator checks it), a consumer for ``subscription.group``. Settings that register
  nothing (no pub_sub, or publishing with no topic) end the stream with gRPC INVALID_ARGUMENT
  "there is no publishing or subscription data in settings".
* A refused name ends the stream with INVALID_ARGUMENT (a client error: proxy code 40000-49999)
  or INTERNAL, "process client telemetryCommand failed. " + the reason. Registering a client
  parses its ``x-mq-language`` header as Java's LanguageCode, so an unknown language is such an
  INTERNAL failure.
* Accepted settings are kept by client id and answered merged with the proxy's view (backoff,
  the largest body, message type checks); a Heartbeat from a client without settings is
  UNRECOGNIZED_CLIENT_TYPE "cannot find client settings for this client".
"""
from __future__ import annotations

from typing import Dict, Optional

import grpc

from ..client.grpc import definition_pb2 as definition
from ..client.grpc import service_pb2 as service
from .grpc_validation import (
    ProxyLimits, Refused, status, unknown_language, validate_group, validate_topic, wrap,
)

NO_PUB_SUB = "there is no publishing or subscription data in settings"
TELEMETRY_FAILED = "process client telemetryCommand failed. "
NO_SETTINGS = "cannot find client settings for this client"
CONSUMERS = (definition.PUSH_CONSUMER, definition.SIMPLE_CONSUMER)


class SettingsRefused(Exception):
    """Settings the proxy refuses: it ends the Telemetry stream with this gRPC status."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self.code = code
        self.details = details


class ClientSettings:
    """Settings by client id, as the proxy keeps them."""

    def __init__(self, limits: ProxyLimits):
        self.limits = limits
        self.by_client: Dict[str, definition.Settings] = {}

    def accept(self, client_id: str, language: str,
               settings: definition.Settings) -> definition.Settings:
        """Register the client for what ``settings`` declare and return the proxy's answer;
        raise :class:`SettingsRefused` as ClientActivity does."""
        registered = False
        try:
            kind = settings.WhichOneof("pub_sub")
            if kind == "publishing":
                for topic in settings.publishing.topics:
                    validate_topic(wrap(topic))
                    _register(language)
                    registered = True
            elif kind == "subscription":
                validate_group(wrap(settings.subscription.group))
                _register(language)
                registered = True
        except Refused as exc:
            code = exc.status.code
            client_error = definition.BAD_REQUEST <= code < definition.INTERNAL_ERROR
            raise SettingsRefused(grpc.StatusCode.INVALID_ARGUMENT if client_error
                                  else grpc.StatusCode.INTERNAL,
                                  TELEMETRY_FAILED + exc.status.message) from None
        except _Internal as exc:
            raise SettingsRefused(grpc.StatusCode.INTERNAL, TELEMETRY_FAILED + str(exc)) from None
        if not registered:
            raise SettingsRefused(grpc.StatusCode.INVALID_ARGUMENT, NO_PUB_SUB)
        self.by_client[client_id] = settings
        return self.answer(settings)

    def heartbeat(self, client_id: str, request: service.HeartbeatRequest) -> definition.Status:
        settings = self.by_client.get(client_id)
        if settings is None:
            return status(definition.UNRECOGNIZED_CLIENT_TYPE, NO_SETTINGS)
        kind = settings.client_type
        if kind in CONSUMERS:
            try:
                validate_group(wrap(request.group))
            except Refused as exc:
                return exc.status
        elif kind != definition.PRODUCER:
            return status(definition.UNRECOGNIZED_CLIENT_TYPE, definition.ClientType.Name(kind))
        return status(definition.OK)

    def forget(self, client_id: str) -> Optional[definition.Settings]:
        return self.by_client.pop(client_id, None)

    def answer(self, settings: definition.Settings) -> definition.Settings:
        """The client's settings with the proxy's view merged in (GrpcClientSettingsManager's
        mergeProducerData / mergeSubscriptionData / mergeMetric with ProxyConfig's defaults)."""
        answer = definition.Settings()
        answer.CopyFrom(settings)
        answer.metric.CopyFrom(definition.Metric(on=False))
        backoff = answer.backoff_policy
        if settings.HasField("publishing"):
            answer.publishing.max_body_size = self.limits.max_message_size
            answer.publishing.validate_message_type = True
            backoff.max_attempts = 3
        else:
            answer.subscription.fifo = False
            answer.subscription.receive_batch_size = 32
            if not answer.subscription.HasField("long_polling_timeout"):
                answer.subscription.long_polling_timeout.FromSeconds(20)
            backoff.max_attempts = 17
        backoff.exponential_backoff.initial.FromMilliseconds(10)
        backoff.exponential_backoff.max.FromSeconds(1)
        backoff.exponential_backoff.multiplier = 2.0
        return answer


class _Internal(Exception):
    """A Java exception that is not the proxy's own (reported as INTERNAL)."""


def _register(language: str) -> None:
    reason = unknown_language(language)
    if reason:
        raise _Internal(reason)
