"""Settings of an embedded cluster, parsed and checked once."""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from typing import List

from ..client.protocol.codes import SERVER_VERSION

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"

SEARCH_MODES = ("lower", "nearest")
# the Apache releases whose formats and checks the embedded server can follow (see ServerOptions)
RELEASES = ("4.9", "5.1")
# MQVersion.Version ordinals a broker of each release puts in its answers' headers
RELEASE_VERSIONS = {"4.9": SERVER_VERSION, "5.1": 441}
# the request queues' sizes and waits (see ServerOptions and .flow_control)
QUEUE_OPTIONS = ("send_queue_capacity", "wait_ms_in_send_queue", "pull_queue_capacity",
                 "wait_ms_in_pull_queue", "heartbeat_queue_capacity",
                 "wait_ms_in_heartbeat_queue", "transaction_queue_capacity",
                 "wait_ms_in_transaction_queue")
_DELAY_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_delay_levels(text: str) -> List[float]:
    """``"1s 5s 10s 30s 1m ..."`` to seconds per level (level 1 first). ``ms`` is accepted
    too, so tests can use short delays."""
    levels = []
    for item in text.split():
        unit = "ms" if item.endswith("ms") else item[-1:]
        number = item[:-len(unit)]
        if unit not in _DELAY_UNITS or not number.replace(".", "", 1).isdigit():
            raise ValueError(f"delay level {item!r} is not a number followed by ms, s, m, h "
                             "or d")
        levels.append(float(number) * _DELAY_UNITS[unit])
    if not levels:
        raise ValueError("the delay level table is empty")
    return levels


@dataclass(frozen=True)
class ServerOptions:
    """Broker behaviour knobs; the defaults are a default-configured 4.9.8 broker's.

    * ``auto_create_topics``: a first send to an unknown topic creates it from TBW102 (as
      ``autoCreateTopicEnable=true``). TBW102 has ``default_topic_queue_nums`` queues (the
      genuine capture's broker shows 4) and perm 7.
    * ``max_transfer_count`` / ``max_transfer_bytes``: per-pull caps (32 messages / 256 KiB).
    * ``search_by_time``: SEARCH_OFFSET_BY_TIMESTAMP semantics when the request has no
      ``boundaryType``: "lower" (5.1.1+, the first offset stored at or after the time) or
      "nearest" (4.x).
    * ``suggest_broker_id``: when not 0, the ``suggestWhichBrokerId`` of every pull answer,
      whatever the rules below say (a test forcing a client to a slave). At 0 the answer
      follows 4.9.8's PullMessageProcessor: 0 unless ``slave_read_enable``; with it, 1
      (whichBrokerWhenConsumeSlowly) when the pull is further behind the commit log's end
      than ``access_message_in_memory_max_ratio`` percent of ``memory_bytes``, else 0.
    * ``slave_read_enable`` (slaveReadEnable, off), ``access_message_in_memory_max_ratio``
      (accessMessageInMemoryMaxRatio, 40) and ``memory_bytes`` (the physical memory the
      ratio is taken of; 0, the default, means this machine's, as 4.9.8's
      StoreUtil.TOTAL_PHYSICAL_MEMORY_SIZE; tests give a small number to make a lag count).
    * ``slave_sync_interval``: how often a slave copies its master's topic configs and
      consumer and delay offsets (SlaveSynchronize, every 10 s after a first run at 3 s).
    * ``replication_interval``: how often a slave copies what its master stored since the
      last round (HA's asynchronous transfer; the slave lags by up to about this long).
    * ``channel_expiry_seconds``: consumers/producers that stop heartbeating are dropped (and
      their connection closed) after this long.
    * ``rebalance_lock_max_live_seconds``: a queue lock (LOCK_BATCH_MQ) not renewed for this
      long may be taken by another client (the genuine broker's
      ``rocketmq.broker.rebalance.lockMaxLiveTime``, 60 s). Locks outlive connections.
    * ``transaction_check_interval`` / ``transaction_timeout`` / ``transaction_check_max``:
      the check service of half messages runs every interval seconds (transactionCheckInterval,
      60 s), checks back half messages older than the timeout (transactionTimeOut, 6 s) and
      discards one after that many checks (transactionCheckMax, 15).
    * ``send_queue_capacity`` / ``pull_queue_capacity`` / ``heartbeat_queue_capacity`` /
      ``transaction_queue_capacity``: how many requests the send, pull, heartbeat and
      END_TRANSACTION executors' queues hold (sendThreadPoolQueueCapacity 10,000,
      pullThreadPoolQueueCapacity 100,000, heartbeatThreadPoolQueueCapacity 50,000,
      endTransactionPoolQueueCapacity 100,000); a request beyond is answered SYSTEM_BUSY
      ``[OVERLOAD]`` (:mod:`.flow_control`).
    * ``wait_ms_in_send_queue`` / ``wait_ms_in_pull_queue`` / ``wait_ms_in_heartbeat_queue`` /
      ``wait_ms_in_transaction_queue``: a request queued that long is answered SYSTEM_BUSY
      ``[TIMEOUT_CLEAN_QUEUE]`` instead of being processed (waitTimeMillsInSendQueue 200,
      waitTimeMillsInPullQueue 5,000, waitTimeMillsInHeartbeatQueue 31,000,
      waitTimeMillsInTransactionQueue 3,000), unless ``broker_fast_failure`` is off
      (brokerFastFailureEnable).
    * ``enable_property_filter``: serve pulls whose subscription is an SQL92 expression over
      message properties (enablePropertyFilter, off by default as on a genuine broker, which
      then refuses them with SYSTEM_ERROR; :mod:`.property_filter`).
    * ``auto_create_subscription_group`` / ``retry_max_times``: a consumer group the broker
      has not seen is created on first use (autoCreateSubscriptionGroup) with this
      ``retryMaxTimes`` (16): a message sent back more often goes to ``%DLQ%<group>``
      (:mod:`.send_back`); tests lower it.
    * ``release``: which Apache release the brokers behave as, "4.9" (4.9.8, the default) or
      "5.1" (5.1.4): op-topic bodies as comma-joined offset lists, topic message types
      (``+message.type``) published and checked, answers carrying 5.1.4's version. Handlers
      ask :meth:`at_least` (``options.at_least("5.1")``), never compare strings.
    * ``transaction_op_batch_interval`` / ``transaction_op_msg_max_size``: under release 5.1,
      how long an ended half message's op entry may wait in memory and how many bytes of
      entries make an op message (transactionOpBatchInterval 3,000 ms,
      transactionOpMsgMaxSize 4,096; :mod:`.op_batches`).
    * ``version``: the MQVersion ordinal in the answers' headers; by default the release's
      (409 for 4.9.8, 441 for 5.1.4).
    """

    cluster_name: str = "DefaultCluster"
    auto_create_topics: bool = True
    default_topic_queue_nums: int = 4
    max_transfer_count: int = 32
    max_transfer_bytes: int = 256 * 1024
    max_message_size: int = 4 * 1024 * 1024
    message_delay_level: str = DEFAULT_DELAY_LEVELS  # messageDelayLevel; tests shorten it
    search_by_time: str = "lower"
    channel_expiry_seconds: float = 120.0
    rebalance_lock_max_live_seconds: float = 60.0
    housekeeping_interval: float = 10.0
    flush_interval: float = 1.0
    region: str = "DefaultRegion"
    trace_on: bool = True
    suggest_broker_id: int = 0
    slave_read_enable: bool = False
    access_message_in_memory_max_ratio: int = 40
    memory_bytes: int = 0
    slave_sync_interval: float = 10.0
    replication_interval: float = 0.01
    transaction_check_interval: float = 60.0
    transaction_timeout: float = 6.0
    transaction_check_max: int = 15
    broker_fast_failure: bool = True
    enable_property_filter: bool = False
    auto_create_subscription_group: bool = True
    retry_max_times: int = 16
    send_queue_capacity: int = 10_000
    wait_ms_in_send_queue: int = 200
    pull_queue_capacity: int = 100_000
    wait_ms_in_pull_queue: int = 5_000
    heartbeat_queue_capacity: int = 50_000
    wait_ms_in_heartbeat_queue: int = 31_000
    transaction_queue_capacity: int = 100_000
    wait_ms_in_transaction_queue: int = 3_000
    release: str = "4.9"
    transaction_op_batch_interval: float = 3.0
    transaction_op_msg_max_size: int = 4096
    version: int = 0  # 0: the release's own (RELEASE_VERSIONS)

    def __post_init__(self):
        if self.release not in RELEASES:
            raise ValueError(f"release must be one of {RELEASES}, got {self.release!r}")
        if not self.version:
            object.__setattr__(self, "version", RELEASE_VERSIONS[self.release])
        if self.search_by_time not in SEARCH_MODES:
            raise ValueError(f"search_by_time must be one of {SEARCH_MODES}, "
                             f"got {self.search_by_time!r}")
        for name in ("default_topic_queue_nums", "max_transfer_count", "max_transfer_bytes",
                     "max_message_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if (self.channel_expiry_seconds <= 0 or self.housekeeping_interval <= 0
                or self.rebalance_lock_max_live_seconds <= 0):
            raise ValueError("channel_expiry_seconds, housekeeping_interval and "
                             "rebalance_lock_max_live_seconds must be positive")
        if self.transaction_check_interval <= 0 or self.transaction_timeout < 0:
            raise ValueError("transaction_check_interval must be positive and "
                             "transaction_timeout not negative, got "
                             f"{self.transaction_check_interval} and {self.transaction_timeout}")
        if self.transaction_check_max < 1:
            raise ValueError(f"transaction_check_max must be at least 1, got "
                             f"{self.transaction_check_max}")
        if self.transaction_op_batch_interval <= 0 or self.transaction_op_msg_max_size < 1:
            raise ValueError("transaction_op_batch_interval must be positive and "
                             "transaction_op_msg_max_size at least 1, got "
                             f"{self.transaction_op_batch_interval} and "
                             f"{self.transaction_op_msg_max_size}")
        parse_delay_levels(self.message_delay_level)  # a bad table fails here, not on a send
        for name in QUEUE_OPTIONS:
            value = getattr(self, name)
            least = 1 if name.endswith("capacity") else 0
            if value.__class__ is not int or value < least:
                raise ValueError(f"{name} must be a whole number of at least {least}"
                                 f"{' ms' if least == 0 else ''}, got {value!r}")
        if self.retry_max_times.__class__ is not int or self.retry_max_times < 0:
            raise ValueError(f"retry_max_times must be a whole number of at least 0, got "
                             f"{self.retry_max_times!r}")
        for name in ("broker_fast_failure", "enable_property_filter",
                     "auto_create_subscription_group"):
            if getattr(self, name).__class__ is not bool:
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")

    def at_least(self, release: str) -> bool:
        """Whether the brokers behave as ``release`` or a later one (``at_least("5.1")``)."""
        if release not in RELEASES:
            raise ValueError(f"unknown release {release!r}; known: {RELEASES}")
        return RELEASES.index(self.release) >= RELEASES.index(release)

    @cached_property
    def memory_threshold(self) -> int:
        """Bytes a pull may lag behind the commit log's end before a master with
        ``slave_read_enable`` sends the consumer to a slave."""
        memory = self.memory_bytes or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return int(memory * (self.access_message_in_memory_max_ratio / 100.0))

    @cached_property
    def delay_levels(self) -> List[float]:
        """``message_delay_level`` in seconds per level, level 1 first."""
        return parse_delay_levels(self.message_delay_level)
