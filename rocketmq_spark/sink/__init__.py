"""The Spark write side: ``df.write`` / ``writeStream`` with ``format("rocketmq")``.

Modules, one job each: :mod:`.options` (the options), :mod:`.schema` (the input columns,
checked on the driver), :mod:`.rows` (one Arrow batch checked and normalized), :mod:`.ids`
(message ids a replay reproduces), :mod:`.transport` (remoting or gRPC), :mod:`.requests`
(rows into requests per topic and queue), :mod:`.task` (one task's sends) and :mod:`.writer`
(the Spark writer classes). Exactly once: :mod:`.exactly_once` (the driver's commit and its
test seam, :class:`.exactly_once.CommitObserver`), :mod:`.commit_record` (the record under
the checkpoint), :mod:`..client.txn.op_topic` (what END_TRANSACTIONs reached the brokers),
:mod:`.check_back` (answers to the brokers' check-backs) and :mod:`.responder` (the process
that gives them). Nothing here imports the source.
"""
