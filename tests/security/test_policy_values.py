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
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("pulsar")

from harness.cli import run_cli  # noqa: E402

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
        "PUT",
        "/admin/v2/tenants/acme",
        {"adminRoles": ["acme-admin", "ops", "acme-cert"], "allowedClusters": ["standalone"]},
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
    acme, *_ = admins = tenant_admins(sb)
    data_dir = str(sb.broker.data_dir)
    for path in (data_dir, str(base / "sentinel"), str(export_root), "relative/dir", f"{export_root}/../x"):
        for where in (TOPIC, NS):
            for admin in admins:
                body = {"path": path, "format": "parquet"}
                assert "derived" in admin.error("POST", f"{where}/compactedExport", 412, body)
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


def tenant_admins(sb):
    """The tenant's admin roles by each authentication method: token, basic (ops), TLS (https)."""
    return [sb.as_token("acme-admin"), sb.as_basic("ops"), sb.as_cert("acme-cert")]


def test_strategy_class_names_are_refused_without_importing(env):
    sb, base, *_ = env
    acme, *_ = admins = tenant_admins(sb)
    for name in (f"{CANARY}.Strategy", "multiprocessing.pool.Pool", "os.system", "subprocess.Popen"):
        for where in (TOPIC, NS):
            for admin in admins:
                t0 = time.monotonic()
                reason = admin.error("POST", f"{where}/compactionStrategy", 412, name)
                assert "not allowed on this broker" in reason and time.monotonic() - t0 < 10, reason
    assert not canary_imported(base)
    acme.ok("POST", f"{TOPIC}/compactionStrategy", "keep-first")
    assert acme.ok("GET", f"{TOPIC}/compactionStrategy") == "keep-first"
    acme.ok("DELETE", f"{TOPIC}/compactionStrategy")
    assert sb.broker.alive()


def test_cli_reports_the_refusal_in_one_line(env):
    sb, base, *_ = env
    cmd = [
        "--admin-url",
        sb.http_url,
        "--auth-plugin",
        "org.apache.pulsar.client.impl.auth.AuthenticationToken",
        "--auth-params",
        f"token:{sb.token('acme-admin')}",
    ]
    # in this process (harness.cli): the refusal is the broker's, the line is the command's
    run = run_cli(
        *cmd, "topics", "set-compaction-strategy", "persistent://acme/ops/t", "-s", f"{CANARY}.Strategy"
    )
    assert run.returncode == 1 and "HTTP 412" in run.stderr and "not allowed" in run.stderr, run
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    run = run_cli(
        *cmd, "namespaces", "set-offload-policies", "-d", "filesystem", "--fs-uri", "file:///", "acme/ops"
    )
    assert run.returncode == 1 and "not allowed on this broker" in run.stderr, run
    assert not canary_imported(base)


# --- offloadPolicies --------------------------------------------------------------------------


def test_offload_policies_only_the_operators_locations(env):
    sb, base, _, offload = env
    acme, *_ = admins = tenant_admins(sb)
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
        for admin in admins:
            assert "not allowed on this broker" in admin.error("POST", f"{NS}/offloadPolicies", 412, policy)
    acme.ok("DELETE", f"{NS}/removeOffloadPolicies")


# --- every PUT/POST body route, hostile values --------------------------------------------------

PATH_VALUES = {"tenant": "acme", "namespace": "ops", "topic": "t", "domain": "persistent", "role": "r"}
#: object bodies: a valid baseline, and the fields the sweep replaces one at a time
OBJECT_FIELDS: dict[str, tuple[dict, tuple[str, ...]]] = {
    "compactedExport": ({"format": "parquet"}, ("path", "root", "format", "view", "partitionBy")),
    "offloadPolicies": (
        {"managedLedgerOffloadDriver": "filesystem"},  # + the broker's own fileSystemURI (``env``)
        (
            "managedLedgerOffloadDriver",
            "fileSystemURI",
            "s3ManagedLedgerOffloadBucket",
            "s3ManagedLedgerOffloadRegion",
            "s3ManagedLedgerOffloadServiceEndpoint",
            "gcsManagedLedgerOffloadBucket",
            "managedLedgerOffloadThresholdInBytes",
        ),
    ),
    "retention": (
        {"retentionTimeInMinutes": 1, "retentionSizeInMB": 1},
        ("retentionTimeInMinutes", "retentionSizeInMB"),
    ),
    "autoTopicCreation": (
        {"allowAutoTopicCreation": True, "topicType": "partitioned", "defaultNumPartitions": 2},
        ("allowAutoTopicCreation", "topicType", "defaultNumPartitions"),
    ),
    "schema": ({"type": "STRING", "schema": ""}, ("type",)),
    "version": ({"type": "STRING", "schema": ""}, ("type",)),
    "compatibility": ({"type": "STRING", "schema": ""}, ("type",)),
    "offload": ({"ledgerId": 1, "entryId": 0}, ("ledgerId", "entryId")),
    "{tenant}": ({"adminRoles": ["acme-admin"]}, ("adminRoles", "allowedClusters")),  # superuser only
    "{namespace}": ({}, ("auth_policies",)),  # the namespace exists: 409 whatever the body
}


def body_routes():
    """``(method, path, suffix, body type)`` of every admin route that reads a request body."""
    from compactmq.admin.app import build_router

    out = []
    for route in build_router().routes:
        if route.method not in ("PUT", "POST"):
            continue
        suffix = route.pattern.rsplit("/", 1)[-1]
        if route.body is None and suffix != "{namespace}":
            continue  # the body is not read (topic creation, compaction and unload triggers)
        path = route.pattern
        for name, value in PATH_VALUES.items():
            path = path.replace("{" + name + "}", value)
        out.append((route.method, path, suffix, route.body))
    return out


def hostile_strings(base: Path, data_dir: Path) -> list[str]:
    return [
        str(data_dir),
        str(base / "sentinel"),
        f"{base / 'exports'}/../sentinel",
        "/",
        "/etc/passwd",
        "..",
        "../../..",
        "relative/dir",
        "~root/.ssh",
        "file:///",
        f"file://{data_dir}",
        "s3://evil-bucket/x",
        "gs://evil-bucket/x",
        "hdfs://evil:8020/x",
        "http://127.0.0.1:1/",
        "https://attacker.example/x?y=../..",
        f"{CANARY}.Strategy",
        "multiprocessing.pool.Pool",
        "os.system",
        "compactmq.compaction.jobs.SparkCompactionServiceFactory",
        "x" * 200_000,
    ]


def bodies_for(suffix: str, body_type: str | None, value, own_uri: str):
    yield value
    if body_type == "object" or suffix in OBJECT_FIELDS:
        baseline, fields = OBJECT_FIELDS[suffix]
        if suffix == "offloadPolicies":
            baseline = {**baseline, "fileSystemURI": own_uri}
        for field in fields:
            yield {**baseline, field: value}


def snapshot(base: Path, data_dir: Path) -> dict:
    """Every file and directory under ``base`` except the data directory and the broker's log."""
    out = {}
    for root, dirs, files in os.walk(base):
        if Path(root) == data_dir or data_dir in Path(root).parents:
            continue
        for name in dirs + files:
            p = Path(root) / name
            if p == data_dir or name.startswith("broker-") or name == "IMPORTED":
                continue
            st = p.lstat()
            out[str(p)] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


# Routes whose body is data, not a policy value: the many-keys lookup of ``.../latest`` takes a
# list of message keys, which are only hashed and compared (never a path, import or URL), so "/" or
# ".." is a key like any other. These must answer (a lookup, or 400 for a key over the length
# limit) without touching anything; the snapshot and canary checks below still cover them.
DATA_BODY_SUFFIXES = {"latest"}


def refused(client, method: str, path: str, body) -> None:
    status, out, _ = client.call(method, path, body)
    if path.rsplit("/", 1)[-1] in DATA_BODY_SUFFIXES:
        assert status in (200, 400), (method, path, str(body)[:200], status, out)
        return
    assert 400 <= status < 500, (method, path, str(body)[:200], status, out)
    assert isinstance(out, dict) and out.get("reason"), (method, path, str(body)[:200], out)
    assert len(out["reason"]) <= 1000


def serves(sb) -> None:
    """The broker still answers the admin API and the official client (produce, consume)."""
    from broker.conftest import make_client
    import pulsar

    assert sb.broker.alive()
    sb.as_token("acme-admin").ok("GET", f"{NS}/compactionThreshold")
    client = make_client(sb.broker.url, authentication=pulsar.AuthenticationToken(sb.token(SUPERUSER)))
    try:
        consumer = client.subscribe("persistent://acme/ops/alive", "s")
        client.create_producer("persistent://acme/ops/alive").send(b"still here")
        assert consumer.receive(10_000).data() == b"still here"
    finally:
        client.close()


def test_every_body_route_refuses_hostile_values(env):
    sb, base, _, offload = env
    data_dir = Path(sb.broker.data_dir)
    acme = sb.as_token("acme-admin")
    routes = body_routes()
    object_suffixes = {s for _, _, s, t in routes if t == "object"}
    assert object_suffixes <= set(OBJECT_FIELDS), (
        f"new object body routes to cover: {object_suffixes - set(OBJECT_FIELDS)}"
    )
    before = snapshot(base, data_dir)
    values = [*hostile_strings(base, data_dir), 2**70, -(2**70), ["..", "/"], {"path": "/"}]
    for method, path, suffix, body_type in routes:
        for value in values:
            for body in bodies_for(suffix, body_type, value, f"file://{offload}"):
                refused(acme, method, path, body)
    assert snapshot(base, data_dir) == before
    assert not canary_imported(base)
    serves(sb)


def test_random_hostile_values(env):
    """The same, with values hypothesis builds from the hostile seeds (bounded: ~200 requests)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    sb, base, _, offload = env
    data_dir = Path(sb.broker.data_dir)
    acme = sb.as_token("acme-admin")
    routes = body_routes()
    seeds = hostile_strings(base, data_dir)[:-1]
    value = st.one_of(
        st.sampled_from(seeds),
        st.builds(lambda a, b: a + b, st.sampled_from(seeds), st.text(max_size=40)),
        st.builds(lambda a, n: "/".join([a] + [".."] * n), st.sampled_from(seeds), st.integers(1, 20)),
        st.builds(lambda a: "x" * a, st.integers(100_000, 300_000)),
        st.lists(st.sampled_from(seeds), min_size=1, max_size=3),
    )
    before = snapshot(base, data_dir)

    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(route=st.sampled_from(routes), value=value, pick=st.integers(0, 20))
    def check(route, value, pick):
        method, path, suffix, body_type = route
        bodies = list(bodies_for(suffix, body_type, value, f"file://{offload}"))
        refused(acme, method, path, bodies[pick % len(bodies)])

    check()
    assert snapshot(base, data_dir) == before
    assert not canary_imported(base)
    serves(sb)
