"""Sealing a topic's current ledger for a compact-topic job (``storage.seal``): the running
writer answers a request filed in the metadata store; with no writer, the job seals itself; a
compaction run of a read-only Storage reads the sealed ledgers only."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from compactmq.config import load_config
from compactmq.errors import TopicNotFound
from compactmq.storage import Storage
from compactmq.storage.position import LEDGER_CLOSED, LEDGER_OPEN, Position
from compactmq.storage.seal import NOT_SEALED, SEALED_BY_BROKER, SEALED_HERE, seal_before_compaction

SRC = str(Path(__file__).resolve().parents[2] / "src")
TOPIC = "persistent://public/default/seal-me"


def cfg():
    return load_config(overrides={"managedLedgerSyncData": False})


def test_a_running_writer_seals_on_request(tmp_path):
    data = tmp_path / "data"
    writer = Storage(data, cfg())
    try:
        ml = writer.open_managed_ledger(TOPIC)
        for i in range(7):
            ml.append(b"e%d" % i)
        current = ml.ledgers()[-1]
        assert current.state == LEDGER_OPEN and current.entry_count == 7
        # the job's side: the directory is locked, so it asks, and the writer's watcher answers
        t0 = time.monotonic()
        assert seal_before_compaction(data, cfg(), TOPIC, timeout=20) == SEALED_BY_BROKER
        assert time.monotonic() - t0 < 10
        infos = ml.ledgers()
        sealed = next(i for i in infos if i.ledger_id == current.ledger_id)
        assert sealed.state == LEDGER_CLOSED and sealed.entry_count == 7
        assert infos[-1].state == LEDGER_OPEN and infos[-1].entry_count == 0
        # appends go on in the new ledger; the request is gone
        assert ml.append(b"after")[0] == infos[-1].ledger_id
        assert writer.metadata_store.get_children("/compactmq/seal-requests") == []
    finally:
        writer.close()


def test_unknown_topic_is_an_error_with_and_without_a_writer(tmp_path):
    data = tmp_path / "data"
    Storage(data, cfg()).close()
    with pytest.raises(TopicNotFound):
        seal_before_compaction(data, cfg(), "persistent://public/default/nope", timeout=5)
    writer = Storage(data, cfg())
    try:
        with pytest.raises(TopicNotFound):
            seal_before_compaction(data, cfg(), "persistent://public/default/nope", timeout=5)
    finally:
        writer.close()


def test_a_writer_that_does_not_answer_times_out(tmp_path):
    data = tmp_path / "data"
    writer = Storage(data, cfg())
    try:
        writer.open_managed_ledger(TOPIC).append(b"x")
        writer._seal_watcher.stop()  # a hung broker
        assert seal_before_compaction(data, cfg(), TOPIC, timeout=0.5) == NOT_SEALED
        assert writer.open_managed_ledger(TOPIC).ledgers()[-1].state == LEDGER_OPEN
    finally:
        writer.close()


def test_without_a_writer_the_job_seals_a_ledger_a_crash_left_open(tmp_path):
    data = tmp_path / "data"
    # a writer that dies without closing: its ledger stays OPEN in the metadata store
    code = (
        f"import os; from compactmq.storage import Storage; from compactmq.config import load_config\n"
        f"s = Storage({str(data)!r}, load_config(overrides={{'managedLedgerSyncData': True}}))\n"
        f"ml = s.open_managed_ledger({TOPIC!r})\n"
        "for i in range(5): ml.append(b'c%d' % i)\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": SRC}, timeout=60)
    ro = Storage(data, cfg(), read_only=True)
    try:
        assert [i.state for i in ro.topic_metadata.ledgers(TOPIC)] == [LEDGER_OPEN]
    finally:
        ro.close()
    assert seal_before_compaction(data, cfg(), TOPIC, timeout=5) == SEALED_HERE
    ro = Storage(data, cfg(), read_only=True)
    try:
        infos = ro.topic_metadata.ledgers(TOPIC)
        assert [(i.state, i.entry_count) for i in infos] == [(LEDGER_CLOSED, 5)]
        # the lock was released: a broker can start right after
        Storage(data, cfg()).close()
    finally:
        ro.close()


def test_a_read_only_run_plans_over_sealed_ledgers_only(tmp_path):
    from compactmq.compaction.runner import CompactionRunner

    data = tmp_path / "data"
    writer = Storage(data, cfg())
    try:
        ml = writer.open_managed_ledger(TOPIC)
        for i in range(4):
            ml.append(b"s%d" % i)
        ml.rollover()
        sealed_id = ml.ledgers()[0].ledger_id
        ml.append(b"unsealed")  # in the ledger being written
        ro = Storage(data, cfg(), read_only=True)
        try:
            runner = CompactionRunner(ro, TOPIC, cfg(), engine=None)
            assert runner._last_sealed(runner._managed_ledger()) == Position(sealed_id, 3)
        finally:
            ro.close()
        # the writer's own runs seal first and read everything
        runner = CompactionRunner(writer, TOPIC, cfg(), engine=None)
        last = runner._last_sealed(runner._managed_ledger())
        assert last is not None and last[0] > sealed_id and ml.ledgers()[-2].state == LEDGER_CLOSED
    finally:
        writer.close()


def test_the_writers_run_plans_no_entry_appended_after_an_empty_rollover(tmp_path):
    """The broker's own run rolls the current ledger over before it plans; a rollover that finds
    the current ledger empty seals nothing, and an entry appended right then is in the ledger
    being written: the plan ends at the last sealed entry, not there (a ledger being written
    has no single object in cluster mode, and Spark failed to read its key prefix)."""
    from compactmq.compaction.runner import CompactionRunner

    data = tmp_path / "data"
    writer = Storage(data, cfg())
    try:
        ml = writer.open_managed_ledger(TOPIC)
        for i in range(3):
            ml.append(b"s%d" % i)
        ml.rollover()  # the current ledger is empty now
        sealed_id = ml.ledgers()[-2].ledger_id
        runner = CompactionRunner(writer, TOPIC, cfg(), engine=None)
        run_ml = runner._managed_ledger()
        real = run_ml.rollover

        def rollover() -> bool:
            rolled = real()  # nothing to seal
            ml.append(b"during the plan")  # a producer's entry, right after
            return rolled

        run_ml.rollover = rollover
        assert runner._last_sealed(run_ml) == Position(sealed_id, 2)
    finally:
        writer.close()


def test_a_job_in_another_process_is_answered_through_the_embedded_store(tmp_path):
    data = tmp_path / "data"
    writer = Storage(data, cfg())
    try:
        ml = writer.open_managed_ledger(TOPIC)
        ml.append(b"x")
        current = ml.ledgers()[-1].ledger_id
        code = (
            "from compactmq.config import load_config\n"
            "from compactmq.storage.seal import seal_before_compaction\n"
            f"print(seal_before_compaction({str(data)!r}, load_config(), {TOPIC!r}, timeout=20))\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], env={"PYTHONPATH": SRC}, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == SEALED_BY_BROKER
        assert next(i for i in ml.ledgers() if i.ledger_id == current).state == LEDGER_CLOSED
        assert writer.metadata_store.get_children("/compactmq/seal-requests") == []
    finally:
        writer.close()


def test_the_writer_answers_through_zookeeper(tmp_path, zookeeper):
    import uuid

    url = f"zk:{zookeeper.hosts}/seal{uuid.uuid4().hex[:8]}"
    config = load_config(overrides={"managedLedgerSyncData": False, "metadataStoreUrl": url})
    data = tmp_path / "data"
    writer = Storage(data, config)
    try:
        ml = writer.open_managed_ledger(TOPIC)
        ml.append(b"x")
        current = ml.ledgers()[-1].ledger_id
        assert seal_before_compaction(data, config, TOPIC, timeout=20) == SEALED_BY_BROKER
        assert next(i for i in ml.ledgers() if i.ledger_id == current).state == LEDGER_CLOSED
        with pytest.raises(TopicNotFound):
            seal_before_compaction(data, config, "persistent://public/default/nope", timeout=10)
        assert writer.metadata_store.get_children("/compactmq/seal-requests") == []
    finally:
        writer.close()
