"""A real S3-compatible server on 127.0.0.1 for the tiered-storage tests: moto's server mode.

Why moto[server]: it installs from PyPI with no binaries or containers, is actively maintained,
and speaks the S3 REST API (multipart uploads, ranged GETs, listings) that pyarrow's S3 client
uses, over a real socket. The credentials are dummies, passed the standard way (AWS environment
variables), which broker subprocesses inherit.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


DUMMY_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "compactmq-test-key",
    "AWS_SECRET_ACCESS_KEY": "compactmq-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@dataclass
class S3Server:
    endpoint: str
    server: object

    def create_bucket(self, name: str) -> str:
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1").create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str) -> list[str]:
        import boto3

        s3 = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")
        out: list[str] = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            out += [o["Key"] for o in page.get("Contents", [])]
        return sorted(out)

    def offload_config(self, bucket: str) -> dict[str, str]:
        return {"managedLedgerOffloadDriver": "S3", "s3ManagedLedgerOffloadBucket": bucket,
                "s3ManagedLedgerOffloadRegion": "us-east-1", "s3ManagedLedgerOffloadServiceEndpoint": self.endpoint}


def start_s3_server() -> S3Server:
    from moto.server import ThreadedMotoServer

    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one log line per request otherwise
    os.environ.update(DUMMY_CREDENTIALS)
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    return S3Server(f"http://127.0.0.1:{port}", server)
