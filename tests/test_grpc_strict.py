"""The embedded 5.x proxy refuses what Apache RocketMQ 5.0's proxy refuses, with the same gRPC
status or in-band ``Status`` code and message; and our GrpcProducer declares its topics as the
official clients do, so that the genuine proxy accepts it.

Each refusal names the Apache source file it was read from (apache/rocketmq, the 5.0 line:
``proxy/src/main/java/org/apache/rocketmq/proxy/...``); none could be checked against a running
Java proxy here. Requests are made with raw gRPC stubs over a real socket to the embedded
cluster, so that what a client library would refuse first still reaches the proxy.
"""
from __future__ import annotations

import queue
import time
import uuid

import grpc
import pytest

from rocketmq_spark.client import ClientConfig, Message, QueueRangeReader, ReadSettings
from rocketmq_spark.client.admin import Admin
from rocketmq_spark.client.grpc import GrpcProducer
from rocketmq_spark.client.grpc import definition_pb2 as definition
from rocketmq_spark.client.grpc import service_pb2 as service
from rocketmq_spark.client.grpc import service_pb2_grpc as service_grpc
from rocketmq_spark.embedded import EmbeddedCluster
from rocketmq_spark.embedded.grpc_proxy import GrpcProxy
from rocketmq_spark.embedded.grpc_validation import wrap

MAX_BODY = 1024  # the cluster's max_message_size, which the proxy's limit follows
FAQ = "\nFor more information, please visit the url, http://rocketmq.apache.org/docs/faq/"
NO_PUB_SUB = "there is no publishing or subscription data in settings"
FAILED = "process client telemetryCommand failed. "


@pytest.fixture(scope="module")
def cluster():
    with EmbeddedCluster(brokers=1, grpc_proxy=True, grpc_proxy_tls=False,
                         max_message_size=MAX_BODY) as c:
        c.create_topic("Strict", 2)
        c.create_topic("ns1%Strict", 1)
        yield c


@pytest.fixture(scope="module")
def stub(cluster):
    channel = grpc.insecure_channel(cluster.proxy_endpoint)
    yield service_grpc.MessagingServiceStub(channel)
    channel.close()


def headers(client_id: str = "strict-client", language: str = "PYTHON",
            namespace: str = ""):
    md = [("x-mq-language", language), ("x-mq-protocol", "v2"),
          ("x-mq-client-version", "test"), ("x-mq-namespace", namespace),
          ("x-mq-request-id", str(uuid.uuid4()))]
    if client_id:
        md.append(("x-mq-client-id", client_id))
    return md


def producer_settings(*topics: str, namespace: str = "") -> definition.Settings:
    return definition.Settings(client_type=definition.PRODUCER, publishing=definition.Publishing(
        topics=[definition.Resource(name=t, resource_namespace=namespace) for t in topics]))


def telemetry(stub, settings: definition.Settings, **md):
    """The first answer to ``settings`` on a new stream, or the RpcError that ended it."""
    responses = stub.Telemetry(iter([service.TelemetryCommand(settings=settings)]),
                               metadata=headers(**md), timeout=10)
    try:
        return next(responses)
    except grpc.RpcError as exc:
        return exc


def refused_stream(answer) -> tuple:
    assert isinstance(answer, grpc.RpcError), f"settings accepted: {answer}"
    return answer.code(), answer.details()


def message(topic: str = "Strict", body: bytes = b"body", namespace: str = "",
            **system) -> definition.Message:
    system.setdefault("message_id", uuid.uuid4().hex.upper())
    system.setdefault("message_type", definition.NORMAL)
    props = system.pop("user_properties", None)
    return definition.Message(topic=definition.Resource(name=topic, resource_namespace=namespace),
                              body=body, user_properties=props,
                              system_properties=definition.SystemProperties(**system))


def send(stub, *messages, **md) -> definition.Status:
    response = stub.SendMessage(service.SendMessageRequest(messages=list(messages)),
                                metadata=headers(**md), timeout=10)
    return response.status


def read_topic(cluster, topic):
    rows = []
    with Admin(cluster.namesrv_addr, ClientConfig()) as admin:
        for mq in admin.queues(topic, refresh=True):
            high = admin.offsets("max", [mq])[mq]
            for batch in QueueRangeReader(admin.brokers, admin.address, mq, 0, high,
                                          ReadSettings(consumer_group="strict-check")):
                rows.extend(batch.to_pylist())
    return rows


# ------------------------------------------------------------ settings (ClientActivity.java)


def test_settings_without_topics_are_refused_as_5_0_does(stub):
    """grpc/v2/client/ClientActivity.java, processAndWriteClientSettings: nothing registered
    (publishing without a topic, or no pub_sub at all) ends the stream INVALID_ARGUMENT. What
    our producer sent before it declared topics; Apache's 5.0.0 refused every write."""
    code = grpc.StatusCode.INVALID_ARGUMENT
    assert refused_stream(telemetry(stub, producer_settings())) == (code, NO_PUB_SUB)
    bare = definition.Settings(client_type=definition.PRODUCER)
    assert refused_stream(telemetry(stub, bare)) == (code, NO_PUB_SUB)
    answer = telemetry(stub, producer_settings("Strict"))
    assert answer.status.code == definition.OK
    assert answer.settings.publishing.max_body_size == MAX_BODY
    assert [t.name for t in answer.settings.publishing.topics] == ["Strict"]


@pytest.mark.parametrize("topic, reason", [
    ("bad topic", "The specified topic[bad topic] contains illegal characters, allowing only "
                  "^[%|a-zA-Z0-9_-]+$"),
    ("T" * 128, "The specified topic is longer than topic max length 127."),
    ("TBW102", "cannot access system topic"),
    ("rmq_sys_anything", "cannot access system topic"),
    ("  ", "topic name cannot be empty"),
])
def test_settings_with_an_illegal_topic_end_the_stream(stub, topic, reason):
    """ClientActivity.java (processTelemetryException: a proxy code of 40000-49999 is
    INVALID_ARGUMENT) over grpc/v2/common/GrpcValidator.java validateTopic and the client's
    Validators.checkTopic."""
    assert refused_stream(telemetry(stub, producer_settings("Strict", topic))) == \
        (grpc.StatusCode.INVALID_ARGUMENT, FAILED + reason)


def test_settings_of_a_system_consumer_group_are_refused(stub):
    """ClientActivity.java over GrpcValidator.java validateConsumerGroup."""
    settings = definition.Settings(client_type=definition.SIMPLE_CONSUMER,
                                   subscription=definition.Subscription(
                                       group=definition.Resource(name="CID_RMQ_SYS_mine")))
    assert refused_stream(telemetry(stub, settings)) == \
        (grpc.StatusCode.INVALID_ARGUMENT, FAILED + "cannot use system consumer group")


def test_an_unknown_client_language_fails_the_registration(stub):
    """ClientActivity.java registerProducer: LanguageCode.valueOf(x-mq-language) throws, an
    exception not of the proxy's own: INTERNAL."""
    assert refused_stream(telemetry(stub, producer_settings("Strict"), language="KOTLIN")) == \
        (grpc.StatusCode.INTERNAL, FAILED + "No enum constant "
                                            "org.apache.rocketmq.remoting.protocol.LanguageCode.KOTLIN")


def test_heartbeat_needs_accepted_settings(stub):
    """ClientActivity.java heartbeat: no settings for this client id -> UNRECOGNIZED_CLIENT_TYPE;
    refused settings are not kept."""
    client = "strict-heartbeat"
    beat = lambda: stub.Heartbeat(service.HeartbeatRequest(client_type=definition.PRODUCER),  # noqa: E731
                                  metadata=headers(client_id=client), timeout=10).status
    assert (beat().code, beat().message) == (definition.UNRECOGNIZED_CLIENT_TYPE,
                                             "cannot find client settings for this client")
    refused_stream(telemetry(stub, producer_settings(), client_id=client))
    assert beat().code == definition.UNRECOGNIZED_CLIENT_TYPE
    assert telemetry(stub, producer_settings("Strict"), client_id=client).status.code == \
        definition.OK
    assert beat().code == definition.OK


def test_settings_sent_again_on_the_stream_are_answered_again(stub):
    """ClientActivity.java: every settings command on the stream registers its topics and is
    answered (how a producer declares a topic it meets later)."""
    commands = queue.Queue()
    commands.put(service.TelemetryCommand(settings=producer_settings("Strict")))
    responses = stub.Telemetry(iter(commands.get, None), metadata=headers(client_id="again"),
                               timeout=10)
    assert [t.name for t in next(responses).settings.publishing.topics] == ["Strict"]
    commands.put(service.TelemetryCommand(settings=producer_settings("Strict", "Other")))
    assert [t.name for t in next(responses).settings.publishing.topics] == ["Strict", "Other"]
    commands.put(None)


# ------------------------------------------------------ every call (GrpcMessagingApplication)


def test_calls_without_a_client_id_are_refused(stub):
    """grpc/v2/GrpcMessagingApplication.java validateContext: CLIENT_ID_REQUIRED."""
    expected = (definition.CLIENT_ID_REQUIRED, "client id cannot be empty")
    route = stub.QueryRoute(service.QueryRouteRequest(topic=definition.Resource(name="Strict")),
                            metadata=headers(client_id=""), timeout=10).status
    assert (route.code, route.message) == expected
    sent = send(stub, message(), client_id="")
    assert (sent.code, sent.message) == expected


# ------------------------------------------------------------ routes (RouteActivity.java)


def test_query_route_of_an_unknown_or_illegal_topic(stub):
    """service/route/TopicRouteService.java (an empty route is MQClientException
    TOPIC_NOT_EXIST) through grpc/v2/common/ResponseBuilder.java (TOPIC_NOT_FOUND, the
    exception's text); grpc/v2/route/RouteActivity.java checks the name first (GrpcValidator)."""
    def route(name, namespace=""):
        return stub.QueryRoute(service.QueryRouteRequest(
            topic=definition.Resource(name=name, resource_namespace=namespace)),
            metadata=headers(), timeout=10).status

    missing = route("NoSuchStrictTopic")
    assert (missing.code, missing.message) == (
        definition.TOPIC_NOT_FOUND, "CODE: 17  DESC: No topic route info in name server for "
                                    "the topic: NoSuchStrictTopic" + FAQ)
    assert route("Strict", "nsX").message.endswith("the topic: nsX%Strict" + FAQ)
    illegal = route("a/b")
    assert (illegal.code, illegal.message) == (
        definition.ILLEGAL_TOPIC, "The specified topic[a/b] contains illegal characters, "
                                  "allowing only ^[%|a-zA-Z0-9_-]+$")
    assert route("Strict").code == definition.OK


# --------------------------------------------------- messages (SendMessageActivity.java)

DAY_MS = 24 * 3600 * 1000
SEND_REFUSALS = [
    (dict(body=b""), definition.MESSAGE_BODY_EMPTY, "message body cannot be empty"),
    (dict(body=b"x" * (MAX_BODY + 1)), definition.MESSAGE_BODY_TOO_LARGE,
     f"message body cannot exceed the max {MAX_BODY}"),
    (dict(user_properties={f"p{i}": "v" for i in range(129)}),
     definition.MESSAGE_PROPERTIES_TOO_LARGE, "too many user properties, max is 128"),
    (dict(user_properties={"KEYS": "mine"}), definition.ILLEGAL_MESSAGE_PROPERTY_KEY,
     "property is used by system: KEYS"),
    (dict(user_properties={"a\x01": "v"}), definition.ILLEGAL_MESSAGE_PROPERTY_KEY,
     "the key of property cannot contain control character"),
    (dict(user_properties={"a": "v\x7f"}), definition.ILLEGAL_MESSAGE_PROPERTY_KEY,
     "the value of property cannot contain control character"),
    (dict(user_properties={"big": "v" * 16_000}, tag="t" * 200, keys=["k" * 200]),
     definition.MESSAGE_PROPERTIES_TOO_LARGE,
     "the total size of user property is too large, max is 16384"),
    (dict(tag=" \t"), definition.ILLEGAL_MESSAGE_TAG,
     "tag cannot be the char sequence of whitespace"),
    (dict(tag="a|b"), definition.ILLEGAL_MESSAGE_TAG, "tag cannot contain '|'"),
    (dict(tag="a\nb"), definition.ILLEGAL_MESSAGE_TAG, "tag cannot contain control character"),
    (dict(keys=["ok", "  "]), definition.ILLEGAL_MESSAGE_KEY,
     "key cannot be the char sequence of whitespace"),
    (dict(keys=["a\x00"]), definition.ILLEGAL_MESSAGE_KEY, "key cannot contain control character"),
    (dict(message_id=" "), definition.ILLEGAL_MESSAGE_ID, "message id cannot be empty"),
    (dict(message_group=" "), definition.ILLEGAL_MESSAGE_GROUP,
     "message group cannot be the char sequence of whitespace"),
    (dict(message_group="g" * 64), definition.ILLEGAL_MESSAGE_GROUP,
     "message group exceed the max size 64"),
    (dict(message_group="g\x1f"), definition.ILLEGAL_MESSAGE_GROUP,
     "message group cannot contain control character"),
    (dict(delivery=DAY_MS + 60_000), definition.ILLEGAL_DELIVERY_TIME,
     f"the max delay time of message is too large, max is {DAY_MS}"),
    (dict(topic="rmq_sys_x"), definition.ILLEGAL_TOPIC, "cannot access system topic"),
    (dict(topic="NoSuchStrictTopic"), definition.TOPIC_NOT_FOUND,
     "CODE: 17  DESC: No topic route info in name server for the topic: NoSuchStrictTopic" + FAQ),
]


@pytest.mark.parametrize("fields, code, text", SEND_REFUSALS,
                         ids=[f"{definition.Code.Name(c)}:{t[:30]}" for _, c, t in SEND_REFUSALS])
def test_send_refusals_match_5_0(stub, fields, code, text):
    """grpc/v2/producer/SendMessageActivity.java (validateMessageBodySize,
    buildMessageProperty, validateMessageKey, validateMessageGroup, validateDelayTime) with
    config/ProxyConfig.java's defaults, GrpcValidator.java (validateTopic, validateTag) and,
    for an unknown topic, TopicRouteService.java + ResponseBuilder.java."""
    fields = dict(fields)
    delivery = fields.pop("delivery", None)
    m = message(**fields)
    if delivery is not None:
        m.system_properties.message_type = definition.DELAY
        m.system_properties.delivery_timestamp.FromMilliseconds(int(time.time() * 1000)
                                                                + delivery)
    status = send(stub, m)
    assert (status.code, status.message) == (code, text)


def test_a_call_of_mixed_topics_or_no_message_is_corrupted(stub):
    """SendMessageActivity.java sendMessage/buildMessage: MESSAGE_CORRUPTED."""
    mixed = send(stub, message("Strict"), message("Strict", namespace="ns1"))
    assert (mixed.code, mixed.message) == (definition.MESSAGE_CORRUPTED,
                                           "topic in message is not same")
    empty = send(stub)
    assert (empty.code, empty.message) == (definition.MESSAGE_CORRUPTED, "no message to send")


def test_what_5_0_takes_at_its_limits_is_stored(cluster, stub):
    """The limits' edges pass (body of exactly the maximum, 128 properties, a 63-byte group,
    a property set of 16,384 bytes)."""
    ok = [message(body=b"x" * MAX_BODY),
          message(user_properties={f"p{i:03d}": "v" for i in range(128)}),
          message(message_group="g" * 63),
          message(user_properties={"big": "v" * (16_384 - 3 - 4 - 2)}, tag="tttt", keys=["kk"])]
    for m in ok:
        status = send(stub, m)
        assert status.code == definition.OK, status.message


# ------------------------------------------------------- namespaces (NamespaceUtil.java)


def test_a_resource_namespace_names_the_broker_topic(cluster, stub):
    """grpc/v2/common/GrpcConverter.java wrapResourceWithNamespace (NamespaceUtil.wrapNamespace):
    the resource's namespace makes the stored topic ``ns%topic``; the x-mq-namespace header
    plays no part in the name, even when it disagrees."""
    before = len(read_topic(cluster, "ns1%Strict"))
    assert send(stub, message(namespace="ns1", body=b"in ns1"), namespace="other").code == \
        definition.OK
    assert send(stub, message(namespace="ns1", topic="ns1%Strict", body=b"already"),
                namespace="ns1").code == definition.OK  # a wrapped name is kept as is
    rows = read_topic(cluster, "ns1%Strict")
    assert [r["body"] for r in rows[before:]] == [b"in ns1", b"already"]


def test_our_producer_in_a_namespace(declared_at_send):
    """GrpcProducer(namespace=...) puts it in every resource and the header: its settings
    declare ``Strict`` in ``ns1`` and its messages are stored in ``ns1%Strict``, read back by
    remoting."""
    with EmbeddedCluster(brokers=1, grpc_proxy=True, grpc_proxy_tls=False) as cluster:
        cluster.create_topic("ns1%Strict", 1)
        with GrpcProducer(cluster.proxy_endpoint, tls=False, namespace="ns1",
                          topics=["Strict"]) as producer:
            assert [q.topic for q in producer.queues("Strict")] == ["Strict"]
            messages = [Message("Strict", f"n{i}".encode(), tags="t") for i in range(5)]
            assert len(producer.send(messages)) == 5
        rows = read_topic(cluster, "ns1%Strict")
    assert sorted(r["body"] for r in rows) == [f"n{i}".encode() for i in range(5)]
    assert {(topic, tuple(declared)) for topic, declared in declared_at_send} == \
        {("ns1%Strict", ("ns1%Strict",))}


# ------------------------------------------------- our producer declares before it sends


@pytest.fixture
def declared_at_send(monkeypatch):
    """Watches the embedded proxy (the real one) record, for every SendMessage, the topics the
    sending client had declared in its settings at that moment. Patched on the class before
    the cluster starts (grpc binds the servicer's methods when it starts)."""
    seen = []  # (the wrapped topic sent to, the wrapped topics declared)
    original = GrpcProxy.SendMessage

    async def watching(self, request, context):
        client = dict(context.invocation_metadata()).get("x-mq-client-id")
        settings = self.clients.by_client.get(client)
        declared = [wrap(t) for t in settings.publishing.topics] if settings else []
        seen.append((wrap(request.messages[0].topic), declared))
        return await original(self, request, context)

    monkeypatch.setattr(GrpcProxy, "SendMessage", watching)
    return seen


def test_our_producer_declares_each_topic_before_its_first_send(declared_at_send):
    """The `topics` it was made with in the first settings; every other topic it sends to is
    declared (settings sent again, answered) before the first message to it."""
    with EmbeddedCluster(brokers=1, grpc_proxy=True, grpc_proxy_tls=False) as cluster:
        for name in ("DeclA", "DeclB", "DeclC"):
            cluster.create_topic(name, 1)
        with GrpcProducer(cluster.proxy_endpoint, tls=False, topics=["DeclA"]) as producer:
            producer.send([Message("DeclB", b"b0")])
            producer.send([Message("DeclA", b"a0"), Message("DeclA", b"a1")])
            producer.send_async([Message("DeclC", b"c0")]).result(10)
            assert producer._channel.declared == {"DeclA", "DeclB", "DeclC"}
    assert [topic for topic, _ in declared_at_send] == ["DeclB", "DeclA", "DeclA", "DeclC"]
    for topic, declared in declared_at_send:
        assert topic in declared, (topic, declared)
    assert declared_at_send[0][1] == ["DeclA", "DeclB"]  # the first settings named DeclA


def test_a_refused_topic_fails_its_send_and_the_producer_recovers(cluster):
    """A topic the proxy refuses in settings ends the stream (ClientActivity.java); the send
    fails naming why, and the producer opens the stream again (with the topics declared so
    far) for its next topic."""
    from rocketmq_spark.client.errors import ProxyError

    cluster.create_topic("StrictAfter", 1)
    with GrpcProducer(cluster.proxy_endpoint, tls=False, topics=["Strict"]) as producer:
        producer.send([Message("Strict", b"first")])
        channel = producer._channel
        with pytest.raises(ProxyError, match="INVALID_ARGUMENT.*cannot access system topic"):
            channel.introduce("TBW102")
        assert producer.send([Message("Strict", b"after")])[0].status == "SEND_OK"
        assert producer.send([Message("StrictAfter", b"next")])[0].status == "SEND_OK"
        assert channel.declared == {"Strict", "StrictAfter"}
