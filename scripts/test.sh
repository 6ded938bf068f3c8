#!/usr/bin/env bash
# Quick start, command two: set up (if needed) and run the test suite.
# Extra arguments go to pytest (e.g. -m "not spark", -k storage). A run that collects no
# tests exits non-zero (pytest's exit code 5), so an empty run never passes silently.
# The run is spread over COMPACTMQ_TEST_WORKERS pytest-xdist workers (default 2, CI's core count;
# 0 runs in this process), one test module at a time per worker (--dist loadfile: a module's broker
# starts once) in the order tests/conftest.py gives, JVM-starting modules first
# (--no-loadscope-reorder). Arguments given here come later and win, e.g. `-n 0`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
workers="${COMPACTMQ_TEST_WORKERS:-2}"
exec .venv/bin/python -m pytest -n "$workers" --dist loadfile --no-loadscope-reorder "$@"
