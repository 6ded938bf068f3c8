"""Kill a compaction at many points (in a child process) and show the old view intact, then a
rerun succeeding with the expected view and no leftover files. The runs after the first extend
a chained view (``compaction.chain``), so the kills hit runs that write a few segments and a
manifest naming the old ones: no kill may leave a view naming a missing segment, nor delete one
the view in force names."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest

from compactmq.compaction import chain
from compactmq.compaction import compacted_ledger as cl
from compactmq.compaction.jobs import SparkCompactionService
from compactmq.compaction.jobs.session import TEST_CONF
from compactmq.config import load_config
from compactmq.protocol import pulsar_pb2 as pb
from compactmq.storage import Storage
from compactmq.compaction.state import states_of

from . import entries as E
from .reference import ReferenceCompactor

pytestmark = [pytest.mark.spark]

TOPIC = "persistent://public/default/crash"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (mode, arg, does the new view land?): the default run kills at four points, ``-m slow`` at
# the two others (each kill is a child process with a JVM of its own: about 13 s)
KILLS = [
    ("point", "planned", False),
    ("timer", "0.4", None),  # somewhere in phase one / two / commit: either view, never a mix
    ("point", "before-commit", False),
    ("point", "after-commit", True),
]
MORE_KILLS = [
    ("task", "-", False),
    ("point", "parts-written", False),
]


def _view(service):
    return [(tuple(p), E.decode(b)[1]) for p, b in service.read_compacted_entries((-1, -1), 10**9)], (
        tuple(service.get_last_compacted_position() or ())
    )


def _history(rng, n):
    out = []
    for _ in range(n):
        k = f"k{rng.randrange(40)}"
        if rng.random() < 0.3:
            out.append(
                E.batch(
                    [(f"k{rng.randrange(40)}", b"v%d" % rng.randrange(99), 0) for _ in range(3)],
                    codec=rng.choice([pb.NONE, pb.LZ4, pb.ZSTD]),
                )
            )
        else:
            out.append(E.single(k, b"" if rng.random() < 0.1 else b"x%d" % rng.randrange(999)))
    return out


# six children, each starting its own JVM, plus seven runs here: on CI's two cores shared with the
# other xdist worker that is over the default 300 s hang guard's comfort; a hang still fails
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "kills", [KILLS, pytest.param(MORE_KILLS, marks=pytest.mark.slow)], ids=["main", "more"]
)
def test_killed_compaction_leaves_old_view_then_rerun_succeeds(spark, tmp_path, kills):
    rng = random.Random(7)
    cfg = load_config(overrides={"managedLedgerMaxEntriesPerLedger": 500, "managedLedgerSyncData": False})
    storage = Storage(str(tmp_path), cfg)
    try:
        ml = storage.open_managed_ledger(TOPIC)
        service = SparkCompactionService(storage, TOPIC, cfg, spark_conf=TEST_CONF)
        model = ReferenceCompactor()

        def compact_here():
            model.compact(
                [(tuple(p), b) for p, b in ml.read_entries(ml.first_position(), 10**7)],
                tuple(ml.first_position()),
            )
            service.compact()
            assert _view(service)[0] == [(tuple(p), m) for p, m in model.view(tuple(ml.first_position()))]

        ml.append_many(_history(rng, 2000))
        compact_here()
        runs: list = []
        for mode, arg, lands in kills:
            ml.append_many(_history(rng, 1000))
            ml.rollover()  # what the broker does when a compact-topic job asks it to seal (storage.seal)
            before = _view(service)
            child = subprocess.run(
                [sys.executable, "-m", "tests.compaction.crash_child", str(tmp_path), TOPIC, mode, arg],
                cwd=ROOT,
                capture_output=True,
                timeout=240,
            )
            assert child.returncode != 0, child.stderr.decode()[-2000:]
            after = _view(service)
            if lands is False:
                assert after == before, (mode, arg)
            elif lands is True:
                assert after != before and after[1] > before[1], (mode, arg)
            else:
                assert after == before or after[1] > before[1], (mode, arg)
            # a rerun sweeps the dead run's files and lands the expected view
            compact_here()
            state = states_of(storage).get(TOPIC)
            assert cl.list_compacted_ledgers(tmp_path, TOPIC) == [state.compacted_ledger_id]
            names = os.listdir(cl.topic_dir(tmp_path, TOPIC))
            assert not [n for n in names if n.startswith("run-")]
            # the view is a chain (extended by the reruns, the first excepted): exactly the
            # segments it names are left, none of the dead run's nor of the replaced view's
            view = service.compacted_ledger()
            assert view.is_chain and {n for n in names if chain.SEGMENT_NAME.match(n)} == set(
                view.manifest.names()
            )
            runs.append(view.manifest.runs)
        # some killed runs extended a chain (every key is overwritten between kills here, so
        # the stale bound rewrites the chain every other run: 1, 2, 1, 2 ...)
        assert 2 in runs
    finally:
        storage.close()
