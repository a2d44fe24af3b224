"""The Spark read side of the ``rocketmq`` data source (see :mod:`rocketmq_spark.datasource`).

Modules, one job each: :mod:`.options` (the options), :mod:`.offsets` (offsets as JSON),
:mod:`.offset_reader` (driver-side lookups), :mod:`.planning` (ranges and limits),
:mod:`.stream_reader` and :mod:`.batch_reader` (the Spark readers), :mod:`.partitions` and
:mod:`.partition_reader` (the executor read loop), :mod:`.arrow` and :mod:`.schema` (rows),
:mod:`.lag` (the lag listener). ``membership=group``: :mod:`..client.group.membership` (the group
member), :mod:`..client.group.allocation` (the shares), :mod:`..client.group.joining` (where joining
queues start) and :mod:`..client.group.running_info` (what ``mqadmin consumerProgress`` is told).
Nothing here imports the sink.
"""
