"""Child processes the tests start (brokers, object-store servers, Spark daemons) die with the
test process that started them.

Why: pytest-xdist talks to each worker over the worker's stdin and stdout. When a worker dies
hard (the official client's C++ library has segfaulted in ``Client.close``), a broker it had
started would live on as an orphan, holding a copy of the worker's stdin, and its own Spark JVM
with it; the controller then waited for that worker for ever, and the whole run hung instead of
reporting one failed test. ``KEEP`` is what every test ``Popen`` passes: the child's stdin is
``/dev/null`` (nothing of the worker's pipes is inherited) and Linux sends the child SIGTERM
when the thread that started it exits (``prctl(PR_SET_PDEATHSIG)``), so a broker stops -- and
stops its JVM -- as it would on Ctrl-C.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import signal
import subprocess
import sys

_PR_SET_PDEATHSIG = 1
_libc = (
    ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if sys.platform == "linux"
    else None
)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def keep(**kw) -> dict:
    """``Popen`` keyword arguments for a test's child process: ``kw`` plus stdin from
    ``/dev/null`` (unless ``kw`` names one) and death with its parent."""
    kw.setdefault("stdin", subprocess.DEVNULL)
    kw["preexec_fn"] = _die_with_parent
    return kw


def stop(proc: subprocess.Popen, grace: float) -> int:
    """SIGTERM ``proc``, SIGKILL it if it has not exited ``grace`` seconds later; its exit status."""
    proc.terminate()
    try:
        return proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
