"""The embedded RocketMQ in a process of its own, for the benchmarks: its CPU is then counted
apart from the client's and Spark's, as a genuine broker's would be."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]


def start_embedded(args: Sequence[str], timeout: float = 60.0
                   ) -> Tuple[subprocess.Popen, Dict[str, str]]:
    """``python -m rocketmq_spark.embedded *args``, once it printed ``ready``: the process and
    what it printed before, by the first word of each line (``namesrv``, ``proxy``, ...)."""
    proc = subprocess.Popen([sys.executable, "-m", "rocketmq_spark.embedded", *args],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    found: Dict[str, str] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        kind, _, rest = line.strip().partition(" ")
        found[kind] = rest
        if kind == "ready":
            return proc, found
    proc.kill()
    raise SystemExit(f"the embedded server ({' '.join(args)}) did not start")
