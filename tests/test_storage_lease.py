"""The responder's lease (rocketmq_spark/storage/lease.py): two responders of one query, a
zombie and its restart, never both answer. Each is a process that "answers" (writes the time
to its own file) only while :meth:`Lease.held` says so, as the check-back responder does
before each answer. The holder is frozen with SIGSTOP past the lease's ttl (a driver paused
by the OS or a long GC), the other takes over, then the zombie is woken: it must not answer
again. On a local disk and on S3 (moto's server, over HTTP)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rocketmq_spark.storage import Lease, StorageOptions, open_uri
from s3_server import s3_server_fixture  # noqa: F401 (the fixture s3_server)
from waiting import wait_until

TTL, SETTLE, MARGIN = 3.0, 0.3, 0.5

WORKER = r'''
import json, sys, time
from rocketmq_spark.storage import Lease, StorageOptions, open_uri
uri, options, out, ttl, settle, margin = sys.argv[1:7]
store = open_uri(uri, StorageOptions(json.loads(options)))
lease = Lease(store, "responder.lease", ttl_s=float(ttl), settle_s=float(settle),
              margin_s=float(margin))
with open(out, "a", buffering=1) as f:
    while True:
        if not lease.held() and not lease.acquire(3600):
            continue
        f.write(f"took {time.time()}\n")
        while True:
            # the responder answers on its own thread, whenever a check-back comes: first
            if not lease.held():
                f.write(f"lapsed {time.time()}\n")
                break
            f.write(f"answer {time.time()}\n")  # what the responder does after held()
            if lease.renew_due() and not lease.renew():
                f.write(f"lost {time.time()}\n")
                break
            time.sleep(0.05)
'''


def _events(path: Path):
    if not path.exists():
        return []
    return [(line.split()[0], float(line.split()[1])) for line in path.read_text().splitlines()
            if len(line.split()) == 2]


def _answers(path: Path):
    return [t for kind, t in _events(path) if kind == "answer"]


def stop_all(procs) -> None:
    """End the responder processes, a frozen (SIGSTOPped) one included."""
    for p in procs:
        try:
            os.kill(p.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        p.kill()
        p.wait()


def run_zombie_and_restart(tmp_path: Path, uri: str, options: dict) -> None:
    outs = [tmp_path / "a.log", tmp_path / "b.log"]
    procs = []

    def start(out: Path):
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER, uri, json.dumps(options),
                                       str(out), str(TTL), str(SETTLE), str(MARGIN)]))
    try:
        start(outs[0])
        wait_until(lambda: _answers(outs[0]), 30, "the first responder to answer")
        start(outs[1])
        time.sleep(TTL * 1.5)  # the second waits while the first renews
        assert not _answers(outs[1]), "the second answered while the first held the lease"
        os.kill(procs[0].pid, signal.SIGSTOP)  # the first becomes a zombie
        wait_until(lambda: _answers(outs[1]), 30, "the restart to take the lease over")
        os.kill(procs[0].pid, signal.SIGCONT)
        wait_until(lambda: any(k in ("lost", "lapsed") for k, _ in _events(outs[0])), 30,
                   "the zombie to notice it lost the lease")
        time.sleep(TTL)
        a, b = _answers(outs[0]), _answers(outs[1])
        assert a and b
        overlap = [t for t in a if t >= min(b)]
        assert not overlap, (f"the zombie answered {len(overlap)} times after the restart's "
                             f"first answer at {min(b)}: {overlap[:5]}")
        assert max(b) > max(a) + TTL / 2, "the restart stopped answering"
    finally:
        stop_all(procs)


def test_a_zombie_and_its_restart_never_both_answer_on_a_local_disk(tmp_path):
    run_zombie_and_restart(tmp_path, str(tmp_path / "record"), {})


def test_a_zombie_and_its_restart_never_both_answer_on_s3(s3_server, tmp_path):
    s3_server.create_bucket("lease-b")
    options = {k.split(".", 1)[1]: v for k, v in s3_server.options().items()}
    run_zombie_and_restart(tmp_path, "s3a://lease-b/q/rocketmq-sink", options)


def test_a_released_lease_is_taken_at_once_and_a_held_one_is_not(tmp_path):
    store = open_uri(str(tmp_path / "record"))
    first = Lease(store, "l", ttl_s=TTL, settle_s=SETTLE, margin_s=MARGIN)
    second = Lease(store, "l", ttl_s=TTL, settle_s=SETTLE, margin_s=MARGIN)
    assert first.acquire(5) and first.held()
    started = time.monotonic()
    assert not second.acquire(1.0), "taken while held"
    first.release()
    assert not first.held()
    assert second.acquire(5) and time.monotonic() - started < 1.0 + TTL / 2 + 1
    with pytest.raises(ValueError, match="ttl"):
        Lease(store, "l", ttl_s=1.0, settle_s=1.0, margin_s=1.0)
    assert StorageOptions().values == {}


def test_the_real_responder_of_a_zombie_stops_when_its_restart_takes_over(
        embedded_cluster_factory, tmp_path):
    """Two check-back responder processes (python -m rocketmq_spark.sink.responder) of one
    query: the second waits while the first holds the lease; the first frozen past the
    lease's ttl, the second takes over and answers; the first, woken, stops without answering
    (its lease thread finds the window closed)."""
    from rocketmq_spark.sink.commit_record import CommitLog

    cluster = embedded_cluster_factory(brokers=1)
    log = CommitLog(str(tmp_path / "rocketmq-sink"))
    log.touch()
    config = json.dumps({"root": log.root, "options": {"nameServer": cluster.namesrv_addr},
                         "group": "lease-group", "queryId": "q-lease", "jvmPid": os.getpid(),
                         "idleLimitS": 600})
    logs = [tmp_path / "r1.log", tmp_path / "r2.log"]
    procs = []
    try:
        for out in logs:
            with open(out, "wb") as err:
                proc = subprocess.Popen([sys.executable, "-m", "rocketmq_spark.sink.responder"],
                                        stdin=subprocess.PIPE, stderr=err)
            proc.stdin.write(config.encode())
            proc.stdin.close()
            procs.append(proc)
            if out == logs[0]:
                wait_until(lambda: "answering check-backs" in logs[0].read_text(), 30,
                           "the first responder to answer")
        time.sleep(3)
        assert "answering" not in logs[1].read_text(), "both answer"
        os.kill(procs[0].pid, signal.SIGSTOP)
        wait_until(lambda: "answering check-backs" in logs[1].read_text(), 40,
                   "the second responder to take the lease over")
        os.kill(procs[0].pid, signal.SIGCONT)
        wait_until(lambda: procs[0].poll() is not None, 30, "the zombie responder to stop")
        assert "lost responder.lease" in logs[0].read_text()
        assert procs[1].poll() is None, "the restart's responder stopped too"
    finally:
        stop_all(procs)
