"""Names vulture (ci/lint.sh) cannot see used: Spark, Python, pytest, gRPC or our C call them.

vulture matches by name, so each line below keeps every definition of that name. Add a name
here only when something outside Python's static view calls it; delete dead code instead.
"""
from vulture.whitelist_utils import Whitelist

# PySpark's Python Data Source API calls these on the DataSource and its stream reader.
spark = Whitelist()
spark.streamReader
spark.streamWriter
spark.initialOffset
spark.getDefaultReadLimit
spark.prepareForTriggerAvailableNow
spark.reportLatestOffset
spark.partitions
spark.abort  # the writers' abort: Spark calls it when a write fails

# pyspark.sql.streaming.StreamingQueryListener callbacks (RocketMQLagListener).
listener = Whitelist()
listener.onQueryStarted
listener.onQueryProgress
listener.onQueryIdle
listener.onQueryTerminated

# LagReport's fields are read by users and by on_report callbacks, not by the package.
report = Whitelist()
report.run_id
report.num_input_rows

# Module-level __getattr__ / __dir__ (PEP 562): the lazy exports of the package and its client.
module = Whitelist()
module.__getattr__
module.__dir__

# asyncio.Protocol callbacks of the embedded remoting server.
protocol = Whitelist()
protocol.connection_made
protocol.data_received
protocol.connection_lost

# gRPC servicer methods of the embedded 5.x proxy (grpcio calls them by RPC name), and the
# protobuf fields it sets on its answers.
servicer = Whitelist()
servicer.QueryRoute
servicer.QueryAssignment
servicer.SendMessage
servicer.ReceiveMessage
servicer.AckMessage
servicer.ChangeInvisibleDuration
servicer.validate_message_type
servicer.max_attempts
servicer.receive_batch_size
servicer.multiplier

# Called from C: native/embedded/rmq_tx_store.c looks ConsumeQueue.extend_timed up by name.
store = Whitelist()
store.extend_timed

# Wire constants: RocketMQ's request and response codes (IntEnum members name codes met on
# the wire, in errors and logs), and the flag bits of a pull, a permission and a stored
# message, kept whole so each bit layout reads as RocketMQ defines it.
codes = Whitelist()
codes.REGISTER_BROKER
codes.RESET_CONSUMER_CLIENT_OFFSET
codes.GET_CONSUMER_STATUS_FROM_CLIENT
codes.CONSUME_MESSAGE_DIRECTLY
codes.LITE_PULL_MESSAGE
codes.VERSION_NOT_SUPPORTED
codes.TOPIC_EXIST_ALREADY
codes.SUBSCRIPTION_PARSE_FAILED
codes.SUBSCRIPTION_GROUP_NOT_EXIST
codes.FILTER_DATA_NOT_EXIST
codes.FILTER_DATA_NOT_LATEST
codes.INVALID_PARAMETER
codes.NO_MESSAGE
codes.NOT_LEADER_FOR_QUEUE
codes.PULL_FLAG_CLASS_FILTER
codes.PULL_FLAG_LITE_PULL
codes.PERM_PRIORITY
codes.SYSFLAG_NEED_UNWRAP
codes.SYSFLAG_INNER_BATCH
# The native pull loop's last status (native/client/rmq_pull.c), unpacked with the others.
codes.PULL_PROTOCOL

# pytest reads these by name.
pytest = Whitelist()
pytest.pytestmark
pytest.pytest_plugins
pytest.pytest_generate_tests
pytest.s3_server_fixture  # tests/s3_server.py: a fixture pytest finds by its name s3_server
