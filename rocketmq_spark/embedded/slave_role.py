"""What a broker's role changes in its answers, as 4.9.8 decides it.

* A slave stores nothing a client sends: DefaultMessageStore.putMessage refuses (PutMessageStatus
  SERVICE_NOT_AVAILABLE) and SendMessageProcessor answers code 14 with the remark naming the
  disk usage of the store's partitions (:func:`store_refusal`).
* A slave refuses END_TRANSACTION with SLAVE_NOT_AVAILABLE (EndTransactionProcessor) once the
  header decodes, before it looks at the transaction.
* ``suggestWhichBrokerId`` (PullMessageProcessor): 0 unless ``slaveReadEnable``; with it,
  whichBrokerWhenConsumeSlowly (1) for a pull further behind the commit log's end than
  accessMessageInMemoryMaxRatio percent of the memory (DefaultMessageStore.getMessage's
  ``suggestPullingFromSlave``), else the group's brokerId (0). Masters and slaves decide alike.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Optional

from ..client.protocol.codes import ResponseCode
from ..client.protocol.frame import RemotingCommand
from .context import BrokerContext
from .headers import req_int, req_long, req_str
from .transactions import (
    TRANSACTION_COMMIT_TYPE, TRANSACTION_NOT_TYPE, TRANSACTION_ROLLBACK_TYPE,
)

MASTER_ID = 0
WHICH_BROKER_WHEN_CONSUME_SLOWLY = 1  # SubscriptionGroupConfig's default
PHYSICAL_OFFSET_AT = 28  # a stored record's physicalOffset field
NOT_SET_REMARK = "not set any response code"  # createResponseCommand(null)'s remark


def disk_used_ratio(path: Optional[Path]) -> float:
    """UtilAll.getDiskPartitionSpaceUsedPercent: the used fraction of the path's partition
    ((total - free) / total, free counting the blocks reserved for root as Java's
    File.getFreeSpace does); -1 when it cannot be read."""
    try:
        st = os.statvfs(path if path is not None and path.exists() else tempfile.gettempdir())
    except OSError:
        return -1.0
    if not st.f_blocks:
        return -1.0
    return (st.f_blocks - st.f_bfree) / st.f_blocks


def store_refusal(context: BrokerContext, cmd: RemotingCommand,
                  ext: dict) -> RemotingCommand:
    """A send refused because this broker is a slave: code 14 and the captured remark (the
    commit log, consume queue and index ratios; all three live on the store's partition)."""
    ratio = disk_used_ratio(context.store.path)
    usage = f"CL: {ratio:5.2f} CQ: {ratio:5.2f} INDEX: {ratio:5.2f}"
    return cmd.make_response(
        ResponseCode.SERVICE_NOT_AVAILABLE, dict(ext),
        "service not available now. It may be caused by one of the following reasons: the "
        f"broker's disk is full [{usage}], messages are put to the slave, message store has "
        "been shut down, etc.", version=context.options.version)


def end_transaction_refusal(context: BrokerContext, cmd: RemotingCommand) -> RemotingCommand:
    """END_TRANSACTION on a slave (nothing is answered for a oneway one), once its header
    decodes as the master's would (a header the master refuses is refused the same way)."""
    f = cmd.fields
    req_str(f, "producerGroup")
    req_long(f, "tranStateTableOffset")
    req_long(f, "commitLogOffset")
    kind = req_int(f, "commitOrRollback")
    req_str(f, "msgId")
    version = context.options.version
    if kind not in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE):
        return cmd.make_response(ResponseCode.SYSTEM_ERROR, None, "org.apache.rocketmq.remoting."
                                 "exception.RemotingCommandException: commitOrRollback field "
                                 "wrong", version=version)
    return cmd.make_response(ResponseCode.SLAVE_NOT_AVAILABLE, None, NOT_SET_REMARK,
                             version=version)


def suggested_broker(context: BrokerContext, queue, found: bool, next_begin: int) -> int:
    """The pull answer's suggestWhichBrokerId. ``found``: the pull examined entries (FOUND or
    NO_MATCHED_MESSAGE), the last of them at ``next_begin - 1``."""
    opts = context.options
    if opts.suggest_broker_id:
        return opts.suggest_broker_id
    if not opts.slave_read_enable or not found:
        return MASTER_ID
    last = queue.record_long(next_begin - 1, PHYSICAL_OFFSET_AT)
    behind = context.store.commit_log.size - last
    return WHICH_BROKER_WHEN_CONSUME_SLOWLY if behind > opts.memory_threshold else MASTER_ID
