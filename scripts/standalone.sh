#!/usr/bin/env bash
# Quick start, command one: set up (if needed) and run the standalone broker with embedded
# defaults: data under ./data, SQLite metadata, Spark in local mode started when first needed.
# Extra arguments go to `compactmq standalone` (e.g. --broker-port 6651 --web-port 8081).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
exec "$root/.venv/bin/compactmq" standalone --data-dir "${COMPACTMQ_DATA_DIR:-$root/data}" "$@"
