"""The shared SparkSession heals after a test breaks it (``harness.spark_session``): real Spark.

The break a timeout makes is made here the way pytest-timeout makes it: a signal raises in the
main thread while it waits for the JVM's answer to a py4j call (a ``Thread.sleep`` in the JVM),
so the late answer is left on this thread's connection for the next call to read.
"""

from __future__ import annotations

import logging
import select
import signal

from harness.spark_session import _thread_connection, healthy_session, probe


class _Interrupted(BaseException):
    """What pytest-timeout raises (``Failed`` is a BaseException too): py4j does not catch it."""


def _interrupt_a_py4j_call(spark, after: float = 0.3, jvm_sleep_ms: int = 1000) -> None:
    def raise_in_main_thread(signum, frame):
        raise _Interrupted()

    sleep = spark.sparkContext._jvm.java.lang.Thread.sleep  # looked up first: the signal lands in the wait
    previous = signal.signal(signal.SIGALRM, raise_in_main_thread)
    signal.setitimer(signal.ITIMER_REAL, after)
    try:
        sleep(jvm_sleep_ms)
    except _Interrupted:
        pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_stopped_context_is_replaced(spark):
    spark.stop()
    assert probe(spark) == "its SparkContext was stopped"
    fresh = healthy_session()
    assert fresh is not spark
    assert probe(fresh) is None
    assert fresh.range(3).count() == 3


def test_the_fixture_hands_out_a_working_session_after_a_break(spark):
    """Runs after the tests above broke the session: the fixture's probe passed and it works."""
    assert probe(spark) is None
    assert spark.range(4).count() == 4


def test_a_healthy_session_is_kept(spark, caplog):
    with caplog.at_level(logging.WARNING):
        assert healthy_session() is spark
    assert [r for r in caplog.records if r.name == "tests.spark_session"] == []


def test_a_call_interrupted_by_a_timeout_gets_the_next_user_a_working_session(spark, caplog):
    # held, as the timed-out test's traceback holds it: py4j keeps only a weak reference to a
    # connection while a call is on it, so a collected one would hide the break
    connection = _thread_connection(spark)
    _interrupt_a_py4j_call(spark)
    # the JVM's late answer arrives on this thread's connection, where the next call would read it
    assert _thread_connection(spark) is connection
    sock = connection.socket
    assert select.select([sock], [], [], 20)[0], "the interrupted call's answer never came"
    reason = probe(spark)
    assert reason is not None and "out of step" in reason or "did not answer" in reason, reason
    with caplog.at_level(logging.WARNING):
        fresh = healthy_session()
    assert probe(fresh) is None
    assert fresh.range(5).count() == 5
    # one line says why (the probe's own out-of-step answer: what a later test would have read)
    lines = [r.getMessage() for r in caplog.records if r.name == "tests.spark_session"]
    assert len(lines) == 1 and lines[0].startswith("replacing the worker's SparkSession: "), lines
