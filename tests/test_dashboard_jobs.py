"""The dashboard's background jobs: worker-thread jobs (apps/dashboard/jobs.py) — one job per key
whoever asks, one page's Cancel never stops another page's wait, a job nobody watches stops at its next
step, a failed or killed worker becomes a message, and Compute starts it again — and Dash's forked jobs
(apps/dashboard/forking.py), which must not inherit a lock another server thread held."""

from __future__ import annotations

import ctypes
import os
import threading
import time

import pytest
from attnviz.dashboard.jobs import Jobs, JobStopped


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


class Steps:
    """A job's work that takes ``steps`` steps, each let through by the test (``go``), and counts runs."""

    def __init__(self, steps: int = 3) -> None:
        self.steps = steps
        self.runs = 0
        self.finished = 0
        self.step = threading.Semaphore(0)
        self.results: list[str] = []

    def __call__(self, progress) -> None:
        self.runs += 1
        for i in range(self.steps):
            progress(i, self.steps, f"step {i + 1} of {self.steps}")
            assert self.step.acquire(timeout=20), "the test never let the step through"
        progress(self.steps, self.steps, "done")
        self.results.append("result")
        self.finished += 1

    def go(self, n: int = 1) -> None:
        for _ in range(n):
            self.step.release()


def finish(jobs: Jobs, page: str) -> list:
    """Poll ``page`` until none of its jobs is running; the jobs reported on the last poll."""
    reported: list = []

    def idle() -> bool:
        reported[:] = jobs.of_page(page)
        return all(job.finished for job in reported)

    wait_for(idle)
    return reported


def test_two_pages_asking_for_one_key_share_one_job_and_both_hear_it_finished():
    jobs, work = Jobs(), Steps()
    a = jobs.ask("k", "page-a", "the summary", work)
    b = jobs.ask("k", "page-b", "the summary", work)
    assert a is b and a.watchers == {"page-a", "page-b"}
    wait_for(lambda: a.text == "step 1 of 3")
    assert [j.key for j in jobs.of_page("page-a")] == ["k"] and not a.finished
    work.go(3)
    assert [j.state for j in finish(jobs, "page-a")] == ["done"]
    assert [j.state for j in finish(jobs, "page-b")] == ["done"]
    assert work.runs == 1 and work.finished == 1
    assert jobs.of_page("page-a") == [] and jobs.get("k") is None  # everyone was told: nothing kept
    # asked again (its result left the cache): a new job, not the finished one
    again = jobs.ask("k", "page-a", "the summary", work)
    assert again is not a
    work.go(3)
    finish(jobs, "page-a")
    assert work.runs == 2


def test_one_page_cancelling_leaves_the_other_pages_job_running():
    jobs, work = Jobs(), Steps()
    job = jobs.ask("k", "page-a", "the summary", work)
    jobs.ask("k", "page-b", "the summary", work)
    wait_for(lambda: job.state == "running")
    assert [j.key for j in jobs.cancel("page-a")] == ["k"]
    work.go(3)
    assert [j.state for j in finish(jobs, "page-b")] == ["done"]
    assert work.finished == 1
    with pytest.raises(JobStopped, match="Cancelled: the summary was not computed for this page. Press Compute"):
        jobs.ask("k", "page-a", "the summary", work)  # page a said Cancel: no new job until Compute
    assert jobs.stopped("page-a") == [
        "Cancelled: the summary was not computed for this page. Press Compute to start it again."
    ]
    assert jobs.stopped("page-b") == []
    jobs.restart("page-a")
    assert jobs.stopped("page-a") == []
    jobs.ask("k", "page-a", "the summary", work)
    work.go(3)
    finish(jobs, "page-a")
    assert work.runs == 2


def test_a_job_nobody_watches_stops_at_its_next_step():
    jobs, work = Jobs(), Steps(steps=100)
    job = jobs.ask("k", "page-a", "the summary", work)
    wait_for(lambda: job.text == "step 1 of 100")
    jobs.cancel("page-a")
    work.go()  # the step it was in ends; the next progress call stops it
    wait_for(lambda: job.finished)
    assert job.state == "cancelled" and work.finished == 0
    assert jobs.get("k") is None and jobs.running() == []


def test_a_queued_job_waits_for_a_worker_and_a_cancelled_one_never_starts():
    jobs = Jobs(workers=1)
    first, second = Steps(), Steps()
    a = jobs.ask("first", "page-a", "the first", first)
    wait_for(lambda: a.state == "running")
    b = jobs.ask("second", "page-b", "the second", second)
    time.sleep(0.1)
    assert b.state == "queued" and b.text == "waiting for a worker…"
    jobs.cancel("page-b")
    first.go(3)
    finish(jobs, "page-a")
    wait_for(lambda: b.finished)
    assert b.state == "cancelled" and second.runs == 0


def test_a_failing_job_and_a_killed_worker_become_messages_and_compute_starts_them_again():
    jobs = Jobs()

    def fails(progress):
        progress(0, 1, "step 1 of 1")
        raise RuntimeError("boom")

    job = jobs.ask("k", "page-a", "the summary", fails)
    [reported] = finish(jobs, "page-a")
    assert reported is job and job.state == "failed"
    assert job.error == (
        "The background worker computing the summary stopped before it finished (an unexpected error; the "
        "server's log has the details). Press Compute to try again."
    )
    with pytest.raises(JobStopped, match="stopped before it finished \\(an unexpected error; .*\\). Press Compute"):
        jobs.ask("k", "page-a", "the summary", fails)

    # a worker killed from outside (an exception raised in its thread, as an interpreter shutdown or a
    # watchdog would): the page hears it stopped, and Compute runs the job again
    jobs.restart("page-a")
    work = Steps(steps=100)
    job = jobs.ask("k", "page-a", "the summary", work)
    wait_for(lambda: job.text == "step 1 of 100")
    killed = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(job.thread.ident), ctypes.py_object(SystemExit))
    assert killed == 1
    work.go()
    [reported] = finish(jobs, "page-a")
    assert reported.state == "failed" and "stopped before it finished (its thread was ended)" in reported.error
    jobs.restart("page-a")
    job = jobs.ask("k", "page-a", "the summary", work)
    work.go(100)
    assert [j.state for j in finish(jobs, "page-a")] == ["done"]


def fork_hangs(job, timeout: float = 30) -> list[int]:
    """Fork, run ``job()`` in the child and exit; ``[pid]`` if the child did not end in ``timeout`` s (then
    killed), else ``[]``."""
    pid = os.fork()
    if pid == 0:
        job()
        os._exit(0)
    deadline = time.monotonic() + timeout
    while not os.waitpid(pid, os.WNOHANG)[0]:
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return [pid]
        time.sleep(0.01)
    return []


def test_a_forked_job_computes_even_when_its_forking_thread_had_used_torchs_thread_pool():
    """Dash's background jobs are forks of the server; GNU libgomp is not fork-safe, and a child forked
    by a thread that had used torch's OpenMP pool waited forever in its first parallel op (seen: a
    Dash job's flash attention in gomp_team_end). The app makes every forked child single-threaded."""
    import torch
    from attnviz.dashboard.app import background_manager

    background_manager()
    q = torch.randn(1, 4, 1024, 64)
    hung = []

    def fork_after_using_the_pool() -> None:
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        for _ in range(3):  # the job
            hung.extend(fork_hangs(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)))

    thread = threading.Thread(target=fork_after_using_the_pool)
    thread.start()
    thread.join()
    assert hung == []


def test_a_forked_job_writes_its_diskcache_while_server_threads_use_it(tmp_path):
    """Dash's jobs report through diskcache's SQLite, which the server's threads poll meanwhile; a fork
    while one of them was inside SQLite left the child waiting on SQLite's mutex forever (seen: a long
    capture stuck at "starting…"; here 25 forks of 40 hung with a plain diskcache.Cache). The server's
    cache takes a lock a fork waits for."""
    from attnviz.dashboard.forking import ForkSafeCache, fork_safely

    fork_safely()
    cache = ForkSafeCache(str(tmp_path))
    stop, hung = threading.Event(), []

    def poll_like_the_server() -> None:
        i = 0
        while not stop.is_set():
            cache.set(f"k{i % 50}", "x" * 2000)
            cache.get(f"k{(i * 7) % 50}")
            i += 1

    def fork_jobs() -> None:
        for _ in range(20):  # the job: its progress, then its result
            hung.extend(fork_hangs(lambda: (cache.set("progress", 1), cache.set("result", os.getpid())), timeout=20))

    pollers = [threading.Thread(target=poll_like_the_server) for _ in range(3)]
    for thread in pollers:
        thread.start()
    forker = threading.Thread(target=fork_jobs)
    forker.start()
    forker.join()
    stop.set()
    for thread in pollers:
        thread.join()
    assert hung == []
