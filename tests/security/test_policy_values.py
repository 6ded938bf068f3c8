"""Policy values a tenant admin sets can reach nothing of the broker's (issue 24, docs/security.md).

One broker for the module, with token, basic and TLS authentication and authorization on, an
export root, its own filesystem offload location, and a *canary* module on its ``PYTHONPATH``
that writes a file when imported. ``acme-admin`` administers tenant ``acme`` and nothing else:

* ``compactedExport``: a chosen ``path`` (the data directory, the root itself, anything) is a 412;
  the location is derived under ``compactedExportRoot``; an object-store root must be one the
  operator listed, and only for Delta;
* ``compactionStrategy``: dotted class names (the canary, ``multiprocessing.pool.Pool``) are 412
  and nothing is imported; the broker keeps answering at once;
* ``offloadPolicies``: the broker's own location is fine, the data directory, another directory,
  or an S3 endpoint of the tenant's own are 412;
* the CLI says the same in one line;
* a property-style sweep sends every PUT/POST body route hostile values (paths, ``..``, URLs,
  dotted class names, huge strings, huge numbers): each is a 4xx with a reason, nothing outside
  the data directory and export root changes, the canary is never imported, the broker serves.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("pulsar")

from admin.harness import ROOT_DIR  # noqa: E402

from .adminhttp import SUPERUSER, start_secured_broker  # noqa: E402

pytestmark = pytest.mark.integration

CANARY = f"cmq_canary_{uuid.uuid4().hex[:12]}"
NS = "/admin/v2/namespaces/acme/ops"
TOPIC = "/admin/v2/persistent/acme/ops/t"


@pytest.fixture(scope="module")
def env(tmp_path_factory, pki):
    base = tmp_path_factory.mktemp("policy-values")
    sentinel = base / "sentinel"  # stands for everything of the broker's host outside its dirs
    sentinel.mkdir()
    (sentinel / "keep.txt").write_text("do not touch")
    canary_dir = base / "canary"
    canary_dir.mkdir()
    (canary_dir / f"{CANARY}.py").write_text(
        f"open({str(base / 'IMPORTED')!r}, 'w').close()\n\nclass Strategy:\n    pass\n"
    )
    export_root = base / "exports"
    export_root.mkdir()
    offload = base / "offload"
    offload.mkdir()
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(canary_dir), saved) if p)
    try:
        sb = start_secured_broker(
            base,
            pki,
            compactedExportRoot=str(export_root),
            compactedExportObjectStoreRoots="s3://approved-bucket/tables",
            managedLedgerOffloadDriver="filesystem",
            fileSystemURI=f"file://{offload}",
        )
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    admin = sb.as_token(SUPERUSER)
    admin.ok(
        "PUT", "/admin/v2/tenants/acme", {"adminRoles": ["acme-admin"], "allowedClusters": ["standalone"]}
    )
    admin.ok("PUT", NS)
    admin.ok("PUT", TOPIC)
    yield sb, base, export_root, offload
    sb.broker.stop()


def canary_imported(base: Path) -> bool:
    return (base / "IMPORTED").exists()


# --- compactedExport --------------------------------------------------------------------------


def test_export_location_is_derived_not_chosen(env):
    sb, base, export_root, _ = env
    acme = sb.as_token("acme-admin")
    data_dir = str(sb.broker.data_dir)
    for path in (data_dir, str(base / "sentinel"), str(export_root), "relative/dir", f"{export_root}/../x"):
        for where in (TOPIC, NS):
            reason = acme.error("POST", f"{where}/compactedExport", 412, {"path": path, "format": "parquet"})
            assert "derived" in reason, reason
    acme.ok("POST", f"{TOPIC}/compactedExport", {"format": "parquet"})
    got = acme.ok("GET", f"{TOPIC}/compactedExport")
    real = os.path.realpath(export_root)
    assert got["path"] == os.path.join(real, "persistent", "acme", "ops", "t"), got
    acme.ok("POST", f"{NS}/compactedExport", {"format": "delta", "view": "latest"})
    assert acme.ok("GET", f"{NS}/compactedExport")["path"] == os.path.join(real, "persistent", "acme", "ops")
    # the derived path itself may be sent back (a GET's body, PUT again)
    acme.ok("POST", f"{TOPIC}/compactedExport", got)


def test_export_object_store_roots_only_the_approved_ones(env):
    sb, *_ = env
    acme = sb.as_token("acme-admin")
    acme.ok("POST", f"{TOPIC}/compactedExport", {"format": "delta", "root": "s3://approved-bucket/tables"})
    assert acme.ok("GET", f"{TOPIC}/compactedExport")["path"] == (
        "s3://approved-bucket/tables/persistent/acme/ops/t"
    )
    for root in ("s3://my-bucket/x", "s3://approved-bucket", "s3://approved-bucket/tables/../other", "/tmp"):
        assert "compactedExportObjectStoreRoots" in acme.error(
            "POST", f"{TOPIC}/compactedExport", 412, {"format": "delta", "root": root}
        )
    assert "Delta" in acme.error(
        "POST", f"{TOPIC}/compactedExport", 412, {"format": "parquet", "root": "s3://approved-bucket/tables"}
    )
    acme.ok("DELETE", f"{TOPIC}/compactedExport")


# --- compactionStrategy -----------------------------------------------------------------------


def test_strategy_class_names_are_refused_without_importing(env):
    sb, base, *_ = env
    acme = sb.as_token("acme-admin")
    for name in (f"{CANARY}.Strategy", "multiprocessing.pool.Pool", "os.system", "subprocess.Popen"):
        for where in (TOPIC, NS):
            t0 = time.monotonic()
            reason = acme.error("POST", f"{where}/compactionStrategy", 412, name)
            assert "not allowed on this broker" in reason and time.monotonic() - t0 < 10, reason
    assert not canary_imported(base)
    acme.ok("POST", f"{TOPIC}/compactionStrategy", "keep-first")
    assert acme.ok("GET", f"{TOPIC}/compactionStrategy") == "keep-first"
    acme.ok("DELETE", f"{TOPIC}/compactionStrategy")
    assert sb.broker.alive()


def test_cli_reports_the_refusal_in_one_line(env):
    sb, base, *_ = env
    cmd = [
        sys.executable,
        "-m",
        "compactmq.cli.main",
        "--admin-url",
        sb.http_url,
        "--auth-plugin",
        "org.apache.pulsar.client.impl.auth.AuthenticationToken",
        "--auth-params",
        f"token:{sb.token('acme-admin')}",
    ]
    run = subprocess.run(
        [*cmd, "topics", "set-compaction-strategy", "persistent://acme/ops/t", "-s", f"{CANARY}.Strategy"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT_DIR,
    )
    assert run.returncode == 1 and "HTTP 412" in run.stderr and "not allowed" in run.stderr, run
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    run = subprocess.run(
        [*cmd, "namespaces", "set-offload-policies", "-d", "filesystem", "--fs-uri", "file:///", "acme/ops"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT_DIR,
    )
    assert run.returncode == 1 and "not allowed on this broker" in run.stderr, run
    assert not canary_imported(base)


# --- offloadPolicies --------------------------------------------------------------------------


def test_offload_policies_only_the_operators_locations(env):
    sb, base, _, offload = env
    acme = sb.as_token("acme-admin")
    acme.ok(
        "POST",
        f"{NS}/offloadPolicies",
        {"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": f"file://{offload}"},
    )
    for policy in (
        {"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": f"file://{sb.broker.data_dir}"},
        {"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": str(base / "sentinel")},
        {"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": f"file://{offload}/../sentinel"},
        {
            "managedLedgerOffloadDriver": "aws-s3",
            "s3ManagedLedgerOffloadBucket": "mine",
            "s3ManagedLedgerOffloadServiceEndpoint": "http://127.0.0.1:1",
        },
        {"managedLedgerOffloadDriver": "google-cloud-storage", "gcsManagedLedgerOffloadBucket": "mine"},
    ):
        assert "not allowed on this broker" in acme.error("POST", f"{NS}/offloadPolicies", 412, policy)
    acme.ok("DELETE", f"{NS}/removeOffloadPolicies")
