#!/usr/bin/env python3
"""Lists the modules over 600 lines and the functions over 80 lines under src/ (issue 29's limits).

    python scripts/code_shape.py [ROOT]      # ROOT defaults to src; exit status 1 when it lists any

Generated code (``*_pb2.py``) is skipped. Not part of check.sh: a reviewer's measure, not a gate.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MAX_MODULE_LINES, MAX_FUNCTION_LINES = 600, 80


def findings(root: Path) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        if path.name.endswith("_pb2.py"):
            continue
        text = path.read_text()
        if (lines := text.count("\n")) > MAX_MODULE_LINES:
            out.append(f"module   {lines:4d}  {path}")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    out.append(f"function {length:4d}  {path}:{node.lineno} {node.name}")
    return out


if __name__ == "__main__":
    found = findings(Path(sys.argv[1] if len(sys.argv) > 1 else "src"))
    print("\n".join(found) or "nothing over the limits")
    sys.exit(1 if found else 0)
