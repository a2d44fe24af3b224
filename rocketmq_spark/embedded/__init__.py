"""An embedded RocketMQ-compatible server (one name server, N brokers) for tests and benchmarks.

It speaks the genuine remoting protocol over real sockets, with a 4.9.8 broker's personality
(version 409, language JAVA, the genuine codes, remarks and header shapes), so Apache's clients
and ours work against it as against a genuine broker::

    from rocketmq_spark.embedded import EmbeddedCluster

    with EmbeddedCluster(brokers=2) as cluster:
        cluster.create_topic("T", queues=4)
        ...  # point a client at cluster.namesrv_addr

Also ``python -m rocketmq_spark.embedded --brokers 2 --data-dir DIR`` and the pytest fixtures of
:mod:`rocketmq_spark.embedded.pytest_plugin`.

Choices worth knowing:

* Messages are kept per queue in their stored (pull-body) form, back to back, so a pull is one
  slice; the records are built with the client's codec (``encode_stored_message``).
* SEARCH_OFFSET_BY_TIMESTAMP answers with 5.1.1+ "lower" semantics by default (the first offset
  stored at or after the time; the max offset when every message is older); ``boundaryType``
  UPPER is honoured, and ``search_by_time="nearest"`` gives 4.x behaviour.
* Persistence (``data_dir``): per broker an append-only ``commitlog`` of stored records (its
  positions are the physical offsets; replaying it rebuilds the queues) and ``config.json``
  (topics, consumer offsets, queue min offsets, last port), plus ``namesrv.json`` (its port).
* TLS uses a throwaway test certificate made with ``trustme`` (the ``embedded`` extra) unless
  one is given; ``permissive`` mode serves plain and TLS on one port, as genuine brokers do by
  default.
* Delay levels and transactional (half) messages with their check-back are served as a 4.9.8
  broker serves them; SQL92 filters, slaves and retry/DLQ delivery are not simulated.
"""
from .cluster import BrokerHandle, EmbeddedCluster
from .options import ServerOptions
from .tls import self_signed_cert

__all__ = ["BrokerHandle", "EmbeddedCluster", "ServerOptions", "self_signed_cert"]
