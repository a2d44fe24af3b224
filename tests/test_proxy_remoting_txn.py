"""Transactional sends, END_TRANSACTION and check-backs through the embedded 5.x proxy's
remoting port, driven by the sink's own task code and check-back responder.

The proxy's side follows a genuine 5.1.4 proxy on the wire (captures/rocketmq-5.1.4-proxy-
remoting, observations 6 and 7) and Apache's source at that tag: TransactionActivity.java and
TransactionProcessor.java (END_TRANSACTION answered at once, sent on oneway only when the proxy
kept the transaction, which it does only for check-backs it relayed),
AbstractTransactionService.java / TransactionDataManager.java (data kept 30 s),
ClusterTransactionService.java (producer heartbeats to the brokers) and
ProxyClientRemotingProcessor.java (check-backs passed on to a producer of the group).
"""
from __future__ import annotations


import pyarrow as pa
import pytest
from pyspark.sql.types import StringType, StructField, StructType

from rocketmq_spark.client.nameserver import NameServerClient
from rocketmq_spark.client.remoting import RemotingClient
from rocketmq_spark.client.txn.transaction import (
    CheckResponder, HalfHandle, Outcome, end_transactions_confirmed,
)
from rocketmq_spark.sink.ids import TaskIdentity
from rocketmq_spark.sink.options import parse_sink_options
from rocketmq_spark.sink.responder import _brokers
from rocketmq_spark.sink.schema import plan_columns
from rocketmq_spark.sink.exactly_once_task import (
    half_message_properties as _half_properties, write_halves as write_task,
)
from test_sink_exactly_once import pull_bodies
from waiting import wait_until

SCHEMA = StructType([StructField("body", StringType())])
QUERY = "q-proxy"


def visible(cluster, topic: str) -> int:
    return sum(cluster.max_offset(topic, b.name, q) for b in cluster.brokers for q in range(4))


def send_halves(cluster, topic: str, rows, group: str):
    """One task attempt's half messages through the proxy, by the sink's task code."""
    options = parse_sink_options({"nameServer": cluster.proxy_remoting_addr, "topic": topic,
                                  "deliveryGuarantee": "exactlyOnce", "producerGroup": group})
    batch = pa.RecordBatch.from_arrays([pa.array([str(r) for r in rows])], ["body"])
    return write_task([batch], plan_columns(SCHEMA, topic), options,
                      TaskIdentity("stream", QUERY, 0, 0), group,
                      half_properties=_half_properties(group, QUERY, 0))


@pytest.fixture
def txn_proxied(embedded_cluster_factory):
    """Brokers that check back fast, a proxy that announces producers every 0.2 s and keeps
    transaction data ``expire`` seconds."""
    def make(expire: float = 30.0):
        return embedded_cluster_factory(
            brokers=2, proxy_remoting=True, transaction_check_interval=0.5,
            transaction_timeout=0.5, transaction_check_max=30, proxy_transaction_heartbeat=0.2,
            proxy_transaction_data_expire=expire)
    return make


def test_first_phase_commits_are_dropped_and_check_backs_settle_each_row_once(
        txn_proxied, unique_name):
    """Every END_TRANSACTION COMMIT is answered SUCCESS and reaches no broker (a genuine 5.1.4
    proxy keeps no prepared send over remoting); the brokers' check-backs reach nobody until a
    producer of the group heartbeats at the proxy; then the proxy passes them to the sink's
    responder, and its answers commit each half message once."""
    cluster = txn_proxied()
    topic, group = unique_name("PxCheck"), unique_name("PxCheckGroup")
    cluster.create_topic(topic, 4)
    summary = send_halves(cluster, topic, range(30), group)
    forwarded = cluster.proxy_remoting.forwarded
    with RemotingClient() as remoting:
        handles = [HalfHandle.from_tuple(t) for t in summary.handles]
        applied, unconfirmed = end_transactions_confirmed(remoting, group, handles,
                                                          Outcome.COMMIT, timeout=10)
        assert (applied, unconfirmed) == (30, [])  # "confirmed", and dropped
        names = NameServerClient(cluster.proxy_remoting_addr, remoting)
        assert _brokers(names) == [cluster.proxy_remoting_addr]  # the responder's targets
    assert cluster.proxy_remoting.forwarded == forwarded
    checks = lambda: sum(cluster.transaction_stats(b.name)["checks_sent"]  # noqa: E731
                         for b in cluster.brokers)
    wait_until(lambda: checks() >= 30, 30, "the brokers' first check-backs")
    assert visible(cluster, topic) == 0  # asked through the proxy, which knew no producer
    assert cluster.proxy_remoting.transactions.relayed == 0
    responder = CheckResponder.create(RemotingClient().config, group,
                                      lambda request: Outcome.COMMIT).start()
    try:
        responder.register([cluster.proxy_remoting_addr])
        wait_until(lambda: visible(cluster, topic) == 30, 60, "check-backs through the proxy")
    finally:
        responder.close()
    assert cluster.proxy_remoting.transactions.relayed >= 30
    assert sorted(int(b) for b in pull_bodies(cluster, topic).elements()) == list(range(30))
    assert cluster.pending_transactions("broker-a") == []
    assert cluster.pending_transactions("broker-b") == []
