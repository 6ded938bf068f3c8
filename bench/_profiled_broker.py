"""``compactmq`` (the CLI, arguments as given) with cProfile switched by signals, for
``latency_profile.py``: SIGUSR1 starts profiling the main thread (the event loop), SIGUSR2 stops
it and writes the stats to ``$PROFILE_OUT``."""

from __future__ import annotations

import cProfile
import os
import runpy
import signal
import sys

_prof = cProfile.Profile()


def _on(_sig, _frame) -> None:
    _prof.enable()


def _off(_sig, _frame) -> None:
    _prof.disable()
    _prof.dump_stats(os.environ["PROFILE_OUT"])


signal.signal(signal.SIGUSR1, _on)
signal.signal(signal.SIGUSR2, _off)
sys.argv = ["compactmq", *sys.argv[1:]]
runpy.run_module("compactmq.cli.main", run_name="__main__")
