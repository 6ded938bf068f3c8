"""``compactmq tokens``: Pulsar's ``bin/pulsar tokens`` -- make token keys, sign, show and check tokens.

The verbs, option names and output are Pulsar's, so scripts written for ``bin/pulsar tokens``
work with ``compactmq tokens`` unchanged:

``create-secret-key [-a HS256] [-o FILE] [-b]``
    random bytes for HS256/HS384/HS512, raw (or base64 with ``--base64``) to the file or stdout;
    the broker reads it with ``tokenSecretKey=file:///FILE`` (or ``data:;base64,<the -b text>``).
``create-key-pair [-a RS256|ES256] --output-private-key F --output-public-key F``
    a key pair in DER (private PKCS#8, public X.509); the broker reads the public one with
    ``tokenPublicKey=file:///F`` and ``tokenPublicAlg``.
``create -s ROLE (-sk KEY | -pk KEY) [-e 1h|7d|1y] [-hs k=v ...]``
    a signed token on stdout. A secret key signs with the strongest HMAC its length allows (as
    Pulsar's library chooses); a private key with RS256 or the ES algorithm of its curve.
``show [TOKEN | -i | -f FILE]``
    the header and payload, unverified, separated by ``---``.
``validate [TOKEN | -i | -f FILE] (-sk KEY | -pk KEY)``
    verifies signature and expiry and prints the claims as Pulsar does (``{sub=admin, exp=...}``);
    a bad token is a one-line error and exit status 1.

Keys are named as everywhere in Pulsar: ``file:///path``, ``data:;base64,...``, or a path. The
token itself may also come from the ``TOKEN`` environment variable. Secrets are written only
where asked (a file, or stdout) and never appear in an error.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from pathlib import Path
from typing import Any

from ..auth.token_provider import check_token
from ..auth.tokens import (
    EC_ALGORITHMS,
    HMAC_ALGORITHMS,
    KEY_PAIR_ALGORITHMS,
    algorithms_for_key,
    create_key_pair,
    create_secret_key,
    create_token,
    load_private_key,
    load_public_key,
    parse_relative_time,
    read_key_data,
    split_token,
)
from ..errors import InvalidConfiguration, InvalidInput

ALGORITHMS = HMAC_ALGORITHMS + KEY_PAIR_ALGORITHMS


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "tokens",
        help="create token keys and tokens, show and validate tokens (bin/pulsar tokens)",
        description="Pulsar's token tool: keys for tokenSecretKey/tokenPublicKey, and the tokens clients "
        "pass with --auth-params token:... or AuthenticationToken.",
    )
    sub = p.add_subparsers(dest="tokens_command", metavar="VERB")
    sub.required = True

    s = sub.add_parser("create-secret-key", help="a new secret key (HS256) for tokenSecretKey")
    s.add_argument("-a", "--signature-algorithm", default="HS256", choices=HMAC_ALGORITHMS)
    s.add_argument("-o", "--output", metavar="FILE", help="write the key to FILE instead of stdout")
    s.add_argument("-b", "--base64", action="store_true", help="encode the key in base64")
    s.set_defaults(func=cmd_create_secret_key)

    k = sub.add_parser("create-key-pair", help="a new private/public key pair (RS256, ES256) in DER")
    k.add_argument("-a", "--signature-algorithm", default="RS256", choices=KEY_PAIR_ALGORITHMS)
    k.add_argument("--output-private-key", required=True, metavar="FILE", help="where the private key goes")
    k.add_argument("--output-public-key", required=True, metavar="FILE", help="where the public key goes")
    k.set_defaults(func=cmd_create_key_pair)

    c = sub.add_parser("create", help="a new token for a role, signed with a secret or private key")
    c.add_argument(
        "-a",
        "--signature-algorithm",
        choices=ALGORITHMS,
        help="default: HS256/384/512 after the secret key's length, RS256 or the curve's ES*",
    )
    c.add_argument("-s", "--subject", required=True, help="the role (principal) the token stands for")
    c.add_argument(
        "-e",
        "--expiry-time",
        metavar="TIME",
        help="relative expiry, e.g. 30m, 1h, 7d, 1y (default: never expires)",
    )
    c.add_argument("-sk", "--secret-key", metavar="KEY", help="file:///path, data:;base64,..., or a path")
    c.add_argument("-pk", "--private-key", metavar="KEY", help="file:///path, data:;base64,..., or a path")
    c.add_argument(
        "-hs",
        "--headers",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra header of the token (repeat for several)",
    )
    c.set_defaults(func=cmd_create)

    sh = sub.add_parser("show", help="print a token's header and payload (not verified)")
    _token_source(sh)
    sh.set_defaults(func=cmd_show)

    v = sub.add_parser("validate", help="verify a token's signature and expiry and print its claims")
    _token_source(v)
    v.add_argument(
        "-a",
        "--signature-algorithm",
        choices=KEY_PAIR_ALGORITHMS,
        help="the algorithm of --public-key (default: the key's own, RS256 or ES*)",
    )
    v.add_argument("-sk", "--secret-key", metavar="KEY", help="file:///path, data:;base64,..., or a path")
    v.add_argument("-pk", "--public-key", metavar="KEY", help="file:///path, data:;base64,..., or a path")
    v.set_defaults(func=cmd_validate)


def _token_source(p: argparse.ArgumentParser) -> None:
    p.add_argument("token", nargs="?", help="the token (or -i, -f, or the TOKEN environment variable)")
    p.add_argument("-i", "--stdin", action="store_true", help="read the token from standard input")
    p.add_argument("-f", "--token-file", metavar="FILE", help="read the token from FILE")


# --- verbs ----------------------------------------------------------------------------------


def cmd_create_secret_key(args: argparse.Namespace) -> int:
    key = create_secret_key(args.signature_algorithm)
    data = base64.b64encode(key) if args.base64 else key
    if args.output:
        _write_private(args.output, data)
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    return 0


def cmd_create_key_pair(args: argparse.Namespace) -> int:
    private_der, public_der = create_key_pair(args.signature_algorithm)
    _write_private(args.output_private_key, private_der)
    _write(args.output_public_key, public_der, 0o644)
    return 0


def cmd_create(args: argparse.Namespace) -> int:
    spec = _one_key(args.secret_key, args.private_key, "--private-key", "signing")
    algorithm = args.signature_algorithm
    if args.secret_key:
        signing_key: Any = read_key_data(spec, "--secret-key")
        algorithm = algorithm or _hmac_for(signing_key)
        if algorithm not in HMAC_ALGORITHMS:
            raise InvalidInput(f"a secret key signs with {', '.join(HMAC_ALGORITHMS)}, not {algorithm}")
    else:
        signing_key = load_private_key(read_key_data(spec, "--private-key"), "--private-key")
        if algorithm in HMAC_ALGORITHMS:
            raise InvalidInput(f"a private key cannot sign {algorithm}: use --secret-key for HS*")
    expires_in = parse_relative_time(args.expiry_time) if args.expiry_time else None
    headers = dict(_header(item) for item in args.headers) or None
    print(
        create_token(args.subject, signing_key, algorithm=algorithm, expires_in=expires_in, headers=headers)
    )
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    header, payload, _ = split_token(_read_token(args))
    print(json.dumps(header, separators=(",", ":")))
    print("---")
    print(json.dumps(payload, separators=(",", ":")))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    spec = _one_key(args.secret_key, args.public_key, "--public-key", "validating")
    token = _read_token(args)
    if args.secret_key:
        key: Any = read_key_data(spec, "--secret-key")
        algorithms: tuple[str, ...] = HMAC_ALGORITHMS
    else:
        key = load_public_key(read_key_data(spec, "--public-key"), "--public-key")
        algorithms = algorithms_for_key(key)
        if args.signature_algorithm and args.signature_algorithm not in algorithms:
            kind = "an EC" if algorithms == EC_ALGORITHMS else "an RSA"
            raise InvalidInput(
                f"--signature-algorithm {args.signature_algorithm} does not match the public key ({kind} key)"
            )
    claims = check_token(token, key, algorithms)  # the broker's own reasons for a refusal
    print(_java_map(claims))
    return 0


# --- helpers --------------------------------------------------------------------------------


def _one_key(secret: str | None, other: str | None, other_flag: str, purpose: str) -> str:
    if not secret and not other:
        raise InvalidInput(f"either --secret-key or {other_flag} needs to be passed for {purpose} a token")
    if secret and other:
        raise InvalidInput(f"only one of --secret-key and {other_flag} may be passed for {purpose} a token")
    return secret or other  # type: ignore[return-value]


def _hmac_for(secret: bytes) -> str:
    """The strongest HMAC a secret of this length is long enough for (what Pulsar's jjwt picks)."""
    if len(secret) >= 64:
        return "HS512"
    if len(secret) >= 48:
        return "HS384"
    return "HS256"


def _header(item: str) -> tuple[str, str]:
    name, sep, value = item.partition("=")
    if not sep or not name.strip():
        raise InvalidInput(f"--headers {item!r}: expected KEY=VALUE")
    return name.strip(), value


def _read_token(args: argparse.Namespace) -> str:
    if args.token:
        token = args.token
    elif args.stdin:
        token = sys.stdin.readline()
    elif args.token_file:
        try:
            token = Path(args.token_file).read_text()
        except OSError as e:
            raise InvalidInput(f"cannot read --token-file {args.token_file}: {e.strerror}") from None
    elif os.environ.get("TOKEN"):
        token = os.environ["TOKEN"]
    else:
        raise InvalidInput(
            "the token needs to be passed as an argument, with --stdin or --token-file, "
            "or in the TOKEN environment variable"
        )
    return token.strip()


def _java_map(claims: dict[str, Any]) -> str:
    """Claims as Pulsar's tool prints them (a Java map): ``{sub=admin, exp=1767225600}``."""
    return "{" + ", ".join(f"{k}={_java_value(v)}" for k, v in claims.items()) + "}"


def _java_value(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_java_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return _java_map(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


def _write_private(path: str, data: bytes) -> None:
    _write(path, data, 0o600)  # a secret or private key: readable by its owner only


def _write(path: str, data: bytes, mode: int) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as f:
            # the mode of os.open only applies to a new file: an existing one (overwritten) keeps
            # its own, so set it before a byte of the key is written
            os.fchmod(f.fileno(), mode)
            f.write(data)
    except OSError as e:
        raise InvalidConfiguration(f"cannot write {path}: {e.strerror}") from None
