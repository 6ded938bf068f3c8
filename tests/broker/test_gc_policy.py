"""The standalone broker's collector settings: the startup heap frozen, larger generations."""

from __future__ import annotations

import subprocess
import sys

from compactmq.broker import gc_policy


def test_apply_freezes_the_heap_and_sets_the_thresholds():
    # in a child process: the policy is process-wide and must not change the test runner's
    code = (
        "import gc; from compactmq.broker import gc_policy; gc_policy.apply(); "
        "print(gc.get_threshold(), gc.get_freeze_count() > 1000)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"{(gc_policy.YOUNG_THRESHOLD, *gc_policy.OLDER_THRESHOLDS)} True"
