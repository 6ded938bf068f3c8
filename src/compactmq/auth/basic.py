"""``AuthenticationProviderBasic``: a user name and password checked against an htpasswd file
(method ``basic``); the role is the user name.

Where the file comes from, as Pulsar reads it: ``basicAuthConf`` -- a ``file://``/``data:``
URL, a path, or the file's content in base64 -- else the JVM property
``-Dpulsar.auth.basic.conf=...`` inside ``PULSAR_EXTRA_OPTS`` (how Pulsar's docs start a
broker with basic auth).

Each line is ``user:hash``; blank lines and ``#`` comments are skipped. The hash schemes are
those ``htpasswd`` writes and Pulsar reads -- ``$apr1$`` (Apache MD5, ``htpasswd -m``) and
classic DES crypt (``htpasswd -d``) -- plus bcrypt (``$2y$``, ``htpasswd -B``, the one to use
today) and the ``$1$``/``$5$``/``$6$`` crypt variants. A hash of any other kind is refused when
the file is loaded, not when its user first logs in.

Verifying is CPU work (bcrypt deliberately so: tens of milliseconds). Successful checks are
remembered for the life of the process as an HMAC of ``user:password`` under a random
per-process key, so a client that sends the same credentials on every HTTP request pays the
hash once; failures are never remembered, so guessing stays as slow as the hash makes it.

An unknown user costs what a known user with a wrong password costs: the password is checked
against a stand-in hash (``_stand_in_hash``: the hash of a user of the file's most common kind
and cost) and the answer is "no" whatever that check says, so timing does not tell which users
exist.

On the wire the client sends ``user:password`` as CONNECT's ``auth_data``; over HTTP it is the
``Authorization: Basic`` header.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import shlex
from collections.abc import Mapping
from typing import Any

import bcrypt

from ..errors import AuthenticationFailed, InvalidConfiguration
from . import METHOD_BASIC, Principal
from .tokens import read_key_data

SYSTEM_PROPERTY = "pulsar.auth.basic.conf"
# Bound on remembered successful checks; the cache is dropped whole when it fills.
MAX_REMEMBERED = 4096
_UNKNOWN = "unknown user or wrong password"  # one message for both, as Pulsar


def _scheme_of(hashed: str) -> str | None:
    if hashed.startswith("$apr1$"):
        return "apr1"
    if hashed.startswith(("$2y$", "$2b$", "$2a$")):
        return "bcrypt"
    if hashed.startswith(("$1$", "$5$", "$6$")):
        return "crypt-" + hashed[1]
    if len(hashed) == 13 and not hashed.startswith("$"):
        return "des"
    return None


def _verify(scheme: str, password: str, hashed: str) -> bool:
    if scheme == "bcrypt":
        # The bcrypt library knows $2b$/$2a$; $2y$ (PHP's and htpasswd's) is the same algorithm.
        normalized = "$2b$" + hashed[4:] if hashed.startswith("$2y$") else hashed
        try:
            return bcrypt.checkpw(password.encode(), normalized.encode())
        except ValueError:
            return False
    # The other schemes come from libpass (the maintained passlib fork), imported when used.
    from passlib import hash as passlib_hash  # type: ignore[import-untyped]

    verifier = {
        "apr1": passlib_hash.apr_md5_crypt,
        "des": passlib_hash.des_crypt,
        "crypt-1": passlib_hash.md5_crypt,
        "crypt-5": passlib_hash.sha256_crypt,
        "crypt-6": passlib_hash.sha512_crypt,
    }[scheme]
    try:
        return bool(verifier.verify(password, hashed))
    except (ValueError, TypeError):
        return False


def parse_htpasswd(text: str, source: str = "basicAuthConf") -> dict[str, str]:
    """``{user: hash}``; a malformed line or an unknown hash is an ``InvalidConfiguration``."""
    users: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, hashed = line.partition(":")
        if not sep or not user or not hashed or ":" in hashed:
            raise InvalidConfiguration(f"{source} line {lineno}: expected user:hash")
        if _scheme_of(hashed) is None:
            raise InvalidConfiguration(
                f"{source} line {lineno}: the hash of user {user!r} is not bcrypt, apr1 (MD5) or crypt"
            )
        users[user] = hashed
    if not users:
        raise InvalidConfiguration(f"{source}: no users")
    return users


def conf_from_extra_opts(extra_opts: str) -> str | None:
    """The value of ``-Dpulsar.auth.basic.conf=...`` in a ``PULSAR_EXTRA_OPTS`` string."""
    prefix = f"-D{SYSTEM_PROPERTY}="
    try:
        words = shlex.split(extra_opts or "")
    except ValueError:
        words = (extra_opts or "").split()
    for word in words:
        if word.startswith(prefix):
            return word[len(prefix) :]
    return None


def _cost_of(hashed: str) -> tuple[str, str]:
    """What a check of ``hashed`` costs: its scheme and work factor (bcrypt's cost field, the
    ``rounds=`` of SHA crypt; the other schemes have a fixed cost)."""
    scheme = _scheme_of(hashed) or ""
    if scheme == "bcrypt":
        return scheme, hashed[4:6]
    if scheme in ("crypt-5", "crypt-6") and hashed[3:].startswith("rounds="):
        return scheme, hashed[3:].split("$", 1)[0]
    return scheme, ""


def _stand_in_hash(users: Mapping[str, str]) -> str:
    """A hash an unknown user's password is checked against, so that answering costs what a
    known user's wrong password costs: one of the users' own, of the most common scheme and
    cost (the first such user). The caller ignores the result of that check."""
    counts: dict[tuple[str, str], int] = {}
    for hashed in users.values():
        counts[_cost_of(hashed)] = counts.get(_cost_of(hashed), 0) + 1
    common = max(counts, key=lambda c: counts[c])  # max keeps the first of equal counts
    return next(h for h in users.values() if _cost_of(h) == common)


class BasicAuthenticationProvider:
    method = METHOD_BASIC

    def __init__(self, users: Mapping[str, str]):
        self._users = dict(users)
        self._stand_in = _stand_in_hash(self._users) if self._users else ""
        self._remember_key = os.urandom(32)
        self._remembered: set[bytes] = set()

    def __repr__(self) -> str:
        return f"BasicAuthenticationProvider({len(self._users)} users)"

    @classmethod
    def from_config(cls, config: Mapping[str, Any], environ: Mapping[str, str] | None = None):
        spec, source = config["basicAuthConf"], "basicAuthConf"
        if not spec:
            spec = conf_from_extra_opts((environ or {}).get("PULSAR_EXTRA_OPTS", ""))
            source = f"-D{SYSTEM_PROPERTY}"
        if not spec:
            raise InvalidConfiguration(
                "AuthenticationProviderBasic needs basicAuthConf (an htpasswd path, or its content in "
                f"base64) or PULSAR_EXTRA_OPTS=-D{SYSTEM_PROPERTY}=FILE"
            )
        data = read_key_data(spec, source)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidConfiguration(f"{source}: the htpasswd content is not UTF-8 text") from None
        return cls(parse_htpasswd(text, source))

    def authenticate(self, data: bytes, peer_cert: dict | None = None) -> Principal:
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            raise AuthenticationFailed("basic credentials are not UTF-8") from None
        user, sep, password = text.partition(":")
        if not sep or not user:
            raise AuthenticationFailed("basic credentials must be user:password")
        hashed = self._users.get(user)
        if hashed is None:
            if self._stand_in:  # the same work as a wrong password; the answer is no regardless
                _verify(_scheme_of(self._stand_in) or "", password, self._stand_in)
            raise AuthenticationFailed(_UNKNOWN)
        mark = hmac.new(self._remember_key, f"{user}\0{password}\0{hashed}".encode(), hashlib.sha256).digest()
        if mark not in self._remembered:
            if not _verify(_scheme_of(hashed) or "", password, hashed):
                raise AuthenticationFailed(_UNKNOWN)
            if len(self._remembered) >= MAX_REMEMBERED:
                self._remembered.clear()
            self._remembered.add(mark)
        return Principal(user, self.method, None)
