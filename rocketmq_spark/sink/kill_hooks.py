"""Test hooks of the exactly-once sink: SIGKILL the driver at a chosen point of a commit.

Only the environment variable ``ROCKETMQ_SPARK_SINK_KILL`` turns them on (the kill tests in
``tests/test_sink_exactly_once_kills.py`` set it on the application they start).
"""
from __future__ import annotations

import logging
import os
import signal
import time
from typing import Optional

from .commit_record import CommitLog, write_atomic

log = logging.getLogger(__name__)
KILL_ENV = "ROCKETMQ_SPARK_SINK_KILL"
KILL_POINTS = ("after_record", "mid_end", "after_commit")


def driver_jvm_pid() -> Optional[int]:
    """The nearest ancestor process that is a JVM (the Spark driver), from /proc."""
    pid = os.getppid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().split(b"\0")
        except OSError:
            return None
        if cmdline and os.path.basename(cmdline[0]) == b"java":
            return pid
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return None


def kill_point(commit_log: CommitLog, point: str, batch_id: int) -> None:
    """Test hook: SIGKILL the driver JVM at ``point`` of ``batch_id``'s commit when the
    environment variable ``ROCKETMQ_SPARK_SINK_KILL`` names it (``point:batchId``, several
    separated by commas). Each fires once per checkpoint (a marker file remembers it)."""
    spec = os.environ.get(KILL_ENV)
    if not spec:
        return
    wanted = {s.strip() for s in spec.split(",") if s.strip()}
    if f"{point}:{batch_id}" not in wanted:
        return
    marker = os.path.join(commit_log.root, "kill-fired", f"{point}-{batch_id}")
    if os.path.exists(marker):
        return
    write_atomic(marker, str(time.time()).encode())
    jvm = driver_jvm_pid()
    log.warning("test hook %s=%s: killing the driver JVM %s at %s of batch %d", KILL_ENV,
                spec, jvm, point, batch_id)
    if jvm is not None:
        os.kill(jvm, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
