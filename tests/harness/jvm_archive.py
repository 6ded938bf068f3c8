"""A class-data-sharing (CDS) archive of Spark's classes for the JVMs the test run starts.

A test run starts many Spark driver JVMs: each xdist worker's shared session, the brokers that
compact with Spark in a subprocess, the ``compact-topic`` jobs and the crash test's children. Most
of such a JVM's start-up CPU goes into loading, parsing and verifying the same few thousand
classes from Spark's jars, again in every JVM. Java's dynamic CDS (JDK 13+) records the classes a
JVM loaded in an archive when it exits (``-XX:ArchiveClassesAtExit``); a later JVM started with
``-XX:SharedArchiveFile`` maps them in ready to use. Measured on the 2-core CI machine: a session
start plus a first small job took 10.2 s of JVM CPU without the archive and 5.4 s with it.

``scripts/test.sh`` makes the archive once per virtualenv (``python tests/harness/jvm_archive.py``:
one JVM that starts the test profile's session and runs the compaction warm-up's scratch run,
the path the tests' runs take, then exits and writes the archive); ``tests/conftest.py`` adds
``-XX:SharedArchiveFile`` to the test JVMs' options when the archive for this Java and this
PySpark exists. Its name holds a hash of both (and of the JVM flags, which must match), so an
upgrade makes a new one instead of using a stale one; a JVM that still finds an archive unusable
ignores it (``-Xshare:auto``, the default) and starts as it would without. Production JVMs never
get the flag.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: JVM flags for the short-lived Spark drivers of the test run (see ``tests/conftest.py``)
TEST_JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(java) if java else ""


def archive_path() -> Path | None:
    """Where the archive for this Java, this PySpark and these flags lives (None: no Java)."""
    java = _java()
    if not java or not os.path.exists(java):
        return None
    import importlib.util

    spec = importlib.util.find_spec("pyspark")  # located, not imported: conftest asks at start-up
    if spec is None or not spec.origin:
        return None
    jars = Path(spec.origin).parent / "jars"
    # the jars' names carry their versions: a PySpark upgrade changes them
    names = sorted(os.listdir(jars)) if jars.is_dir() else []
    key = "\n".join([java, str(os.stat(java).st_mtime_ns), TEST_JVM_OPTS, *names])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(sys.prefix) / "compactmq-test-cds" / f"spark-{digest}.jsa"


def jvm_opts() -> str:
    """The test JVMs' options: the archive's flag added when it exists."""
    path = archive_path()
    if path is not None and path.is_file():
        return f"{TEST_JVM_OPTS} -XX:SharedArchiveFile={path}"
    return TEST_JVM_OPTS


#: the recording run; the JVM writes the archive when it exits, which it does when its stdin
#: closes (Spark's gateway server), so the script closes it and waits for the JVM
_RECORD = """
from pyspark import SparkContext
from compactmq.compaction.jobs.session import TEST_CONF, get_session
from compactmq.compaction.jobs.warmup import warm_up
warm_up(TEST_CONF)
proc = SparkContext._gateway.proc
get_session(TEST_CONF).stop()
proc.stdin.close()
proc.wait(timeout=300)
"""


def make_archive(timeout: float = 600) -> str:
    """Record the archive unless it exists: one JVM runs the warm-up, then writes it at exit."""
    path = archive_path()
    if path is None:
        return "no Java or PySpark: no archive"
    if path.is_file():
        return f"{path} (kept)"
    path.parent.mkdir(parents=True, exist_ok=True)
    for old in path.parent.glob("spark-*.jsa"):  # an archive of an older Java or PySpark
        old.unlink()
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".jsa.tmp")
    os.close(fd)
    os.unlink(tmp)  # the JVM writes the file itself
    env = {**os.environ, "SPARK_SUBMIT_OPTS": f"{TEST_JVM_OPTS} -XX:ArchiveClassesAtExit={tmp}"}
    done = subprocess.run(
        [sys.executable, "-c", _RECORD], env=env, capture_output=True, timeout=timeout, check=False
    )
    if done.returncode != 0 or not os.path.isfile(tmp):
        if os.path.exists(tmp):
            os.unlink(tmp)
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        return f"not made (exit {done.returncode}): {tail[0]}"
    os.replace(tmp, path)
    return f"{path} (made)"


if __name__ == "__main__":
    print(make_archive())
