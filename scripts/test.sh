#!/usr/bin/env bash
# Quick start, command two: set up (if needed) and run the test suite.
# Extra arguments go to pytest (e.g. -m "not spark", -k storage). A run that collects no
# tests exits non-zero (pytest's exit code 5), so an empty run never passes silently.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
exec .venv/bin/python -m pytest "$@"
