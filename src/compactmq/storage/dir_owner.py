"""Which topic owns a ledger directory.

A topic's ledger files live in a directory derived from its name (``topic_paths.topic_relpath``).
Opening a topic deletes the files there that its metadata does not know (orphans of a crash),
and deleting a topic removes the directory. Both are only right when the directory belongs to
that topic: were two names ever to map to one directory, opening the second would delete the
first one's ledgers.

So the directory records its owner: a file ``OWNER`` holding the topic's full name, written
(atomically, mode 0600) when the topic first opens it. A directory without one (made before
this rule) is adopted by the first topic that opens it. A directory owned by another topic is
never touched: ``claim`` raises ``StorageError`` and the caller refuses to open the topic.
"""

from __future__ import annotations

import os

from ..errors import StorageError

OWNER_FILE = "OWNER"


def read_owner(directory: str) -> str | None:
    """The topic recorded as the owner of ``directory``, or None when none is."""
    try:
        with open(os.path.join(directory, OWNER_FILE), encoding="utf-8") as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None


def owned_by_another(directory: str, topic: str) -> bool:
    owner = read_owner(directory)
    return owner is not None and owner != topic


def claim(directory: str, topic: str) -> None:
    """Record ``topic`` as the owner of ``directory`` (which exists), or raise ``StorageError``
    when another topic owns it (nothing in it is touched then)."""
    owner = read_owner(directory)
    if owner == topic:
        return
    if owner is not None:
        raise StorageError(
            f"{topic}: its ledger directory {directory} belongs to topic {owner}; "
            "refusing to open it (nothing was changed)"
        )
    path = os.path.join(directory, OWNER_FILE)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, topic.encode("utf-8") + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
