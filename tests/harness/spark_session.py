"""The worker's shared SparkSession, checked before each use and replaced when it is broken.

Why: a test worker keeps ONE warm SparkSession for all its tests (starting a JVM costs seconds of
CPU). When pytest-timeout interrupts a test in the middle of a py4j call (its signal method
raises in the main thread while it waits for the JVM's answer), py4j keeps that thread's
connection, and the JVM's late answer is read by the NEXT call: every later Spark test of the
worker then fails with nonsense ("... does not exist in the JVM", ``KeyError: 'p'``) and the one
slow test hides among dozens of failures. A test that stops the context or a JVM that dies has
the same effect.

How: ``healthy_session()`` (what the ``spark`` fixture returns) asks the session a question whose
answer it knows -- the JVM echoes a fresh nonce and says its context is not stopped -- on this
thread's py4j connection, waiting at most ``PROBE_SECONDS``. Two round trips, no Spark job.
When the answer is wrong, late or an error, ``discard`` logs one line saying why, drops the
out-of-step connection, stops the session (or forgets a JVM that is gone) and a fresh session is
made. ``discard_if_broken()`` is the same check for in-process brokers, which pick the session up
lazily through ``getOrCreate``: it runs before a broker starts, so a broker never compacts on a
broken session left by an earlier module.
"""

from __future__ import annotations

import logging
import uuid

log = logging.getLogger("tests.spark_session")

#: how long the probe waits for the JVM's answer: a live JVM answers in milliseconds; one still
#: busy with a timed-out test's call on this connection does not answer at all
PROBE_SECONDS = 5.0


def _thread_connection(session):
    client = getattr(session.sparkContext._gateway, "_gateway_client", None)
    get = getattr(client, "get_thread_connection", None)
    return get() if get is not None else None


def probe(session, timeout: float = PROBE_SECONDS) -> str | None:
    """None when ``session`` answers correctly within ``timeout`` s, else why it is broken."""
    sc = session.sparkContext
    if sc._jsc is None:
        return "its SparkContext was stopped"
    proc = getattr(sc._gateway, "proc", None)
    if proc is not None and proc.poll() is not None:
        return f"its JVM exited (status {proc.returncode})"
    connection = _thread_connection(session)
    sock = getattr(connection, "socket", None)
    if sock is not None:
        sock.settimeout(timeout)
    nonce = uuid.uuid4().int >> 66  # fits a Java long
    try:
        echoed = sc._jvm.java.lang.Long.parseLong(str(nonce))
        stopped = sc._jsc.sc().isStopped()
    except Exception as e:  # py4j's errors, a KeyError of an out-of-step answer, a timeout
        return f"the JVM did not answer a probe ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
    finally:
        if sock is not None and getattr(connection, "socket", None) is sock:
            sock.settimeout(None)
    if _thread_connection(session) is not connection and connection is not None:
        return "its py4j connection failed the probe (py4j reconnected)"
    if echoed != nonce:
        return f"py4j answers out of step (probe echoed {str(echoed)[:60]!r})"
    if stopped:
        return "its SparkContext is stopped in the JVM"
    return None


def discard(session, reason: str) -> None:
    """Log why, then stop ``session`` so that the next ``get_session`` makes a fresh one; a JVM
    that is gone (or does not answer) is killed and forgotten, so that a new one is launched."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    log.warning("replacing the worker's SparkSession: %s", reason)
    connection = _thread_connection(session)
    if connection is not None:
        connection.close(reset=True)  # out of step: later calls of this thread open a new one
    sc = session.sparkContext
    proc = getattr(sc._gateway, "proc", None)
    jvm_gone = proc is not None and proc.poll() is not None
    if not jvm_gone:
        try:
            session.stop()
        except Exception as e:
            log.warning("stopping the broken SparkSession failed (%s): launching a new JVM", e)
            jvm_gone = True
    if jvm_gone:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        sc._jsc = None
        with SparkContext._lock:
            SparkContext._active_spark_context = None
            SparkContext._gateway = None
            SparkContext._jvm = None
        SparkSession._instantiatedSession = None
        SparkSession._activeSession = None


def healthy_session():
    """The worker's test SparkSession, after a probe; a broken one is replaced first."""
    from compactmq.compaction.jobs.session import testing_session

    session = testing_session()
    reason = probe(session)
    if reason is None:
        return session
    discard(session, reason)
    session = testing_session()
    reason = probe(session)
    if reason is not None:
        raise RuntimeError(f"a fresh SparkSession is broken too: {reason}")
    return session


def discard_if_broken() -> None:
    """Before an in-process broker starts: stop the process's SparkSession if it is broken (the
    broker makes a fresh one when it first compacts). Starts no JVM when there is no session."""
    import sys

    sql = sys.modules.get("pyspark.sql")  # not imported: this process has no session to check
    session = getattr(sql, "SparkSession", None) and sql.SparkSession._instantiatedSession
    if session is None:
        return
    reason = probe(session)
    if reason is not None:
        discard(session, reason)
