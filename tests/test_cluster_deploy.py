"""The demo on a real Spark standalone cluster, the package shipped the way users ship it.

``ci/cluster.sh`` starts a master and two workers from pyspark's own launcher, in an environment
whose Pythons cannot import rocketmq_spark (the script checks that first), and spark-submits
``rocketmq_spark/demo.py`` with the package shipped as a packed venv (``--archives``) or as a
zip (``--py-files``). The demo's own checks (every message exactly once, the restart reading
only the new ones, the consumer group's lag 0) come back in its JSON summary. The executors'
work folders show what they were shipped and, for the venv (installed without .pyc files),
the .pyc files they wrote when they imported the package from it.

The venv way, the recommended one, runs in the default suite: it takes about 2 minutes on 2
cores (building the wheel and the venv, starting the cluster, one Spark application), more when
the machine is busy. The --py-files way and the interrupted run are slow tests.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import psutil
import pytest

from waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "ci" / "cluster.sh"
DEMO_ARGS = ["--messages", "1000", "--more", "200", "--show", "0"]
RUN_TIMEOUT = 800  # seconds for a whole run of the script; it has its own inner timeouts


def start_script(out: Path, ship: str) -> subprocess.Popen:
    env = dict(os.environ, PY=sys.executable)
    return subprocess.Popen(["bash", str(SCRIPT), "--ship", ship, "--out", str(out), "--",
                             *DEMO_ARGS], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(proc: subprocess.Popen, timeout: float) -> Tuple[int, str, str]:
    """Wait for the script; past ``timeout`` it gets SIGTERM (its trap stops the cluster),
    and a last SIGKILL only if the trap does not end it within a minute."""
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            stdout, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        pytest.fail(f"ci/cluster.sh ran over {timeout} s\n{stdout[-3000:]}\n{stderr[-6000:]}")
    return proc.returncode, stdout, stderr


def work_folder(stdout: str) -> Path:
    match = re.search(r"^cluster: work folder (\S+)$", stdout, re.M)
    assert match, f"the script did not name its work folder:\n{stdout[:2000]}"
    return Path(match.group(1))


def processes_in(work: Path) -> List[str]:
    """Live processes started for the run (their command line or current folder is in it):
    pid and command line."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd", "status"]):
        try:
            info = proc.info
            if info["status"] == psutil.STATUS_ZOMBIE:
                continue
            line = " ".join(info["cmdline"] or [])
            if str(work) in line or (info["cwd"] or "").startswith(str(work)):
                found.append(f"{info['pid']}: {line}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def evidence(out: Path, way: str) -> List[dict]:
    """The script's lines about the last application's executors (tasks run, files shipped,
    .pyc files of rocketmq_spark written under their site-packages)."""
    rows = []
    for line in (out / f"{way}.evidence").read_text().splitlines():
        executor, tasks, shipped, pyc = line.split()
        rows.append({"executor": executor, "tasks": int(tasks.split("=")[1]),
                     "shipped": shipped.split("=")[1].split(","),
                     "pyc": int(pyc.split("=")[1])})
    return rows


def run_and_check(tmp_path: Path, way: str) -> List[dict]:
    out = tmp_path / "out"
    rc, stdout, stderr = finish(start_script(out, way), RUN_TIMEOUT)
    work = work_folder(stdout)
    assert rc == 0, f"ci/cluster.sh exited {rc}\n{stdout[-4000:]}\n{stderr[-8000:]}"
    assert re.search(r"^cluster: master spark://127\.0\.0\.1:\d+ and 2 workers up", stdout, re.M)
    assert (out / f"{way}.rc").read_text().strip() == "0"

    s = json.loads((out / f"{way}.json").read_text())
    assert s["ok"] and s["exactly_once"] and s["restart_reads_only_new"] and s["zero_lag"], s
    assert s["rows_per_run"] == s["sent_per_run"] == [1000, 200]
    assert s["sink_rows"] == s["sent"] == 1200
    assert s["missing"] == s["duplicates"] == s["unexpected"] == 0
    assert len(s["queues"]) == 8  # 2 brokers x 4 queues
    for key, q in s["queues"].items():  # committed back to the group: what the brokers hold
        assert q["rows"] == q["max"] == q["committed"] and q["lag"] == 0, key
    assert sum(s["lag_before_restart"].values()) == 200

    executors = evidence(out, way)
    assert executors and sum(e["tasks"] for e in executors) > 0, executors
    # Everything stopped, nothing left behind, the work folder removed after a success.
    assert processes_in(work) == []
    assert not work.exists()
    return executors


@pytest.mark.timeout(RUN_TIMEOUT + 120)
def test_packed_venv_on_archives_runs_the_demo_exactly_once(tmp_path):
    executors = run_and_check(tmp_path, "venv")
    assert all("environment" in e["shipped"] for e in executors if e["tasks"]), executors
    # The package was installed without .pyc files: the executors' Pythons wrote these when
    # they imported it from the archive unpacked in their work folders.
    assert sum(e["pyc"] for e in executors) > 0, executors


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT + 120)
def test_zip_on_py_files_runs_the_demo_exactly_once(tmp_path):
    executors = run_and_check(tmp_path, "pyfiles")
    assert all("rocketmq_spark.zip" in e["shipped"] for e in executors if e["tasks"]), executors
    assert sum(e["pyc"] for e in executors) == 0  # imported from the zip: no site-packages


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT + 120)
def test_an_interrupted_run_stops_every_process_and_keeps_its_logs(tmp_path):
    out = tmp_path / "out"
    proc = start_script(out, "venv")
    work = None
    try:
        first = proc.stdout.readline()
        work = work_folder(first)

        def executor_running():
            assert proc.poll() is None, "ci/cluster.sh ended before an executor started"
            return [p for p in processes_in(work) if "CoarseGrainedExecutorBackend" in p]

        wait_until(executor_running, RUN_TIMEOUT - 200, "an executor of the demo")
        proc.send_signal(signal.SIGTERM)
        rc, stdout, stderr = finish(proc, 120)
        assert rc == 143, f"{stdout[-2000:]}\n{stderr[-4000:]}"
        assert f"logs in {work}/logs" in stderr
        assert (work / "logs" / "master.log").is_file() and (work / "logs" / "venv.log").is_file()
        assert processes_in(work) == []
    finally:
        if proc.poll() is None:
            finish(proc, 1)
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
