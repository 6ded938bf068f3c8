"""The topics' sync threads (``broker.sync_threads``): jobs run, side by side up to the limit,
threads start only when a job would otherwise wait, a failing job leaves its thread serving."""

from __future__ import annotations

import threading

import pytest

from compactmq.broker.sync_threads import SyncThreads


def test_jobs_run_and_one_thread_serves_jobs_one_after_the_other():
    pool = SyncThreads(4)
    done = []
    for i in range(20):
        finished = threading.Event()
        pool.submit(lambda arg: (done.append(arg[0]), arg[1].set()), (i, finished))
        assert finished.wait(10)
    assert done == list(range(20))
    assert len(pool._threads) == 1  # each job had ended before the next came
    pool.shutdown(10)


def test_jobs_that_block_each_get_a_thread_up_to_the_limit():
    pool = SyncThreads(3)
    gate = threading.Event()
    started = threading.Semaphore(0)

    def job(_):
        started.release()
        gate.wait(20)

    for _ in range(3):
        pool.submit(job, None)
    for _ in range(3):  # all three run at once: none waits behind another
        assert started.acquire(timeout=10)
    pool.submit(job, None)  # over the limit: waits for a thread
    assert not started.acquire(timeout=0.1)
    assert len(pool._threads) == 3
    gate.set()
    assert started.acquire(timeout=10)
    pool.shutdown(10)
    assert not any(t.is_alive() for t in pool._threads)


def test_a_failing_job_is_logged_and_the_thread_goes_on(caplog):
    pool = SyncThreads(1)
    ran = threading.Event()

    def fails(_):
        raise RuntimeError("boom")

    pool.submit(fails, None)
    pool.submit(lambda _: ran.set(), None)
    assert ran.wait(10)
    assert "sync job" in caplog.text
    pool.shutdown(10)


def test_shutdown_lets_handed_over_jobs_finish_and_refuses_new_ones():
    pool = SyncThreads(2)
    gate = threading.Event()
    done = []
    pool.submit(lambda _: (gate.wait(20), done.append(1)), None)
    stopper = threading.Thread(target=pool.shutdown, args=(20,))
    stopper.start()
    gate.set()
    stopper.join(20)
    assert done == [1]
    with pytest.raises(RuntimeError):
        pool.submit(lambda _: None, None)


def test_a_finished_job_keeps_nothing_alive():
    """A topic hands its bound ``_sync_in_pool`` over; an idle thread must not hold the last
    one (an unloaded topic would stay in memory until the thread's next job)."""
    import gc
    import weakref

    class Owner:
        def job(self, done: threading.Event) -> None:
            done.set()

    pool = SyncThreads(1)
    owner = Owner()
    alive = weakref.ref(owner)
    done = threading.Event()
    pool.submit(owner.job, done)
    assert done.wait(5)
    del owner
    for _ in range(100):  # the thread drops its references just after the job returns
        gc.collect()
        if alive() is None:
            break
        threading.Event().wait(0.01)
    assert alive() is None
    pool.shutdown(5)
