"""Entry point of the ``compactmq`` command.

Each subcommand lives in its own module of this package, exposing ``add_parser(subparsers)``
(which sets ``func`` on its parser) and is imported only when the command line is parsed, so
``compactmq --help`` never starts Spark or a broker. Errors from compactmq are printed as one
line on stderr with exit status 1 (2 for usage errors, as argparse does).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ..errors import CompactMQError

# module name under compactmq.cli, in the order --help lists them
COMMAND_MODULES = ("standalone", "compact_topic", "admin", "schemas")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="compactmq",
        description="A Pulsar-compatible broker with topic compaction on Apache Spark.",
    )
    parser.add_argument(
        "--admin-url", default="http://127.0.0.1:8080", help="admin REST API of the broker"
    )
    parser.add_argument(
        "--output", choices=("text", "json"), default="text", help="how results are printed"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"{__package__}.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"{__package__}.{name}":
                continue  # that command has not been built yet
            raise
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = args.func(args)
    except CompactMQError as e:
        print(f"compactmq: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return int(result or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
