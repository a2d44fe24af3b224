"""The README's first command: ``python -m rocketmq_spark.demo``, run as CI's demo script does.

The demo makes its own SparkSession, and a second session cannot start in this process while
the suite's shared one (``spark`` in conftest.py) is alive, so it runs in a subprocess.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_demo_reads_every_message_exactly_once_with_zero_lag(tmp_path):
    out = tmp_path / "summary.json"
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "rocketmq_spark.demo", "--messages", "2000", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=180)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, (f"demo exited {proc.returncode}\n--- stdout\n"
                                  f"{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}")
    s = json.loads(out.read_text())

    assert s["ok"] and s["exactly_once"] and s["restart_reads_only_new"] and s["zero_lag"]
    assert s["sent_per_run"] == [2000, 400]
    assert s["rows_per_run"] == [2000, 400]  # the restart read only the 400 new messages
    assert s["sink_rows"] == s["sent"] == 2400
    assert s["missing"] == s["duplicates"] == s["unexpected"] == 0
    assert len(s["queues"]) == 8  # 2 brokers x 4 queues
    for key, q in s["queues"].items():
        assert q["rows"] == q["max"] == q["committed"] and q["lag"] == 0, key
        assert q["contiguous"], key
    assert sum(q["rows"] for q in s["queues"].values()) == 2400
    assert sum(s["lag_before_restart"].values()) == 400

    # What a reader of the README sees.
    assert "exactly once" in proc.stdout and "[FAIL]" not in proc.stdout
    assert re.search(r"message \d{5}", proc.stdout)  # the sample rows, body shown as text
    assert "Traceback" not in proc.stderr and " WARN " not in proc.stderr
    assert elapsed < 120, f"the demo took {elapsed:.0f} s"


def test_demo_rejects_bad_arguments():
    proc = subprocess.run([sys.executable, "-m", "rocketmq_spark.demo", "--messages", "0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--messages must be at least 1" in proc.stderr
