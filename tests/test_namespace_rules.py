"""The namespace rules (rocketmq_spark/client/namespace.py) against the cases of Apache
RocketMQ's own NamespaceUtilTest (remoting/src/test/.../protocol/NamespaceUtilTest.java),
restated with names of our own, plus the system names of TopicValidator and MixAll."""
from __future__ import annotations

import pytest

from rocketmq_spark.client.namespace import (
    dead_letter_topic, is_system, is_wrapped, namespace_of, namespace_problem, retry_topic,
    unwrap, wrap, wrapped_name_problem,
)

NS, OTHER = "INST_A", "INST_A1"   # OTHER starts like NS: only "NS%" marks a wrapped name


def test_wrap_puts_a_name_into_the_namespace_once():
    assert wrap(NS, "orders") == "INST_A%orders"
    assert wrap(NS, "INST_A%orders") == "INST_A%orders"     # already in it
    assert wrap(NS, "INST_A1%orders") == "INST_A%INST_A1%orders"  # another one's is a name
    assert wrap("", "orders") == "orders" and wrap(NS, "") == ""


def test_retry_and_dead_letter_names_keep_their_prefix_in_front():
    assert wrap(NS, "%RETRY%etl") == "%RETRY%INST_A%etl"
    assert wrap(NS, "%RETRY%INST_A%etl") == "%RETRY%INST_A%etl"
    assert wrap(NS, "%DLQ%etl") == "%DLQ%INST_A%etl"
    assert wrap(NS, "%DLQ%INST_A%etl") == "%DLQ%INST_A%etl"
    assert retry_topic(NS, "etl") == "%RETRY%INST_A%etl" == retry_topic(NS, "INST_A%etl")
    assert dead_letter_topic(NS, "etl") == "%DLQ%INST_A%etl"
    assert retry_topic("", "etl") == "%RETRY%etl"


def test_unwrap_takes_only_its_own_namespace_off():
    assert unwrap("INST_A%orders", NS) == "orders"
    assert unwrap("%RETRY%INST_A%etl", NS) == "%RETRY%etl"
    assert unwrap("%DLQ%INST_A%etl", NS) == "%DLQ%etl"
    assert unwrap("%RETRY%INST_A%etl", OTHER) == "%RETRY%INST_A%etl"
    assert unwrap("INST_A1%orders", NS) == "INST_A1%orders"
    assert unwrap("orders", NS) == "orders"
    assert unwrap("INST_A%orders", "") == "INST_A%orders"
    for name in ("orders", "%RETRY%etl", "%DLQ%etl", "a_b-c|d"):
        assert unwrap(wrap(NS, name), NS) == name


@pytest.mark.parametrize("name", [
    "rmq_sys_topic", "rmq_sys_REVIVE_LOG_x", "TBW102", "SCHEDULE_TOPIC_XXXX",
    "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "RMQ_SYS_TRACE_TOPIC",
    "TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT", "BenchmarkTest",
    "CID_RMQ_SYS_TRANS"])
def test_system_names_are_never_wrapped_nor_unwrapped(name):
    assert is_system(name)
    assert wrap(NS, name) == name
    assert unwrap(name, NS) == name
    assert not is_wrapped(name, NS)
    assert namespace_of(name) == ""


def test_namespace_of_a_name():
    assert namespace_of("orders") == ""
    assert namespace_of("INST_A%orders") == NS
    assert namespace_of("%RETRY%INST_A%etl") == NS
    assert namespace_of("%RETRY%etl") == ""


@pytest.mark.parametrize("namespace, fault", [
    ("a%b", "letters, digits"), ("a b", "letters, digits"), ("ns.1", "letters, digits"),
    ("é", "letters, digits"), ("x" * 126, "longer than 125"),
    ("rmq_sys_ns", "system"), ("CID_RMQ_SYS_ns", "system")])
def test_bad_namespaces_are_refused_with_the_reason(namespace, fault):
    assert fault in namespace_problem(namespace)


def test_good_namespaces():
    for namespace in ("", "ns1", "MQ_INST_123_abc", "a|b-c_d", "x" * 125):
        assert namespace_problem(namespace) is None
    assert wrapped_name_problem("n" * 120 + "%" + "t" * 6) is None
    assert "127" in wrapped_name_problem("n" * 120 + "%" + "t" * 7)
    assert wrapped_name_problem("g" * 255, "group") is None
    assert "255" in wrapped_name_problem("g" * 256, "group")
