#!/usr/bin/env bash
# Sets up everything compactmq needs on a fresh machine, idempotently:
#   - Java 17 for Spark (from the system package manager, only when `java` is missing)
#   - Apache ZooKeeper for the metadata-store tests (Debian's `zookeeper` package, only when its
#     jar is missing and ZOOKEEPER_JAR names no other; the tests start their own server from it)
#   - a virtualenv in .venv with compactmq and its test dependencies
# Re-running is cheap: pip is skipped while pyproject.toml is unchanged.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

say() { printf '[setup] %s\n' "$*" >&2; }

if ! command -v java >/dev/null 2>&1; then
    say "java not found: installing OpenJDK 17 for Spark (apt-get)"
    if ! command -v apt-get >/dev/null 2>&1; then
        say "no apt-get here: install Java 17 yourself and put it on PATH, then re-run"; exit 1
    fi
    sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq openjdk-17-jre-headless >/dev/null
fi

# ZooKeeper 3.8 from Debian: the distribution's signed package, no download outside the package
# manager; it installs jars and scripts only (no service starts), and the tests launch the server
if [ -z "${ZOOKEEPER_JAR:-}" ] && [ ! -f /usr/share/java/zookeeper.jar ]; then
    say "ZooKeeper not found: installing Debian's zookeeper package for the metadata-store tests (apt-get)"
    if ! command -v apt-get >/dev/null 2>&1; then
        say "no apt-get here: install ZooKeeper 3.6+ and set ZOOKEEPER_JAR to its classpath, then re-run"; exit 1
    fi
    sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends zookeeper >/dev/null
fi

python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    say "creating virtualenv .venv with $($python --version)"
    "$python" -m venv .venv
fi

stamp=".venv/.compactmq-installed"
# the install compiles the extensions from setup.py, _scan.c and _wire.c: a change to any reinstalls
want="$(cat pyproject.toml setup.py src/compactmq/compaction/_scan.c src/compactmq/protocol/_wire.c | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    say "installing compactmq and its dependencies into .venv (pyspark is large: about a minute on first run)"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e ".[test,fast,spark]"
    echo "$want" > "$stamp"
fi
scan="$(.venv/bin/python -c 'from compactmq.compaction import native; print(native.describe())' 2>/dev/null)"
say "compaction entry scan: ${scan:-unknown}"
say "ready: $(.venv/bin/python --version), $(java -version 2>&1 | head -1)"
