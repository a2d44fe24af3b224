"""The processes of a Spark benchmark: the embedded RocketMQ server in a process of its own
(``python -m rocketmq_spark.embedded``), and the CPU seconds each role used (the server,
Spark's JVM, its Python workers, this driver, and everything else on the machine).
"""
from __future__ import annotations

import subprocess
import sys
import time
from typing import Dict

import psutil

from bench_session import ROOT


def start_server(*flags: str, timeout: float = 300):
    """``python -m rocketmq_spark.embedded FLAGS``; returns (process, namesrv address)."""
    proc = subprocess.Popen([sys.executable, "-m", "rocketmq_spark.embedded", *flags],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    namesrv = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("namesrv"):
            namesrv = line.split()[1]
        if line.startswith("ready") and namesrv:
            return proc, namesrv
    proc.kill()
    raise RuntimeError(f"the embedded server ({' '.join(flags)}) did not become ready")


def stop_server(proc) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _cpu_seconds(process: psutil.Process) -> float:
    """User + system CPU seconds of one process (not of its children)."""
    times = process.cpu_times()
    return times.user + times.system


def cpu_by_role(server_pid: int) -> Dict[str, float]:
    """CPU seconds (user + system) so far of the live processes: the embedded server, Spark's
    JVM and the Python processes it started (workers, daemons, runners)."""
    me = psutil.Process()
    out = {"server": 0.0, "jvm": 0.0, "python_workers": 0.0, "bench_driver": _cpu_seconds(me)}
    skip = {server_pid}
    try:
        server = psutil.Process(server_pid)
        out["server"] = _cpu_seconds(server)
        skip.update(p.pid for p in server.children(recursive=True))
    except psutil.Error:
        pass
    for child in me.children(recursive=True):
        if child.pid in skip:
            continue
        try:
            role = "jvm" if "java" in child.name() else "python_workers"
            out[role] += _cpu_seconds(child)
        except psutil.Error:  # it ended meanwhile
            pass
    return out


def machine_busy() -> float:
    """CPU seconds the whole machine has been busy (all cores; idle and iowait excluded)."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + t.irq + t.softirq + t.steal


def cpu_snapshot(server_pid: int) -> Dict[str, float]:
    snap = cpu_by_role(server_pid)
    snap["machine"] = machine_busy()
    return snap


def cpu_delta(before: Dict[str, float], after: Dict[str, float]) -> Dict[str, float]:
    """Per-role CPU seconds between two snapshots; ``other`` is what processes outside this
    benchmark used meanwhile (a shared machine makes the figures noisy)."""
    out = {k: round(after[k] - before.get(k, 0.0), 3) for k in after if k != "machine"}
    out["other"] = round(max(0.0, after["machine"] - before["machine"] - sum(out.values())), 3)
    return out
