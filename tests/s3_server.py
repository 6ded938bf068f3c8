"""A real S3-compatible server on 127.0.0.1 for the tiered-storage tests: moto's server mode.

Started as its own process (``python -m moto.server``), so the tests talk to it over a real
socket as to any S3 service. Why moto[server]: it installs from PyPI with no binaries or
containers, is actively maintained,
and speaks the S3 REST API (multipart uploads, ranged GETs, listings) that pyarrow's S3 client
uses, over a real socket. The credentials are dummies, passed the standard way (AWS environment
variables), which broker subprocesses inherit.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from urllib.parse import unquote, urlparse
import children  # tests/ is on sys.path
from ports import listen_ports


def _free_port() -> int:
    """A port for a server process that binds it a second or more later (an interpreter
    importing moto): from below the ephemeral range (``tests/ports.py``)."""
    return listen_ports(1)[0]


DUMMY_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "compactmq-test-key",
    "AWS_SECRET_ACCESS_KEY": "compactmq-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@dataclass
class S3Request:
    """One request the S3 server received (from its own request log, moto's recorder)."""

    method: str
    path: str  # "/bucket/key", unquoted
    range: tuple[int, int] | None  # the Range header's [first, last] bytes, None for a whole object

    @property
    def range_bytes(self) -> int:
        return 0 if self.range is None else self.range[1] - self.range[0] + 1


@dataclass
class Recording:
    requests: list[S3Request] = field(default_factory=list)

    def gets(self, under: str) -> list[S3Request]:
        """GET requests of objects whose path starts with ``under`` ("/bucket/prefix")."""
        return [r for r in self.requests if r.method == "GET" and r.path.startswith(under)]


@dataclass
class S3Server:
    endpoint: str
    server: object

    def _moto_api(self, action: str) -> str:
        req = urllib.request.Request(f"{self.endpoint}/moto-api/recorder/{action}", data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.read().decode()

    @contextlib.contextmanager
    def recording(self):
        """Record what the server receives inside the block: moto's request recorder, so the
        counts are the server's, not the client's. Yields a ``Recording`` filled at the end."""
        out = Recording()
        self._moto_api("reset-recording")
        self._moto_api("start-recording")
        try:
            yield out
        finally:
            self._moto_api("stop-recording")
            for line in self._moto_api("download-recording").splitlines():
                if not line.strip():
                    continue
                entry = json.loads(line)
                headers = {k.lower(): v for k, v in entry.get("headers", {}).items()}
                rng = None
                if headers.get("range", "").startswith("bytes="):
                    first, _, last = headers["range"][len("bytes=") :].partition("-")
                    rng = (int(first), int(last))
                out.requests.append(S3Request(entry["method"], unquote(urlparse(entry["url"]).path), rng))

    def create_bucket(self, name: str) -> str:
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1").create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str) -> list[str]:
        """Every object in ``bucket``, listed with boto3 (not through the code under test)."""
        import boto3

        s3 = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")
        out: list[str] = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            # keys ending in "/" are pyarrow's empty directory markers (it writes one when the last
            # object under a prefix goes), not objects: zero bytes, named by no one
            out += [o["Key"] for o in page.get("Contents", []) if not o["Key"].endswith("/")]
        return sorted(out)

    def offload_config(self, bucket: str) -> dict[str, str]:
        return {
            "managedLedgerOffloadDriver": "S3",
            "s3ManagedLedgerOffloadBucket": bucket,
            "s3ManagedLedgerOffloadRegion": "us-east-1",
            "s3ManagedLedgerOffloadServiceEndpoint": self.endpoint,
        }


def start_s3_server(log_dir: str | None = None, timeout: float = 60.0) -> S3Server:
    """``python -m moto.server`` as a subprocess on a free 127.0.0.1 port; returns once it
    answers HTTP (a wait with a deadline, no fixed sleep)."""
    import tempfile

    os.environ.update(DUMMY_CREDENTIALS)  # inherited by brokers and Spark processes the tests start
    port = _free_port()
    log = open(os.path.join(log_dir or tempfile.gettempdir(), f"moto-{port}.log"), "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        # the request log (``S3Server.recording``) goes beside the server's log
        **children.keep(
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "MOTO_RECORDER_FILEPATH": f"{log.name}.requests"},
        ),
    )
    endpoint = f"http://127.0.0.1:{port}"
    wait_until_answering(proc, endpoint + "/", timeout, "moto server", log.name)
    return S3Server(endpoint, proc)


def wait_until_answering(proc, url: str, timeout: float, what: str, log_name: str) -> None:
    """Wait until the server process ``proc`` answers HTTP at ``url`` (any status counts); kill
    it and raise when it exits first or the deadline passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}; see {log_name}")
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{what} did not answer on {url} within {timeout}s")


def stop_process(proc) -> None:
    """Terminate a test server process, killing it if it does not stop within 10 s."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stop_s3_server(server: S3Server) -> None:
    stop_process(server.server)
