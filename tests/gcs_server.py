"""A Google Cloud Storage emulator on 127.0.0.1 for the tiered-storage tests (the
``google-cloud-storage`` driver): ``gcp-storage-emulator``, started as its own process.

Why this one: it installs from PyPI (pure Python, no container or binary), is maintained, and
speaks the GCS JSON API that pyarrow's ``GcsFileSystem`` uses (resumable uploads, ranged media
downloads, listings, deletes), over a real socket. The driver finds it the way Google's client
libraries find an emulator: ``STORAGE_EMULATOR_HOST``, set here for the test process and the
brokers it starts; it connects anonymously.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass

from s3_server import _free_port, stop_process, wait_until_answering
import children  # tests/ is on sys.path


@dataclass
class GcsServer:
    endpoint: str
    server: object

    def create_bucket(self, name: str) -> str:
        import json

        req = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project=test",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        urllib.request.urlopen(req, timeout=30).close()
        return name

    def keys(self, bucket: str) -> list[str]:
        """Every object in ``bucket``, listed over the JSON API (not through the code under test)."""
        import json

        out: list[str] = []
        token = ""
        while True:
            url = f"{self.endpoint}/storage/v1/b/{bucket}/o?maxResults=1000" + (
                f"&pageToken={token}" if token else ""
            )
            with urllib.request.urlopen(url, timeout=30) as resp:
                page = json.loads(resp.read())
            out += [o["name"] for o in page.get("items", []) if not o["name"].endswith("/")]
            token = page.get("nextPageToken", "")
            if not token:
                return sorted(out)

    def offload_config(self, bucket: str) -> dict[str, str]:
        return {"managedLedgerOffloadDriver": "google-cloud-storage", "gcsManagedLedgerOffloadBucket": bucket}


def start_gcs_server(log_dir: str | None = None, timeout: float = 60.0) -> GcsServer:
    """The emulator on a free 127.0.0.1 port (in memory); returns once it answers HTTP (a wait
    with a deadline)."""
    import tempfile

    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    os.environ["STORAGE_EMULATOR_HOST"] = endpoint
    log = open(os.path.join(log_dir or tempfile.gettempdir(), f"gcs-{port}.log"), "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gcp_storage_emulator", "start", "-H", "127.0.0.1", "--port", str(port), "-M"],
        **children.keep(stdout=log, stderr=subprocess.STDOUT, env={**os.environ}),
    )
    wait_until_answering(proc, endpoint + "/storage/v1/b?project=test", timeout, "GCS emulator", log.name)
    return GcsServer(endpoint, proc)


def stop_gcs_server(server: GcsServer) -> None:
    stop_process(server.server)
    os.environ.pop("STORAGE_EMULATOR_HOST", None)
