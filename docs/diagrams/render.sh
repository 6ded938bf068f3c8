#!/usr/bin/env bash
# Renders every Graphviz source in this folder (*.dot) to an SVG beside it.
# Needs Graphviz's `dot` (Debian/Ubuntu: apt-get install graphviz).
# Usage: docs/diagrams/render.sh        (from anywhere)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if ! command -v dot >/dev/null 2>&1; then
    echo "render.sh: Graphviz's dot is not installed (apt-get install graphviz)" >&2
    exit 1
fi
for src in "$here"/*.dot; do
    out="${src%.dot}.svg"
    dot -Tsvg "$src" -o "$out"
    echo "rendered ${out#"$here"/}"
done
