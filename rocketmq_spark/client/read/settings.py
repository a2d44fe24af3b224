"""What a range reader is told: the group and subscription it pulls as, its batches, retries
and busy budget, and which pull loop it may run. Below the reader and its engines, which
both read it."""
from __future__ import annotations

from dataclasses import dataclass

from ..busy import DEFAULT_BUSY_TIMEOUT


@dataclass(frozen=True)
class ReadSettings:
    consumer_group: str
    subscription: str = "*"
    expression_type: str = "TAG"  # or "SQL92"
    sub_version: int = 0          # when the subscription was built (ms), as Java sends it
    max_msg_nums: int = 32
    pull_timeout: float = 10.0
    pipeline_depth: int = 16
    batch_max_messages: int = 32768
    batch_max_bytes: int = 8 * 1024 * 1024
    fail_on_data_loss: bool = True
    verify_crc: bool = True
    properties: bool = True   # decode the raw properties column
    offset_ids: bool = True   # decode the broker's offset message ids
    retry_deadline: float = 60.0
    retry_backoff: float = 0.1
    retry_backoff_max: float = 2.0
    busy_timeout: float = DEFAULT_BUSY_TIMEOUT  # seconds of only busy answers before giving up
    busy_backoff_max: float = 3.0    # the longest wait after a busy answer (as Apache's push
                                     # consumer waits after a failed pull)
    native: bool = True       # use the native pull loop where it can run
