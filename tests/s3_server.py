"""An S3-compatible server on loopback for the storage tests: moto's standalone server
(``moto_server``, PyPI moto[server]) in a process of its own, speaking S3's HTTP API.

It checks signatures and credentials (``INITIAL_NO_AUTH_ACTION_COUNT``: the first three
requests, which make an IAM user, its access key and its policy, go unchecked; every later
request must be signed with a key the server knows), so a refused key is refused as AWS
would. Tests reach it through pyarrow's S3 client over real HTTP; boto3 (a dependency of moto)
only sets it up and lists what was written.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List

import pytest

REGION = "us-east-1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class S3Server:
    """A running server: its endpoint and a user's keys."""

    proc: subprocess.Popen
    port: int
    access_key: str
    secret_key: str

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def options(self, **extra: str) -> Dict[str, str]:
        """The sink's ``checkpointStorage.*`` options for this server."""
        out = {"checkpointStorage.endpoint": self.endpoint, "checkpointStorage.scheme": "http",
               "checkpointStorage.region": REGION,
               "checkpointStorage.accessKey": self.access_key,
               "checkpointStorage.secretKey": self.secret_key}
        out.update({f"checkpointStorage.{k}": v for k, v in extra.items()})
        return out

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=f"http://{self.endpoint}",
                            aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name=REGION)

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def keys(self, bucket: str, prefix: str = "") -> List[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                       Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def requests(self) -> List[str]:
        """The request lines the server logged so far ("PUT /bucket/key", ...)."""
        return [line.split('"')[1] for line in Path(self.log).read_text().splitlines()
                if line.count('"') >= 2]

    log: str = ""


def start_s3_server(work: Path) -> S3Server:
    exe = shutil.which("moto_server", path=os.path.dirname(sys.executable))
    if exe is None:
        pytest.skip("needs moto[server] (pip install 'rocketmq-spark[test]')")
    import boto3

    port = _free_port()
    log = work / "moto.log"
    env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="3")
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], env=env,
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto_server did not start: {log.read_text()[-2000:]}")
            time.sleep(0.1)
    iam = boto3.client("iam", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id="setup",
                       aws_secret_access_key="setup", region_name=REGION)
    iam.create_user(UserName="spark")
    key = iam.create_access_key(UserName="spark")["AccessKey"]
    iam.put_user_policy(UserName="spark", PolicyName="all-s3", PolicyDocument=json.dumps(
        {"Version": "2012-10-17",
         "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
    return S3Server(proc, port, key["AccessKeyId"], key["SecretAccessKey"], str(log))


@pytest.fixture(name="s3_server", scope="module")
def s3_server_fixture(tmp_path_factory):
    server = start_s3_server(tmp_path_factory.mktemp("s3"))
    yield server
    server.proc.terminate()
    try:
        server.proc.wait(10)
    except subprocess.TimeoutExpired:
        server.proc.kill()
