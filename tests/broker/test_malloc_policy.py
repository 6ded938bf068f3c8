"""The standalone broker caps glibc's malloc arenas (``broker.malloc_policy``) unless the operator
set ``MALLOC_ARENA_MAX``. Checked in a fresh interpreter, so this test process keeps its own
allocator settings."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")

CODE = "from compactmq.broker import malloc_policy; print(malloc_policy.apply())"


def _apply(env: dict[str, str]) -> str:
    out = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_cap_is_set_on_glibc():
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    assert _apply(env) == "True"


def test_an_operators_malloc_arena_max_wins():
    assert _apply({**os.environ, "MALLOC_ARENA_MAX": "4"}) == "False"


def test_the_standalone_broker_trims_even_under_an_operators_arena_cap():
    """``apply`` lets ``malloc_policy.trim`` give freed memory back (after the inactive-topic
    sweep unloads topics), whoever set the arena cap; ``trim`` then calls ``malloc_trim``."""
    code = (
        "from compactmq.broker import malloc_policy as m; a = m.apply(); "
        "m.trim(); print(a, m.TRIM_ENABLED, m.trims)"
    )
    for env, applied in (({}, "True"), ({"MALLOC_ARENA_MAX": "4"}, "False")):
        base = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
        out = subprocess.run(
            [sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == [applied, "True", "1"]


MMAP_CODE = """
import ctypes, sys
from compactmq.broker import malloc_policy
if sys.argv[1] == "apply":
    malloc_policy.apply()
libc = ctypes.CDLL("libc.so.6")

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc.mallinfo2.restype = Info
big = bytearray(8 << 20)  # mapped, then freed: glibc would raise its threshold to 8 MiB
del big
blocks = [bytes(3 << 20) for _ in range(4)]  # 3 MiB each: mapped again only if the threshold held
print(libc.mallinfo2().hblks)
"""


def _mapped_blocks(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", MMAP_CODE, mode], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip())


def test_freed_big_blocks_go_back_to_the_system():
    """glibc's dynamic threshold would serve MiB-sized blocks from the heap after the first free
    of a mapped one (kept resident once freed); the standalone broker fixes it at 1 MiB."""
    assert _mapped_blocks("default") < 4  # the control: the threshold moved up to 8 MiB
    assert _mapped_blocks("apply") >= 4
