"""``python -m rocketmq_spark.embedded`` run as a user runs it, for the tests of its flags."""
from __future__ import annotations

import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List, Tuple

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def embedded_cli(*args: str, timeout: float = 60.0
                 ) -> Iterator[Tuple[subprocess.Popen, List[List[str]]]]:
    """Start the server with ``args`` and wait for its ``ready`` line; yields the process and
    the lines it printed (split into words, ``ready`` last). Its stderr goes to the test's
    captured output. Terminated afterwards unless the test ended it."""
    proc = subprocess.Popen([sys.executable, "-m", "rocketmq_spark.embedded", *args],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        lines: List[List[str]] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.split())
            if line.strip() == "ready":
                break
        assert lines and lines[-1] == ["ready"], (lines, proc.poll())
        yield proc, lines
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(30)
        proc.stdout.close()


def printed(lines: List[List[str]], kind: str) -> List[List[str]]:
    """The printed lines that start with ``kind`` (``broker``, ``slave``, ``proxy-remoting``)."""
    return [line for line in lines if line and line[0] == kind]
