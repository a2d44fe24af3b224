"""A busy broker is back-pressure, not a failure: the send pipeline's policy, client level.

Against the embedded broker over real sockets. Busy answers come from its fault injector
(``fail_next``), which answers as the genuine broker's flow control does, so each test knows
exactly which requests were refused; the genuine flow control itself (a full or slow send
queue) is exercised by tests/test_sink_flow_control.py. The refusals are Apache's:

* SYSTEM_BUSY ``[TIMEOUT_CLEAN_QUEUE]`` / ``[PCBUSY_CLEAN_QUEUE]``:
  broker/src/main/java/org/apache/rocketmq/broker/latency/BrokerFastFailure.java;
* SYSTEM_BUSY ``[REJECTREQUEST]`` / ``[OVERLOAD]``:
  remoting/src/main/java/org/apache/rocketmq/remoting/netty/NettyRemotingAbstract.java;
* SYSTEM_ERROR ``[PC_SYNCHRONIZED]``: broker/.../processor/SendMessageProcessor.java
  (``OS_PAGECACHE_BUSY``).
"""
from __future__ import annotations

import logging
import time
from collections import Counter

import pyarrow as pa
import pytest
from pyspark.sql.types import StringType, StructField, StructType

from rocketmq_spark.client import Message, Producer
from rocketmq_spark.client.busy import is_busy
from rocketmq_spark.client.send.backpressure import BusyLog, SendWindow
from rocketmq_spark.client.errors import ProxyError, RequestTimeout, ResponseError
from rocketmq_spark.client.send.producer import queue_for_key
from rocketmq_spark.client.protocol.codes import RequestCode, ResponseCode
from rocketmq_spark.client.remoting import RemotingClient
from rocketmq_spark.client.send.pipeline import BrokerStayedBusy, Outgoing, SendFailed
from rocketmq_spark.client.txn.transaction import (
    END_TRANSACTION, HalfHandle, Outcome, end_transactions, end_transactions_confirmed,
)
from rocketmq_spark.sink.ids import TaskIdentity, message_id
from rocketmq_spark.sink.options import parse_sink_options
from rocketmq_spark.sink.schema import plan_columns
from rocketmq_spark.sink.exactly_once_task import (
    half_message_properties as _half_properties, write_halves as write_task,
)
from rocketmq_spark.sink.task import SinkWriteError

from broker_store import stored_messages
from waiting import wait_until

TIMEOUT_CLEAN_QUEUE = ("[TIMEOUT_CLEAN_QUEUE]broker busy, start flow control for a while, "
                       "period in queue: 201ms, size of queue: 3071")
BUSY_ANSWERS = [
    (ResponseCode.SYSTEM_BUSY, TIMEOUT_CLEAN_QUEUE),
    (ResponseCode.SYSTEM_BUSY, "[PCBUSY_CLEAN_QUEUE]broker busy, start flow control for a "
                               "while, period in queue: 12ms, size of queue: 40"),
    (ResponseCode.SYSTEM_BUSY, "[REJECTREQUEST]system busy, start flow control for a while"),
    (ResponseCode.SYSTEM_BUSY, "[OVERLOAD]system busy, start flow control for a while"),
    (ResponseCode.SYSTEM_ERROR, "[PC_SYNCHRONIZED]broker busy, start flow control for a while"),
]
SEND_CODES = [RequestCode.SEND_BATCH_MESSAGE, RequestCode.SEND_MESSAGE_V2]


@pytest.fixture
def one_broker(embedded_cluster_factory):
    """A broker of its own: nowhere else to send, so every busy answer must be waited out."""
    return embedded_cluster_factory(brokers=1)


def batches(producer, topic, n, size=100):
    messages = [Message(topic, b"m%d" % i) for i in range(n)]
    return [Outgoing(topic, producer.encode_batch(messages[i:i + size]), len(messages[i:i + size]))
            for i in range(0, n, size)]


# ---------------------------------------------------------------------- what is busy


@pytest.mark.parametrize("code, remark", BUSY_ANSWERS, ids=[r[1][:20] for r in BUSY_ANSWERS])
def test_busy_answers_are_no_attempts_and_every_message_is_stored_once(one_broker, unique_name,
                                                                      code, remark):
    """retries=0: a busy answer that counted as an attempt would fail the send."""
    topic = unique_name("Busy")
    one_broker.create_topic(topic, 4)
    one_broker.fail_next(6, code, remark, request_codes=SEND_CODES)
    with Producer(one_broker.namesrv_addr, retries=0) as producer:
        pipeline = producer.pipeline()
        for item in batches(producer, topic, 2000):
            pipeline.submit(item)
        stats = pipeline.flush()
    assert (stats.messages, stats.retries, stats.busy) == (2000, 0, 6)
    assert stats.busy_by_broker == {"broker-a": 6}
    bodies = Counter(m.body for _, m in stored_messages(one_broker, topic))
    assert bodies == Counter(b"m%d" % i for i in range(2000)), "each exactly once"


def test_other_system_errors_are_attempts_not_busy(one_broker, unique_name):
    topic = unique_name("Fault")
    one_broker.create_topic(topic, 4)
    one_broker.fail_next(2, ResponseCode.SYSTEM_ERROR, "UNKNOWN_ERROR", request_codes=SEND_CODES)
    with Producer(one_broker.namesrv_addr, retries=2) as producer:
        pipeline = producer.pipeline()
        for item in batches(producer, topic, 300):
            pipeline.submit(item)
        assert (pipeline.flush().retries, pipeline.stats.busy) == (2, 0)
    one_broker.fail_next(1, ResponseCode.SYSTEM_ERROR, "UNKNOWN_ERROR", request_codes=SEND_CODES)
    with Producer(one_broker.namesrv_addr, retries=0) as producer:
        pipeline = producer.pipeline()
        pipeline.submit(batches(producer, topic, 10)[0])
        with pytest.raises(SendFailed, match="after 1 attempt.*UNKNOWN_ERROR") as info:
            pipeline.flush()
    assert not isinstance(info.value, BrokerStayedBusy)


def test_what_is_busy_and_what_is_not():
    for code, remark in BUSY_ANSWERS:
        assert is_busy(ResponseError(code, remark, "SEND_MESSAGE", "h:1"))
    assert is_busy(ResponseError(ResponseCode.FLOW_CONTROL, "", "SEND_MESSAGE"))
    assert not is_busy(ResponseError(ResponseCode.SYSTEM_ERROR, "UNKNOWN_ERROR"))
    assert not is_busy(ResponseError(ResponseCode.SERVICE_NOT_AVAILABLE, "disk full"))
    assert not is_busy(RequestTimeout("h:1", "SEND_MESSAGE", 1.0))
    # through a 5.x proxy (client/grpc/status.py marks which are transient)
    assert is_busy(ProxyError(42900, "TOO_MANY_REQUESTS", "", "SendMessage", "p", True))
    assert is_busy(ProxyError(0, "RESOURCE_EXHAUSTED", "", "SendMessage", "p", True))
    assert not is_busy(ProxyError(0, "RESOURCE_EXHAUSTED", "larger than max", "SendMessage",
                                  "p", False))
    assert not is_busy(ProxyError(50001, "INTERNAL_SERVER_ERROR", "", "SendMessage", "p", True))


# ---------------------------------------------------------------------- the policy


def test_the_window_halves_once_per_round_and_grows_back():
    window = SendWindow(8, rng=lambda: 1.0)
    epoch = window.epoch
    window.on_busy(epoch, 100.0)
    assert window.size == 4 and window.wait(100.0) == pytest.approx(0.02)
    window.on_busy(epoch, 100.0)  # a request of the same round: no second cut
    assert window.size == 4
    for _ in range(4):
        window.on_busy(window.epoch, 100.0)
    assert window.size == 1, "never below one request"
    assert window.wait(100.0) == pytest.approx(0.32), "20 ms doubled per round (no jitter)"
    for _ in range(20):
        window.on_busy(window.epoch, 200.0)
    assert window.wait(200.0) == pytest.approx(1.0), "capped"
    low = SendWindow(8, rng=lambda: 0.0)
    low.on_busy(low.epoch, 0.0)
    assert low.wait(0.0) == pytest.approx(0.01), "jitter keeps at least half the step"
    for _ in range(200):
        window.on_success(window.epoch)
    assert window.size == 8 and window.limit == 8.0, "grows back, never past the maximum"
    window.on_busy(window.epoch, 300.0)
    assert window.wait(300.0) == pytest.approx(0.02), "a success reset the backoff"
    window.on_success(window.epoch, 1, took=0.004)
    window.on_busy(window.epoch, 400.0)
    assert window.wait(400.0) == pytest.approx(0.004), "a fast broker: a step of its time"


def test_busy_waiting_does_not_use_up_the_send_timeout(one_broker, unique_name):
    """Eight busy rounds back off 0.01 + 0.02 + ... >= 1.2 s in all: far past a 0.3 s send
    timeout, which still holds for the real attempt (answered after 0.15 s)."""
    topic = unique_name("Deadline")
    one_broker.create_topic(topic, 1)
    one_broker.fail_next(8, ResponseCode.SYSTEM_BUSY, TIMEOUT_CLEAN_QUEUE,
                         request_codes=SEND_CODES)
    one_broker.delay_next(1, 0.15, request_codes=SEND_CODES)
    with Producer(one_broker.namesrv_addr, retries=0, send_timeout=0.3,
                  max_in_flight_per_broker=1) as producer:
        started = time.monotonic()
        pipeline = producer.pipeline()
        pipeline.submit(batches(producer, topic, 10)[0])
        stats = pipeline.flush()
        assert time.monotonic() - started > 1.2
        assert (stats.messages, stats.busy, stats.retries) == (10, 8, 0)
        one_broker.fail_next(5, ResponseCode.SYSTEM_BUSY, TIMEOUT_CLEAN_QUEUE,
                             request_codes=SEND_CODES)
        result = producer.send(Message(topic, b"single"))  # the one-message path too
    assert result.status == "SEND_OK"
    assert producer.busy_log.total == 13


def test_a_broker_that_stays_busy_fails_after_the_budget_with_a_clear_error(one_broker,
                                                                           unique_name):
    topic = unique_name("StaysBusy")
    one_broker.create_topic(topic, 4)
    one_broker.fail_next(10**6, ResponseCode.SYSTEM_BUSY, TIMEOUT_CLEAN_QUEUE,
                         request_codes=SEND_CODES)
    with Producer(one_broker.namesrv_addr, busy_timeout=0.8) as producer:
        pipeline = producer.pipeline(busy_timeout_name="theBudgetOption")
        started = time.monotonic()
        with pytest.raises(BrokerStayedBusy) as info:
            for item in batches(producer, topic, 1000):
                pipeline.submit(item)
            pipeline.flush()
        assert time.monotonic() - started >= 0.8
    one_broker.clear_faults()
    error = info.value
    text = str(error)
    address = one_broker.brokers[0].addr
    assert f"broker broker-a ({address}) answered busy for " in text
    assert error.busy_for >= 0.8 and error.answers >= 5
    assert f"{error.answers} busy answer(s)" in text
    assert "[TIMEOUT_CLEAN_QUEUE]broker busy" in text
    assert "Raise theBudgetOption (now 800 ms)" in text
    assert error.attempts == 0, "busy answers are not attempts"


def test_busy_answers_are_logged_once_a_minute_per_producer(one_broker, unique_name, caplog):
    topic = unique_name("Logged")
    one_broker.create_topic(topic, 4)
    caplog.set_level(logging.WARNING, logger="rocketmq_spark.client.send.backpressure")
    with Producer(one_broker.namesrv_addr) as producer:
        for remark in ("[OVERLOAD]first", "[TIMEOUT_CLEAN_QUEUE]second"):
            one_broker.fail_next(6, ResponseCode.SYSTEM_BUSY, remark, request_codes=SEND_CODES)
            pipeline = producer.pipeline()  # a new pipeline, the same producer
            for item in batches(producer, topic, 2000):
                pipeline.submit(item)
            assert pipeline.flush().busy == 6
        assert producer.busy_log.total == 12
    lines = [r.getMessage() for r in caplog.records
             if r.name == "rocketmq_spark.client.send.backpressure"]
    assert len(lines) == 1, lines
    assert "answered busy 1 time(s)" in lines[0] and "[OVERLOAD]first" in lines[0]
    later = BusyLog(interval=60.0)
    caplog.clear()
    busy = ResponseError(ResponseCode.SYSTEM_BUSY, "[OVERLOAD]x", "SEND_MESSAGE", "h:1")
    for second in range(0, 130):
        later.note("broker-a", busy, now=1000.0 + second)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, "at 0 s, 60 s and 120 s"
    assert "answered busy 60 time(s) in the last 60 s" in lines[1]


# ---------------------------------------------------------------------- order and runs


def test_a_fixed_queue_keeps_submission_order_through_busy_answers(one_broker, unique_name):
    """One sharding key, 150 requests to its queue; now and then one is answered busy while
    the next ones would be stored: the refused one is sent again before any later one of its
    queue, so the queue holds the messages in submission order."""
    topic = unique_name("KeyedBusy")
    one_broker.create_topic(topic, 4)
    for _ in range(6):
        one_broker.delay_next(7, 0.0, request_codes=SEND_CODES)
        one_broker.fail_next(2, ResponseCode.SYSTEM_BUSY, TIMEOUT_CLEAN_QUEUE,
                             request_codes=SEND_CODES)
    with Producer(one_broker.namesrv_addr, retries=0) as producer:
        queue = queue_for_key(producer.queues(topic), "the-key")
        producer.send_many([Message(topic, b"%d" % i, sharding_key="the-key")
                            for i in range(1500)], batch_size=10)
    one_broker.clear_faults()
    placed = [(qid, int(m.body)) for qid, m in stored_messages(one_broker, topic)]
    assert {q for q, _ in placed} == {queue.queue_id}
    assert [n for _, n in placed] == list(range(1500))
    assert producer.busy_log.total == 12


SCHEMA = StructType([StructField("body", StringType())])
KEYED = StructType([StructField("body", StringType()), StructField("shardingKey", StringType())])


def half_task(cluster, topic, rows, group, *, keyed=False, **options):
    """One exactly-once task attempt's half messages, through the sink's task code."""
    opts = parse_sink_options({"nameServer": cluster.namesrv_addr, "topic": topic,
                               "deliveryGuarantee": "exactlyOnce", "producerGroup": group,
                               **options})
    columns = [pa.array([str(r) for r in rows])]
    if keyed:
        columns.append(pa.array(["one-key"] * len(rows)))
    batch = pa.RecordBatch.from_arrays(columns, ["body", "shardingKey"][:len(columns)])
    identity = TaskIdentity("stream", "q-busy", 0, 0)
    summary = write_task([batch], plan_columns(KEYED if keyed else SCHEMA, topic), opts,
                         identity, group, half_properties=_half_properties(group, "q-busy", 0))
    return summary, identity


def refuse_the_middle(cluster, first_stored: int, refused: int) -> None:
    """The next ``first_stored`` half sends are stored (after a moment's wait, so the busy
    answers after them overtake their successes, as on a genuine broker), the ``refused``
    after them answered busy; the rest stored."""
    cluster.delay_next(first_stored, 0.02, request_codes=[RequestCode.SEND_MESSAGE_V2])
    cluster.fail_next(refused, ResponseCode.SYSTEM_BUSY, TIMEOUT_CLEAN_QUEUE,
                      request_codes=[RequestCode.SEND_MESSAGE_V2])


def committed_in_order(cluster, topic, summary, group):
    handles = [HalfHandle.from_tuple(t) for t in summary.handles]
    with RemotingClient() as remoting:
        end_transactions(remoting, group, handles, Outcome.COMMIT)
    wait_until(lambda: len(stored_messages(cluster, topic)) >= len(handles), 10,
               "the committed rows")
    return stored_messages(cluster, topic)


def test_a_run_refused_in_part_sends_exactly_the_refused_halves_again(one_broker, unique_name):
    """A run of 512 single sends, 150 of them (in the middle) answered busy: the 362 stored
    stay, exactly the 150 refused are sent again. The broker then holds one pending half per
    row (nothing rolled back, nothing twice), and each row is delivered once."""
    topic = unique_name("EoPart")
    one_broker.create_topic(topic, 4)
    refuse_the_middle(one_broker, 100, 150)
    summary, identity = half_task(one_broker, topic, range(1000), "eo-part", retries="0")
    assert (summary.busy, summary.retries, len(summary.handles)) == (150, 0, 1000)
    assert summary.busy_by_broker == {"broker-a": 150}
    ids = [h[2] for h in summary.handles]
    assert sorted(ids) == sorted(message_id(identity, r) for r in range(1000))
    assert len(one_broker.pending_transactions("broker-a")) == 1000
    rows = committed_in_order(one_broker, topic, summary, "eo-part")
    assert Counter(m.body for _, m in rows) == Counter(b"%d" % i for i in range(1000))


def test_a_fixed_queue_run_refused_in_part_keeps_row_order(one_broker, unique_name):
    """Rows of one sharding key: runs to one queue, the first refused in its middle. The
    refused halves are stored after the later ones of their run, but the task reports the
    handles in row order, so END_TRANSACTIONs store the rows in order."""
    topic = unique_name("EoKeyed")
    one_broker.create_topic(topic, 4)
    refuse_the_middle(one_broker, 200, 100)
    summary, identity = half_task(one_broker, topic, range(1200), "eo-keyed", keyed=True)
    assert (summary.busy, len(summary.handles)) == (100, 1200)
    assert [h[2] for h in summary.handles] == [message_id(identity, r) for r in range(1200)]
    offsets = [h[3] for h in summary.handles]
    assert offsets != sorted(offsets), "the refused ones were stored after their run"
    rows = committed_in_order(one_broker, topic, summary, "eo-keyed")
    assert len({q for q, _ in rows}) == 1
    assert [int(m.body) for _, m in rows] == list(range(1200))


def test_an_exactly_once_task_whose_broker_stays_busy_rolls_back_what_it_stored(
        one_broker, unique_name):
    """700 halves stored (one run refused in part among them), then nothing but busy answers:
    past the budget the task fails naming the option, and every half it stored, including
    those of the run still waiting to be completed, is rolled back."""
    topic = unique_name("EoStaysBusy")
    one_broker.create_topic(topic, 4)
    one_broker.delay_next(700, 0.0, request_codes=[RequestCode.SEND_MESSAGE_V2])
    one_broker.fail_next(10**6, ResponseCode.SYSTEM_BUSY, TIMEOUT_CLEAN_QUEUE,
                         request_codes=[RequestCode.SEND_MESSAGE_V2])
    with pytest.raises(SinkWriteError) as info:
        half_task(one_broker, topic, range(3000), "eo-stays", brokerBusyTimeoutMs="700")
    one_broker.clear_faults()
    text = str(info.value)
    assert "answered busy for" in text and "Raise brokerBusyTimeoutMs (now 700 ms)" in text
    assert "rolled back" in text
    assert isinstance(info.value.__cause__, BrokerStayedBusy)
    wait_until(lambda: not one_broker.pending_transactions("broker-a"), 10,
               "every stored half rolled back")
    assert one_broker.transaction_stats("broker-a")["checks_sent"] == 0
    assert stored_messages(one_broker, topic) == []


def test_confirmed_rollbacks_send_again_what_a_busy_broker_refused(one_broker, unique_name):
    """A failing task rolls its halves back with END_TRANSACTIONs the broker answers; those
    answered busy were not applied (RequestTask.returnResponse drops the request) and are
    sent again."""
    topic = unique_name("EoRollback")
    one_broker.create_topic(topic, 4)
    summary, _ = half_task(one_broker, topic, range(300), "eo-rb")
    handles = [HalfHandle.from_tuple(t) for t in summary.handles]
    one_broker.fail_next(50, ResponseCode.SYSTEM_BUSY, TIMEOUT_CLEAN_QUEUE,
                         request_codes=[END_TRANSACTION])
    with RemotingClient() as remoting:
        applied, missed = end_transactions_confirmed(remoting, "eo-rb", handles,
                                                     Outcome.ROLLBACK, 10.0)
    assert (applied, missed) == (300, [])
    assert not one_broker.pending_transactions("broker-a")
    assert one_broker.flow_control_stats()["busy"] == 0, "the 50 came from the fault rule"
    assert stored_messages(one_broker, topic) == []
