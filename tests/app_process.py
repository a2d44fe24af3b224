"""A Spark application script run in a process group of its own, so a test can SIGKILL its
driver and start it again.

The scripts (tests/fault_pipeline.py, tests/sink_pipeline.py, tests/group_member_app.py) say
what they do as one JSON object a line on stdout: ``{"event": "ready", "jvm_pid": ...}`` once
the query runs, then ``progress``, ``drained`` or ``failed`` events; a stop file asks them to
finish. Their stderr goes to ``<work>/<name>-<run>.log``. The scripts build their
SparkSession with ``app_session`` and say what they do with ``emit``, both below.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence

from waiting import wait_until

# Spark settings of every test app, chosen to hold on a loaded machine (a load average of 8
# on 2 cores), where a Python worker or an executor may get a fraction of a core for seconds.
APP_SPARK_CONF: Dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.stopTimeout": "60s",
    # A Python worker that connected back is then authenticated over its socket; Spark's
    # default 15 s for that exchange is short for a worker starved of CPU.
    "spark.python.authenticate.socketTimeout": "120s",
    # Python workers are forked from Spark's daemon (the default on Linux, said here because
    # it matters): the daemon waits 60 s for a worker where a fresh process gets a fixed 10 s.
    "spark.python.use.daemon": "true",
    # A Python worker that dies writes its traceback into the app's log.
    "spark.python.worker.faulthandler.enabled": "true",
    # local-cluster executors are separate JVMs: late heartbeats must not get them removed.
    "spark.network.timeout": "600s",
    "spark.executor.heartbeatInterval": "30s",
}


def app_session(master: str, app_name: str, conf: Mapping[str, str] = {}):
    """The SparkSession of a test app: ``APP_SPARK_CONF`` plus the app's own ``conf``."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**APP_SPARK_CONF, **conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def emit(**event) -> None:
    """Tell the test one event: a JSON object on a line of stdout."""
    print(json.dumps(event), flush=True)


class AppProcess:
    """One script, started and killed as often as a test likes; the events of every run are
    kept in ``events`` (waits look at the current run's only)."""

    def __init__(self, argv: Sequence[str], work: Path, name: str = "app",
                 stop_file: Optional[Path] = None):
        self.argv = list(argv)
        self.work, self.name = work, name
        self.stop_file = stop_file or work / f"{name}.stop"
        self.events: List[dict] = []
        self.proc: Optional[subprocess.Popen] = None
        self._reader: Optional[threading.Thread] = None
        self.starts = 0
        self.mark = 0

    def start(self, *extra: str, timeout: float = 180) -> "AppProcess":
        self.stop_file.unlink(missing_ok=True)
        self.mark = len(self.events)
        self.proc = subprocess.Popen(
            [*self.argv, *extra], stdout=subprocess.PIPE, text=True, start_new_session=True,
            stderr=open(self.work / f"{self.name}-{self.starts}.log", "w"))
        self.starts += 1
        self._reader = threading.Thread(target=self._read, args=(self.proc,), daemon=True)
        self._reader.start()
        self.wait_for(lambda e: e["event"] == "ready", timeout, f"{self.name} to start")
        return self

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            try:
                self.events.append(json.loads(line))
            except ValueError:
                pass

    @property
    def run_events(self) -> List[dict]:
        return self.events[self.mark:]

    def wait_for(self, match: Callable[[dict], bool], timeout: float, what: str) -> dict:
        """The first event of this run that ``match``es; fails at once if the app failed or
        exited first."""
        def matching_event() -> Optional[dict]:
            exited = self.proc.poll() is not None
            if exited:
                self._reader.join(5)  # the lines it printed before exiting
            for event in self.run_events:
                if event["event"] == "failed":
                    raise AssertionError(f"{self.name} failed: {event}")
                if match(event):
                    return event
            if exited:
                raise AssertionError(f"{self.name} exited ({self.proc.returncode}) before "
                                     f"{what}; see {self.work}/{self.name}-*.log")
            return None

        return wait_until(matching_event, timeout, what)

    def ready(self) -> dict:
        return [e for e in self.events if e["event"] == "ready"][-1]

    def jvm_pid(self) -> Optional[int]:
        return self.ready().get("jvm_pid")

    def kill(self) -> None:
        """SIGKILL the Spark driver JVM (when the app named it), then whatever is left of the
        process group."""
        jvm = self.jvm_pid()
        if jvm:
            os.kill(jvm, signal.SIGKILL)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)
        self.events.append({"event": "killed"})

    def stop(self, timeout: float = 120) -> None:
        """Ask the app to finish (its stop file) and wait for a clean exit."""
        self.stop_file.touch()
        assert self.proc.wait(timeout) == 0, f"{self.name} exited {self.proc.returncode}"

    def drain(self, timeout: float = 600) -> None:
        """Ask the app to read what is left and stop (its ``drained`` event), then exit."""
        self.stop_file.touch()
        self.wait_for(lambda e: e["event"] == "drained", timeout, "the drain")
        assert self.proc.wait(60) == 0
