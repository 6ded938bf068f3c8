"""Automatic offload, as Pulsar does it: when a topic keeps more than its threshold locally
(namespace ``offloadThreshold``, else ``offloadPolicies``' threshold, else the broker's
``managedLedgerOffloadAutoTriggerSizeThresholdBytes``), sealed ledgers are offloaded, oldest first,
checked at ledger rollover and on the monitor's pass; ``offloadThresholdInSeconds`` offloads by
age. Thresholds are set with the CLI (``namespaces set-offload-threshold``)."""

from __future__ import annotations

import pytest

pytest.importorskip("pulsar")

from admin.harness import Http, start_broker, topic_path, web_url  # noqa: E402
from admin.test_offload_rest import (  # noqa: E402
    cli,
    ledger_files,
    new_namespace,
    produce,
    read_all,
    tiered,  # noqa: F401 - the fixture
    wait_until,
)

pytestmark = [pytest.mark.integration]


def stats_of(http: Http, topic: str) -> dict:
    return http.ok("GET", topic_path(topic) + "/internalStats")


def test_size_threshold_set_with_the_cli_offloads_sealed_ledgers(tiered):  # noqa: F811
    broker, http, objects = tiered
    ns = new_namespace(http)
    topic = f"persistent://{ns}/auto"
    sent = produce(broker, topic, 60)
    assert not any(led["offloaded"] for led in stats_of(http, topic)["ledgers"])
    one = max(led["size"] for led in stats_of(http, topic)["ledgers"])

    # keep about two ledgers locally: the next rollover (or the monitor) offloads the rest
    r = cli(broker, "namespaces", "set-offload-threshold", "--size", str(2 * one), ns)
    assert r.returncode == 0, r
    sent += produce(broker, topic, 90)

    def settled():
        # the monitor may still roll the full last ledger and offload another one meanwhile:
        # wait for a moment where stats, the broker's disk and the store agree
        ledgers = stats_of(http, topic)["ledgers"]
        local = [led for led in ledgers if not led["offloaded"]]
        kept = sum(led["size"] for led in local)
        n_off = len(ledgers) - len(local)
        return (
            kept <= 2 * one
            and all(led["localCopyDeleted"] for led in ledgers if led["offloaded"])
            and len(objects()) == 2 * n_off
            and len(ledger_files(broker, topic)) == len(local)
            and ledgers == stats_of(http, topic)["ledgers"]
            and ledgers
        )

    ledgers = wait_until(settled, what="automatic offload")
    offloaded = [led["ledgerId"] for led in ledgers if led["offloaded"]]
    assert len(offloaded) >= 3 and offloaded == [led["ledgerId"] for led in ledgers[: len(offloaded)]]
    assert [(k, v) for k, v, _ in read_all(broker, topic)] == sent

    # -1: never; the namespace policy wins over the broker's default
    r = cli(broker, "namespaces", "set-offload-threshold", "--size", "-1", ns)
    assert r.returncode == 0, r
    first_new = ledgers[-1]["ledgerId"]
    produce(broker, topic, 75)  # three full ledgers
    wait_until(
        lambda: (
            (ls := stats_of(http, topic)["ledgers"])[-1]["entries"] == 0
            and ls[-1]["ledgerId"] > first_new + 2
        ),
        what="the monitor rolled the last full ledger",
    )
    # a manual offload of what is already offloaded (nothing new), queued behind any automatic check
    first_local = ledgers[len(offloaded)]["ledgerId"]
    http.ok("PUT", topic_path(topic) + "/offload", {"ledgerId": first_local, "entryId": 0})
    wait_until(
        lambda: http.ok("GET", topic_path(topic) + "/offload")["status"] == "SUCCESS", what="offload SUCCESS"
    )
    ledgers = stats_of(http, topic)["ledgers"]
    assert [led["ledgerId"] for led in ledgers if led["offloaded"]] == offloaded


def test_age_threshold_offloads_old_ledgers(tiered):  # noqa: F811
    broker, http, _ = tiered
    ns = new_namespace(http)
    topic = f"persistent://{ns}/aged"
    http.ok("PUT", f"/admin/v2/namespaces/{ns}/offloadThresholdInSeconds", 0)
    sent = produce(broker, topic, 80)
    ledgers = wait_until(
        lambda: (ls := stats_of(http, topic)["ledgers"]) and all(led["offloaded"] for led in ls[:-1]) and ls,
        what="offload by age",
    )
    assert len(ledgers) >= 4 and not ledgers[-1]["offloaded"]  # the ledger being written stays
    assert [(k, v) for k, v, _ in read_all(broker, topic)] == sent


def test_namespace_offload_policies_bring_their_own_driver(tmp_path):
    """A broker with no driver configured: a namespace's offloadPolicies name the store (one the
    operator allowed) and the threshold, and its topics offload there on their own."""
    store = tmp_path / "ns-store"
    broker = start_broker(
        tmp_path / "data",
        in_process=True,
        managedLedgerMaxEntriesPerLedger="20",
        retentionCheckIntervalInSeconds="1",
        managedLedgerOffloadDeletionLagMs="0",
        defaultRetentionTimeInMinutes="-1",
        defaultRetentionSizeInMB="-1",
        # namespace policies may name only places the operator allowed (docs/security.md)
        managedLedgerOffloadAllowedLocations=f"filesystem=file://{store}",
    )
    try:
        http = Http(web_url(broker))
        ns = new_namespace(http)
        r = cli(
            broker,
            "namespaces",
            "set-offload-policies",
            "-d",
            "filesystem",
            "--fs-uri",
            f"file://{store}",
            "-t",
            "0",
            ns,
        )
        assert r.returncode == 0, r
        topic = f"persistent://{ns}/own"
        other = "persistent://public/default/not-offloaded"
        sent = produce(broker, topic, 70)
        produce(broker, other, 70)
        ledgers = wait_until(
            lambda: (
                (ls := stats_of(http, topic)["ledgers"]) and all(led["offloaded"] for led in ls[:-1]) and ls
            ),
            what="offload through the namespace's policies",
        )
        assert all(store.name in (led.get("offloadLocation") or "") for led in ledgers[:-1])
        assert len([p for p in store.rglob("*") if p.is_file()]) == 2 * (len(ledgers) - 1)
        assert not any(led["offloaded"] for led in stats_of(http, other)["ledgers"])
        assert [(k, v) for k, v, _ in read_all(broker, topic)] == sent
        # without policies and without a driver, a manual offload is refused
        r = cli(broker, "namespaces", "remove-offload-policies", ns)
        assert r.returncode == 0, r
        assert "no offload driver" in http.error(
            "PUT", topic_path(topic) + "/offload", 412, {"ledgerId": ledgers[-1]["ledgerId"], "entryId": 0}
        )
    finally:
        broker.stop()
