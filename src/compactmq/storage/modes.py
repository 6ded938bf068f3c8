"""Who may read a data directory: its owner only.

A data directory holds every message of every tenant, the credentials-bearing metadata and the
compacted views. Authorization is the broker's; a local user who can read the files bypasses
it. So the data directory is created (and, when opened, tightened to) ``DIR_MODE`` (0700), and
every file the broker or a ``compact-topic`` job creates in it is ``FILE_MODE`` (0600):
explicitly where our code creates the file, and through the process umask (``PRIVATE_UMASK``,
set by the ``standalone`` and ``compact-topic`` commands) for what libraries create (SQLite's
WAL, Parquet written by pyarrow, Spark's output). The top directory's mode alone already keeps
other users out; the file modes keep a file private when it is copied or moved out.
"""

from __future__ import annotations

import logging
import os
import stat

log = logging.getLogger(__name__)

DIR_MODE = 0o700
FILE_MODE = 0o600
PRIVATE_UMASK = 0o077


def private_data_dir(path: str | os.PathLike) -> None:
    """Create ``path`` (and its parents) if needed, and make ``path`` itself 0700. An existing
    directory open to others is tightened (with a log line); one we do not own is left alone."""
    os.makedirs(path, mode=DIR_MODE, exist_ok=True)
    st = os.stat(path)
    if stat.S_IMODE(st.st_mode) & 0o077 and st.st_uid == os.geteuid():
        os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o077)
        log.warning("data directory %s was readable by other users: now owner-only (0700)", path)


def create_private_file(path: str | os.PathLike) -> None:
    """Create ``path`` empty with mode 0600 unless it exists (for files a library opens by name)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
    except FileExistsError:
        pass


def open_private(path: str | os.PathLike, flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC):
    """``open(path, "wb")`` with mode 0600 for a new file."""
    return os.fdopen(os.open(path, flags, FILE_MODE), "wb")
