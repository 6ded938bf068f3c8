"""Fail when a module of src/compactmq imports a package on a higher layer (DESIGN §3).

Layers, lowest first: config, errors, naming (0) - protocol (1) - storage (2) - compaction,
auth (3) - broker (4) - admin, spark adapters (5) - cli (6). A package may import its own layer
and those below. Imports under ``if TYPE_CHECKING:`` are annotations only and are not counted;
``importlib.import_module("compactmq.x")`` with a literal name is. A package missing from the
table is an error too, so a new package has to be placed before it can be merged.

usage: python scripts/check_layers.py [SRC_DIR]   (default: src/compactmq)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

LAYER = {
    "config": 0,
    "errors": 0,
    "naming": 0,
    "protocol": 1,
    "storage": 2,
    "compaction": 3,
    "auth": 3,
    "broker": 4,
    "admin": 5,
    "spark": 5,
    "cli": 6,
}
#: temporary exceptions, each with what removes it: "path under src/compactmq:imported package".
#: (none today: keep it that way)
ALLOWED: set[str] = set()


def guarded_lines(tree: ast.AST) -> set[int]:
    """Line numbers inside ``if TYPE_CHECKING:`` blocks."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", "")
            if name == "TYPE_CHECKING":
                for sub in node.body:
                    out.update(n.lineno for n in ast.walk(sub) if hasattr(n, "lineno"))
    return out


def imported_packages(node: ast.AST, package: list[str]) -> list[str]:
    """The top-level compactmq packages one statement imports (``package``: where it stands)."""
    names: list[list[str]] = []
    if isinstance(node, ast.Import):
        names = [a.name.split(".") for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        module = (node.module or "").split(".") if node.module else []
        if node.level == 0:
            names = [module + [a.name] for a in node.names] if module == ["compactmq"] else [module]
        else:
            base = package[: len(package) - (node.level - 1)] if node.level - 1 <= len(package) else None
            if base is None:
                return []
            full = base + module
            names = [["compactmq", *full]] if full else [["compactmq", a.name] for a in node.names]
    elif isinstance(node, ast.Call):
        f = node.func
        fname = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        if fname in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
            names = [str(node.args[0].value).split(".")]
    return [n[1] for n in names if len(n) > 1 and n[0] == "compactmq" and not n[1].startswith("__")]


def main() -> int:
    src = Path(sys.argv[1] if len(sys.argv) > 1 else "src/compactmq")
    problems = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).with_suffix("").parts
        if rel[0] == "__init__" or path.name.endswith("_pb2.py"):
            continue
        me = rel[0]
        if me not in LAYER:
            problems.append(f"{path}: package {me!r} has no layer (add it to LAYER and DESIGN §3)")
            continue
        mine = LAYER[me]
        package = list(rel[:-1])  # the package a relative import starts from
        tree = ast.parse(path.read_text(), str(path))
        skip = guarded_lines(tree)
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            for target in imported_packages(node, package):
                layer = LAYER.get(target)
                if layer is None:
                    problems.append(f"{path}:{node.lineno}: imports compactmq.{target}, which has no layer")
                elif layer > mine and f"{path.relative_to(src)}:{target}" not in ALLOWED:
                    problems.append(
                        f"{path}:{node.lineno}: {me} (layer {mine}) imports {target} (layer {layer})"
                    )
                elif layer > mine:
                    print(f"allowed for now: {path}:{node.lineno}: {me} imports {target}")
    for p in problems:
        print(p)
    print(f"layer check: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
