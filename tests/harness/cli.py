"""The ``compactmq`` command run in this process: ``main(argv)`` with its streams captured.

``run_cli(*argv)`` answers a ``CliResult`` shaped like ``subprocess.CompletedProcess``
(``args``, ``returncode``, ``stdout``, ``stderr``), so a test reads the same whether the command
ran here or in a child process. What a child process would have given, this gives too:

- stdout and stderr are captured whole (a text stream with a binary ``buffer`` underneath, as a
  pipe has, so ``tokens create-secret-key`` can write raw bytes), and neither is a tty;
- argparse's ``SystemExit`` (usage errors: 2, ``--help``: 0) becomes the exit status, and an
  exception nothing caught is printed as a traceback with status 1, as the interpreter does;
- ``input`` is what the command reads on stdin; ``env`` adds to (or, with None values, removes
  from) the environment for the call only.

Nothing the command changes outlives the call: the standard streams, the environment, the root
logger's handlers and level, and the SIGINT/SIGTERM handlers are put back afterwards. The runner
refuses ``standalone``: a broker is a process, and tests start it as one (``harness.broker``).

``admin_cli(broker)`` is the runner with ``--admin-url`` pointing at a test broker.
"""

from __future__ import annotations

import io
import logging
import os
import signal
import sys
import traceback
from dataclasses import dataclass
from typing import Callable, Mapping, Union

Output = Union[str, bytes]


@dataclass
class CliResult:
    """What ``compactmq <args>`` did: the fields of a ``subprocess.CompletedProcess``."""

    args: list[str]
    returncode: int
    stdout: Output
    stderr: Output


class _Captured:
    """A text stream over a byte buffer, like the pipe a child process writes to."""

    def __init__(self) -> None:
        self.raw = io.BytesIO()
        self.stream = io.TextIOWrapper(self.raw, encoding="utf-8", errors="replace", write_through=True)

    def value(self, text: bool) -> Output:
        self.stream.flush()
        data = self.raw.getvalue()
        return data.decode("utf-8", errors="replace") if text else data


def _exit_status(e: SystemExit, err) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=err)  # sys.exit("message"): the interpreter prints it and exits 1
    return 1


def run_cli(
    *argv: str, input: str | None = None, env: Mapping[str, str | None] | None = None, text: bool = True
) -> CliResult:
    """Run ``compactmq *argv`` in this process (see the module docstring)."""
    from compactmq.cli.main import main

    args = [str(a) for a in argv]
    if _command(args) == "standalone":
        raise ValueError("run_cli does not start brokers in the test process; use harness.broker")
    out, err = _Captured(), _Captured()
    saved_streams = (sys.stdin, sys.stdout, sys.stderr)
    saved_env = {k: os.environ.get(k) for k in (env or {})}
    root = logging.getLogger()
    saved_logging = (list(root.handlers), root.level)
    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    sys.stdin = io.StringIO(input or "")
    sys.stdout, sys.stderr = out.stream, err.stream
    try:
        _set_env(env or {})
        try:
            code = main(args)
        except SystemExit as e:
            code = _exit_status(e, err.stream)
        except Exception:
            traceback.print_exc(file=err.stream)
            code = 1
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved_streams
        _set_env(saved_env)
        root.handlers[:], root.level = saved_logging[0], saved_logging[1]
        for s, handler in saved_signals.items():
            signal.signal(s, handler)
    return CliResult(["compactmq", *args], code, out.value(text), err.value(text))


#: the global options that take a value (``compactmq.cli.main.build_parser``)
_VALUED_GLOBALS = frozenset(
    (
        "--admin-url",
        "--output",
        "--auth-plugin",
        "--auth-params",
        "--tls-trust-cert-path",
        "--tls-cert-file",
        "--tls-key-file",
    )
)


def _command(args: list[str]) -> str | None:
    """The subcommand named in ``args`` (the first word that is not a global option or its value)."""
    it = iter(args)
    for word in it:
        if word in _VALUED_GLOBALS:
            next(it, None)
        elif not word.startswith("-"):
            return word
    return None


def _set_env(values: Mapping[str, str | None]) -> None:
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def admin_cli(broker) -> Callable[..., CliResult]:
    """``cli(*args, output=None, url=None)``: ``run_cli`` with the broker's ``--admin-url`` (or
    ``url``) and, when given, ``--output``, before the command's own arguments."""

    def cli(*args: str, output: str | None = None, url: str | None = None, **kw) -> CliResult:
        head = ["--admin-url", url or f"http://127.0.0.1:{broker.web_port}"]
        if output:
            head += ["--output", output]
        return run_cli(*head, *args, **kw)

    return cli
