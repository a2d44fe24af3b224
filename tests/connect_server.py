"""A Spark Connect server of the tests' own, in a process of its own, and a server Python
that can import ``rocketmq_spark`` but not the ``pyspark_rocketmq`` discovery module.

The server is Spark's ``SparkConnectServer`` started by ``spark-submit`` on ``local[2]``, as
``sbin/start-connect-server.sh`` starts it, from the jars that PyPI's pyspark ships. It runs
outside the test process because (1) a process holding a classic SparkSession (the suite's
``spark`` fixture) cannot also start ``remote("local[2]")``'s in-process server (PySpark refuses
with SESSION_ALREADY_EXIST), (2) the server's Python workers need another import path than the
client's, and (3) only then are client and server really apart, as they are for users.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Dict, List, Optional

import psutil

from waiting import wait_until

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
STARTED = re.compile(r"Spark Connect server started at: (\S+):(\d+)")
REPO = Path(__file__).resolve().parent.parent

# WARN for Spark, INFO for the line that names the port.
LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stdout.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss.SSS} %p %c{1}: %m%n%ex
logger.connect.name = org.apache.spark.sql.connect.service.SparkConnectServer
logger.connect.level = info
"""


def python_without_discovery(venv: Path) -> str:
    """A virtual environment whose Python imports ``rocketmq_spark`` and PySpark but finds no
    ``pyspark_rocketmq``: what a server has when the package reached its workers without the
    discovery module (a zip on ``spark.submit.pyFiles``, a copied folder). Its one ``.pth``
    names a folder holding only a link to the package, and this venv's site-packages as a plain
    path (so the editable install's ``.pth``, which adds the whole checkout, is not read)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    only_package = venv / "rocketmq-spark-only"
    only_package.mkdir()
    (only_package / "rocketmq_spark").symlink_to(REPO / "rocketmq_spark")
    site = subprocess.run([str(venv / "bin" / "python"), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    ours = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    Path(site, "rocketmq-spark-tests.pth").write_text(
        "\n".join([str(only_package)] + ours) + "\n")
    return str(venv / "bin" / "python")


class ConnectServer:
    """One Spark Connect server; ``start()`` waits for its port, ``stop()`` for the end of the
    JVM and of every process it started (Python workers, the sink's check-back responders)."""

    def __init__(self, python: str, workdir: Path, conf: Optional[Dict[str, str]] = None):
        self.python = python
        self.workdir = workdir
        self.conf = {
            "spark.master": "local[2]",
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": "0",  # any free port; read back from the log
            "spark.ui.enabled": "false",
            "spark.driver.memory": "1g",
            "spark.sql.session.timeZone": "UTC",
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.streaming.stopTimeout": "30s",
            **(conf or {}),
        }
        self.log_path = workdir / "connect-server.log"
        self.url: Optional[str] = None
        self._proc: Optional[subprocess.Popen] = None

    def start(self, timeout: float = 240) -> "ConnectServer":
        import pyspark

        spark_home = Path(pyspark.__file__).parent
        conf_dir = self.workdir / "spark-conf"
        conf_dir.mkdir(parents=True, exist_ok=True)
        (conf_dir / "log4j2.properties").write_text(LOG4J2)
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED",
                            "SPARK_LOCAL_REMOTE", "PYSPARK_DRIVER_PYTHON", "SPARK_CONF_DIR")}
        env.update(SPARK_HOME=str(spark_home), SPARK_CONF_DIR=str(conf_dir),
                   PYSPARK_PYTHON=self.python, SPARK_LOCAL_IP="127.0.0.1")
        command = [str(spark_home / "bin" / "spark-submit"), "--class", SERVER_CLASS]
        for key, value in self.conf.items():
            command += ["--conf", f"{key}={value}"]
        command.append("spark-internal")
        with open(self.log_path, "wb") as log:
            # In a folder of its own: some of Spark's Python workers start with ``python -m``
            # in the server's working directory and so have it on sys.path (from the checkout,
            # they would import the package, and pyspark_rocketmq, from there).
            self._proc = subprocess.Popen(command, env=env, cwd=self.workdir,
                                          stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True)
        try:
            host, port = wait_until(self._started, timeout, "the Spark Connect server's port")
        except BaseException:
            self.stop()
            raise
        self.url = f"sc://{host}:{port}"
        return self

    def _started(self):
        found = STARTED.search(self.log_path.read_text(errors="replace"))
        if found is None and self._proc.poll() is not None:
            raise AssertionError(f"the Spark Connect server exited ({self._proc.returncode}):\n"
                                 f"{self.log_tail()}")
        return found.groups() if found else None

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def session(self):
        """A new client session on the server (the Connect builder itself: the classic one
        refuses while the test process also holds a classic session)."""
        from pyspark.sql.connect.session import SparkSession as ConnectSession

        return ConnectSession.builder.remote(self.url).create()

    def processes(self) -> List[psutil.Process]:
        """The server JVM and everything it started that still runs."""
        try:
            jvm = psutil.Process(self._proc.pid)
            return [jvm] + jvm.children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM to the server's process group (Spark stops its context), SIGKILL after
        ``timeout``; then wait for every process it had started, detached ones included."""
        if self._proc is None:
            return
        started = self.processes()
        try:
            os.killpg(self._proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(30)
        _, alive = psutil.wait_procs(started, timeout=30)
        for proc in alive:
            proc.kill()
        self._proc = None
        assert not alive, f"processes of the Connect server outlived it: {alive}"
