"""The Spark read side of the ``rocketmq`` data source (see :mod:`rocketmq_spark.datasource`):
what adapts RocketMQ's reads to Spark. The RocketMQ client it drives is :mod:`..client`
(reading in :mod:`..client.read`, the consumer group of ``membership=group`` in
:mod:`..client.group`).

Modules, one job each: :mod:`.options` (the options), :mod:`.connect` (options to clients),
:mod:`.namespacing` (the ``namespace`` option on names), :mod:`.offsets` (offsets as JSON),
:mod:`.offset_reader` (driver-side lookups), :mod:`.planning` (ranges and limits),
:mod:`.pushdown` (Spark's pushed filters as a read plan), :mod:`.filter_check` (the brokers'
SQL92 support, probed on the driver), :mod:`.stream_reader` and :mod:`.batch_reader` (the Spark
readers), :mod:`.partitions` and :mod:`.partition_reader` (the executor read loop),
:mod:`.arrow` and :mod:`.schema` (rows), :mod:`.lag` (the lag listener). Nothing here imports
the sink.
"""
