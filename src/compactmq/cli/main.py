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
COMMAND_MODULES = ("standalone", "compact_topic", "admin", "tokens", "schemas_admin")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="compactmq",
        description="A Pulsar-compatible broker with topic compaction on Apache Spark.",
    )
    parser.add_argument("--admin-url", default="http://127.0.0.1:8080", help="admin REST API of the broker")
    parser.add_argument("--output", choices=("text", "json"), default="text", help="how results are printed")
    _add_security_options(parser)
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


def _add_security_options(parser: argparse.ArgumentParser) -> None:
    """pulsar-admin's global options for a broker with authentication or TLS (``admin_auth``)."""
    g = parser.add_argument_group("security (pulsar-admin's global options)")
    g.add_argument(
        "--auth-plugin",
        metavar="CLASS",
        help="org.apache.pulsar.client.impl.auth.AuthenticationToken, AuthenticationTls or "
        "AuthenticationBasic (or token, tls, basic)",
    )
    g.add_argument(
        "--auth-params",
        metavar="PARAMS",
        help='token:<jwt> or file:///path; basic {"userId":"u","password":"p"}; '
        "tls tlsCertFile:/path,tlsKeyFile:/path",
    )
    g.add_argument("--tls-trust-cert-path", metavar="FILE", help="CA certificate(s) that signed the broker's")
    g.add_argument("--tls-allow-insecure", action="store_true", help="accept any broker certificate")
    g.add_argument(
        "--tls-enable-hostname-verification",
        action="store_true",
        help="check that the broker's certificate names the admin URL's host",
    )
    g.add_argument("--tls-cert-file", metavar="FILE", help="client certificate for TLS authentication")
    g.add_argument("--tls-key-file", metavar="FILE", help="private key of --tls-cert-file")


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
