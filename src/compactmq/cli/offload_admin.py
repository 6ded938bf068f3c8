"""Tiered-storage commands of ``compactmq topics|namespaces``, shaped like pulsar-admin's.

::

    compactmq topics offload --size-threshold 10M T     keep about 10 MiB locally, offload the rest
    compactmq topics offload-status [-w] T             NOT_RUN / RUNNING / SUCCESS / ERROR
    compactmq namespaces set-offload-threshold --size 10M [--time 1h] NS
    compactmq namespaces set-offload-deletion-lag --lag 1h NS
    compactmq namespaces set-offload-policies -d S3 -b BUCKET [-r REGION] [-e ENDPOINT] ... NS

``topics offload`` works out the message id on the client, as pulsar-admin does: walking the
ledgers from the newest, the first ledger whose addition brings the kept size past the
threshold is where offload stops; every ledger before the one after it is offloaded.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from ..config import policy_keys  # a policy's REST path under a namespace is its key
from ..errors import InvalidInput
from ..admin.policy_forms import CliForm
from .admin_client import AdminClient, namespace_path, topic_path
from .admin_client import run_command as _run
from .policies_admin import add_policy_commands
from .output import Output
from ..admin.units import parse_duration_seconds, parse_size


def first_ledger_within_threshold(ledgers: list[dict], threshold: int) -> dict | None:
    """The message id (as REST JSON) before which everything is offloaded, or None."""
    if not ledgers:
        return None
    suffix = 0
    previous = ledgers[-1]["ledgerId"]
    for led in reversed(ledgers):
        suffix += int(led.get("size", 0))
        if suffix > threshold:
            return {"ledgerId": previous, "entryId": 0, "partitionIndex": -1}
        previous = led["ledgerId"]
    return None


def _offload(a, c: AdminClient, out: Output) -> int:
    threshold = parse_size(a.size_threshold)
    stats = c.request("GET", f"{topic_path(a.topic)}/internalStats") or {}
    ledgers = stats.get("ledgers") or []
    if not ledgers:
        raise InvalidInput(f"{a.topic} has no data to offload")
    mid = first_ledger_within_threshold(ledgers, threshold)
    if mid is None:
        out.done(f"nothing to offload: {a.topic} holds no more than {a.size_threshold}")
        return 0
    c.request("PUT", f"{topic_path(a.topic)}/offload", mid)
    out.done(f"offload triggered for {a.topic} for messages before {mid['ledgerId']}:{mid['entryId']}")
    return 0


def render_status(st: dict) -> str:
    first = st.get("firstUnoffloadedMessage") or {}
    where = f" (first message not offloaded: {first.get('ledgerId')}:{first.get('entryId')})" if first else ""
    if st.get("status") == "ERROR":
        return f"ERROR: {st.get('lastError') or 'no reason given'}{where}"
    return f"{st.get('status')}{where}"


def _offload_status(a, c: AdminClient, out: Output) -> int:
    path = f"{topic_path(a.topic)}/offload"
    st = c.request("GET", path) or {}
    while a.wait_complete and st.get("status") == "RUNNING":
        time.sleep(0.5)
        st = c.request("GET", path) or {}
    out.result(st, render_status)
    if st.get("status") == "ERROR":
        if not out.json:
            print(f"compactmq: error: offload failed: {st.get('lastError')}", file=sys.stderr)
        return 1
    return 0


def _set_threshold(a, c: AdminClient, out: Output) -> int:
    if a.size is None and a.time is None:
        raise InvalidInput("give --size and/or --time")
    ns = namespace_path(a.namespace)
    if a.size is not None:
        c.request("PUT", f"{ns}/{policy_keys.OFFLOAD_THRESHOLD}", parse_size(a.size))
    if a.time is not None:
        c.request("PUT", f"{ns}/{policy_keys.OFFLOAD_THRESHOLD_SECONDS}", parse_duration_seconds(a.time))
    out.done(f"offload threshold set on {a.namespace}")
    return 0


def _policies_body(a) -> dict[str, Any]:
    body: dict[str, Any] = {"managedLedgerOffloadDriver": a.driver}
    for attr, key in (
        ("bucket", "s3ManagedLedgerOffloadBucket"),
        ("region", "s3ManagedLedgerOffloadRegion"),
        ("endpoint", "s3ManagedLedgerOffloadServiceEndpoint"),
        ("fs_uri", "fileSystemURI"),
    ):
        if getattr(a, attr):  # attr: one of the dests above, each defined by the parser
            body[key] = getattr(a, attr)
    if a.driver.lower() in ("google-cloud-storage", "gcs") and a.bucket:
        body["gcsManagedLedgerOffloadBucket"] = body.pop("s3ManagedLedgerOffloadBucket")
    if a.max_block_size:
        body["s3ManagedLedgerOffloadMaxBlockSizeInBytes"] = parse_size(a.max_block_size)
    if a.read_buffer_size:
        body["s3ManagedLedgerOffloadReadBufferSizeInBytes"] = parse_size(a.read_buffer_size)
    if a.offload_after_threshold:
        body["managedLedgerOffloadThresholdInBytes"] = parse_size(a.offload_after_threshold)
    if a.offload_after_threshold_in_seconds:
        body["managedLedgerOffloadThresholdInSeconds"] = parse_duration_seconds(
            a.offload_after_threshold_in_seconds
        )
    if a.offload_deletion_lag is not None:
        body["managedLedgerOffloadDeletionLagInMillis"] = (
            parse_duration_seconds(a.offload_deletion_lag) * 1000
        )
    return body


def _get(path_suffix: str, render):
    return _run(
        lambda a, c, o: o.result(c.request("GET", f"{namespace_path(a.namespace)}/{path_suffix}"), render)
    )


def _deletion_lag_args(p) -> None:
    p.add_argument("-l", "--lag", required=True, help="e.g. 10m, 4h, 0")


def _offload_policies_args(p) -> None:
    p.add_argument("-d", "--driver", required=True, help="aws-s3, S3, google-cloud-storage or filesystem")
    p.add_argument("-b", "--bucket", help="bucket (aws-s3, S3, google-cloud-storage)")
    p.add_argument("-r", "--region", help="region of the bucket")
    p.add_argument("-e", "--endpoint", help="endpoint of an S3-compatible service")
    p.add_argument("--fs-uri", help="fileSystemURI of the filesystem driver (file:///..., hdfs://...)")
    p.add_argument("-mbs", "--maxBlockSize", dest="max_block_size", help="block size, e.g. 64M")
    p.add_argument("-rbs", "--readBufferSize", dest="read_buffer_size", help="read buffer size, e.g. 1M")
    p.add_argument("-t", "--offloadAfterThreshold", dest="offload_after_threshold", help="e.g. 10G")
    p.add_argument(
        "-ts", "--offloadAfterThresholdInSeconds", dest="offload_after_threshold_in_seconds", help="e.g. 1d"
    )
    p.add_argument(
        "-dl",
        "--offloadDeletionLagInMillis",
        dest="offload_deletion_lag",
        help="deletion lag, e.g. 4h (named after Pulsar's flag; a duration)",
    )


#: the namespace-level offload policies with pulsar-admin's set-/get-/remove- (or clear-) verbs
OFFLOAD_POLICIES = (
    (
        policy_keys.OFFLOAD_DELETION_LAG,  # its REST path is its key
        CliForm(
            "offload-deletion-lag",
            _deletion_lag_args,
            lambda a: parse_duration_seconds(a.lag) * 1000,
            lambda b: "not set" if b is None else f"{b} ms",
            namespace_set_method="PUT",
            remove_verb="clear",
            helps=(
                "how long after offload the local copy of a ledger is deleted",
                "the namespace's offload deletion lag",
                "fall back to the broker's deletion lag",
            ),
        ),
    ),
    (
        policy_keys.OFFLOAD_POLICIES,
        CliForm(
            "offload-policies",
            _offload_policies_args,
            _policies_body,
            lambda b: "not set" if not b else " ".join(f"{k}={v}" for k, v in sorted(b.items())),
            helps=(
                "where and when the namespace's topics offload",
                "the namespace's offload policies",
                "remove the namespace's offload policies",
            ),
        ),
    ),
)


def add_commands(topics, namespaces) -> None:
    """Add the offload commands to the ``topics`` and ``namespaces`` sub-parsers."""
    p = topics.add_parser("offload", help="offload a topic's older ledgers to the configured object store")
    p.add_argument("topic")
    p.add_argument(
        "-s",
        "--size-threshold",
        required=True,
        help="data to keep in the broker's local storage, e.g. 10M; the rest is offloaded",
    )
    p.set_defaults(func=_run(_offload))
    p = topics.add_parser("offload-status", help="status of the last offload of a topic")
    p.add_argument("topic")
    p.add_argument(
        "-w", "--wait-complete", action="store_true", help="wait while it runs; exit 1 if it fails"
    )
    p.set_defaults(func=_run(_offload_status))

    p = namespaces.add_parser(
        "set-offload-threshold", help="bytes (and/or age) after which ledgers are offloaded"
    )
    p.add_argument("namespace", help="tenant/namespace")
    p.add_argument(
        "-s", "--size", help="data kept locally per topic, e.g. 10M (-1: never offload, 0: at once)"
    )
    p.add_argument("--time", help="offload ledgers older than this, e.g. 1h (-1: never)")
    p.set_defaults(func=_run(_set_threshold))
    p = namespaces.add_parser("get-offload-threshold", help="the namespace's offload threshold in bytes")
    p.add_argument("namespace")
    p.set_defaults(
        func=_get(policy_keys.OFFLOAD_THRESHOLD, lambda b: "not set" if b is None else f"{b} bytes")
    )

    add_policy_commands(namespaces, "namespace", namespace_path, OFFLOAD_POLICIES)
