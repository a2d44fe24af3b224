"""The Spark write side: ``df.write`` / ``writeStream`` with ``format("rocketmq")``: what adapts
RocketMQ's sends to Spark. The RocketMQ client it drives is :mod:`..client` (sending in
:mod:`..client.send`, transactions and the op topic in :mod:`..client.txn`, CONSUMER_SEND_MSG_BACK
in :mod:`..client.group.send_back`); no frame or request code is built here.

Modules, one job each: :mod:`.options` (the options), :mod:`.schema` (the input columns,
checked on the driver), :mod:`.rows` (one Arrow batch checked and normalized), :mod:`.ids`
(message ids a replay reproduces), :mod:`.requests` (rows into requests per topic and queue),
:mod:`.delivery` (the guarantee, one type each: at least once, exactly once, ``sendBack``),
:mod:`.transport` (the seam to a protocol) with :mod:`.remoting_transport` and
:mod:`.grpc_transport`, :mod:`.task` (one task's sends) and :mod:`.writer` (the Spark writer
classes). Exactly once: :mod:`.exactly_once_task` (a task's half messages),
:mod:`.exactly_once` (the driver's commit and its test seam,
:class:`.exactly_once.CommitObserver`), :mod:`.commit_record` (the record under the
checkpoint), :mod:`.batch_time` (a micro-batch's time, as Spark keeps it), :mod:`.check_back`
(answers to the brokers' check-backs) and :mod:`.responder` (the process that gives them);
through a 5.x proxy, :mod:`.proxy_guard` and :mod:`.proxy_settle`. Guards on the driver:
:mod:`.topic_type_guard`. ``sendBack``: :mod:`.send_back` with its columns, options and Java's
fallback to the retry topic. Nothing here imports the source.
"""
