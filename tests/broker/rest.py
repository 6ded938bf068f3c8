"""Small helpers for integration tests that drive the broker's public HTTP and CLI interfaces:
``rest(broker, METHOD, path, body)`` answers (status, parsed JSON body or None), ``cli(broker,
*args)`` runs the ``compactmq`` command against the broker's admin URL (in this process, through
``main(argv)``: ``harness.cli``). They live in ``tests/harness``; this module keeps their names."""

from __future__ import annotations

from harness.cli import CliResult, run_cli
from harness.http import ok, rest, web
from harness.wait import wait_until

__all__ = ["cli", "ok", "rest", "wait_until", "web"]


def cli(broker, *args: str) -> CliResult:
    return run_cli("--admin-url", web(broker), *args)
