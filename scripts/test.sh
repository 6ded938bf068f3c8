#!/usr/bin/env bash
# Quick start, command two: set up (if needed) and run the test suite.
# Extra arguments go to pytest (e.g. -m "not spark", -k storage). A run that collects no
# tests exits non-zero (pytest's exit code 5), so an empty run never passes silently.
# The run is spread over COMPACTMQ_TEST_WORKERS pytest-xdist workers (default 4 on CI's 2 cores:
# the suite mostly waits -- on brokers, clients, timers -- so two more workers fill the cores
# the first two leave idle; 0 runs in this process), one test module at a time per worker (--dist loadfile: a module's broker
# starts once) in the order tests/conftest.py gives, JVM-starting modules first
# (--no-loadscope-reorder); the modules that need a SparkSession (1 GiB heap at most) run in
# "lanes" on half the workers, so only those start one (tests/harness/spark_lanes.py). Arguments given here come later and win, e.g. `-n 0`.
# A test whose worker process died under it (the official client's C++ library has segfaulted
# in Client.close, pulsar-client-cpp#550) is run once more, alone, in one process -- only when
# every failure of the run was such a crash; any ordinary failure fails the run as it is.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
# bytecode: every process of the run (the xdist workers, the ~150+ broker and other subprocesses,
# the Spark Python workers) imports compactmq; with PYTHONDONTWRITEBYTECODE set (as on CI) none of
# them finds a .pyc in a fresh clone and each compiles src/ again (1.3 s of CPU for an import of
# the broker cold, 0.3 s from .pyc), and each worker rewrites every test module's asserts again
# (a collection is 10 s of CPU cold, 3 s from pytest's cache). So the run writes bytecode
# (__pycache__ is ignored by git): src/ and tests/ compiled once here, and one collection in the
# background, beside the class archive's JVM, writes pytest's rewritten test modules before the
# workers start (4 cold collections at once: 38 s of CPU; the one ahead and 4 warm: 25 s)
unset PYTHONDONTWRITEBYTECODE
.venv/bin/python -m compileall -q src tests >/dev/null || true  # only a cache, like the collection below
.venv/bin/python -m pytest --collect-only -q -p no:cacheprovider >/dev/null 2>&1 &
collecting=$!
# the test JVMs map Spark's classes from a class-data-sharing archive instead of loading them
# again each time (tests/harness/jvm_archive.py): recorded once per Java and PySpark, ~40 s of CPU
# the first time, about 4 s of CPU saved on each of the test run's Spark JVMs (the broker's own
# quick start never needs it, so setup.sh does not make it)
echo "[test] test JVMs' class archive: $(.venv/bin/python tests/harness/jvm_archive.py 2>&1 | tail -1)"
wait "$collecting" || true  # only a cache: the run itself reports any collection error
workers="${COMPACTMQ_TEST_WORKERS:-4}"
report="$(mktemp -d)/junit.xml"
rc=0
.venv/bin/python -m pytest -n "$workers" --dist loadfile --no-loadscope-reorder --junitxml="$report" "$@" || rc=$?
if [ "$rc" -ne 1 ] || [ ! -s "$report" ]; then
    exit "$rc"
fi
mapfile -t crashed < <(.venv/bin/python scripts/crashed_tests.py "$report" | grep -v '^$' || true)
if [ "${#crashed[@]}" -eq 0 ]; then
    exit "$rc"
fi
echo "[test] ${#crashed[@]} test(s) failed only because their worker process crashed; running them again in one process:" >&2
printf '[test]   %s\n' "${crashed[@]}" >&2
exec .venv/bin/python -m pytest -n 0 -p no:cacheprovider "${crashed[@]}"
