"""Background jobs for the heavy views of a long text, in worker threads of the server.

A view that needs a pass over every head of a long capture (the model view, head statistics, rollout,
the validation) asks :meth:`Jobs.ask` for the result under a key, e.g. ``(capture key, "summary",
part)``: the first page to ask starts the job, any other page asking for the same key joins it (the
work is done once, whoever asks), and the result lands in the captures' bounded cache of derived
results. While it runs, the page polls :meth:`Jobs.of_page` for progress (``job_bar``) and can cancel:
cancelling removes only that page from the job's watchers, and the job stops (at the next layer) when
no page watches it any more — one page's Cancel never stops another page's view.

A job that fails, or whose worker is killed (any ``BaseException`` in its thread), ends as "failed"
with a message; a page remembers which keys it cancelled or saw fail, so reopening a view shows the
message instead of starting the job again until the user presses Compute (:meth:`Jobs.restart`).

Threads, not processes: the job reads the capture the server holds (no file, no copy) and leaves its
result where every request thread finds it; torch releases the GIL while it computes, so the rest of
the page stays usable. At most ``workers`` jobs compute at once; the others wait their turn.

A job never starves what the user looks at (issue #56): its thread — and the OpenMP threads torch starts
for it, which inherit it — runs at the lowest priority (:data:`JOB_NICE`, Linux's per-thread nice), so
the scheduler gives the cores to a request thread whenever one computes and to the job only what is left;
and a page that shows another capture (:meth:`Jobs.shown`, told by every heavy view as it draws) stops
watching its jobs of the capture it left, which stop at their next step when no page watches them.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import attnviz

log = logging.getLogger("attnviz.dashboard")
JOB_NICE = 19  # a job's thread's nice: the scheduler runs it on what the request threads leave
Progress = Callable[[int, int, str], None]  # (done, total, what) — raises Cancelled when no page watches
Work = Callable[[Progress], None]  # computes, and leaves its result where the views read it


class Cancelled(Exception):
    """Raised inside a job's work (by its progress callback) once no page watches the job."""


class JobStopped(attnviz.AttnvizError):
    """A view's background job was cancelled, or failed: the page shows this message."""


@dataclass
class Job:
    """One background computation: its progress, and who waits for it."""

    key: Hashable
    label: str  # what the page says it computes ("the model view, head statistics, rollout and validation …")
    watchers: set[str] = field(default_factory=set)  # the pages waiting for it
    state: str = "queued"  # queued → running → done | failed | cancelled
    done: int = 0
    total: int = 0
    text: str = "waiting for a worker…"
    error: str = ""
    started: float = field(default_factory=time.monotonic)
    thread: threading.Thread | None = None

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed", "cancelled")


class Jobs:
    """The server's background jobs, keyed by what they compute; ``workers`` compute at once."""

    def __init__(self, workers: int = 2) -> None:
        self.workers = workers
        self._slots = threading.BoundedSemaphore(workers)
        self._lock = threading.Lock()
        self._jobs: dict[Hashable, Job] = {}
        self._pages: dict[str, dict[Hashable, str]] = {}  # page -> {key: "watching" | a stop message}
        self._shown: dict[str, Hashable] = {}  # page -> the capture it shows (Jobs.shown)

    # -- what pages do
    def ask(self, key: Hashable, page: str, label: str, work: Work) -> Job:
        """The job computing ``key``, started if none is running, with ``page`` among its watchers.
        Raises :class:`JobStopped` when this page cancelled the key or saw it fail (until :meth:`restart`)."""
        with self._lock:
            said = self._pages.setdefault(page, {}).get(key)
            if said is not None and said != "watching":
                raise JobStopped(said)
            job = self._jobs.get(key)
            if job is None or job.finished:  # a finished one: its result left the cache, or it never came
                job = self._jobs[key] = Job(key, label)
                job.thread = threading.Thread(
                    target=self._run, args=(job, work), daemon=True, name=f"attnviz-job {label}"
                )
                job.thread.start()
            job.watchers.add(page)
            self._pages[page][key] = "watching"
            return job

    def shown(self, page: str, capture: Hashable) -> list[Job]:
        """``page`` now shows ``capture`` (a capture's key: the first item of its jobs' keys; None: none).
        When that is another capture than it showed, the page stops watching its jobs of the capture it
        left — each stops at its next step when no page watches it — and forgets them (coming back asks
        again, as a first visit); jobs of anything else (a corpus the page embeds) are left alone.
        Returns the jobs it left."""
        with self._lock:
            before = self._shown.get(page)
            self._shown[page] = capture
            if before is None or before == capture:
                return []
            keys, jobs = self._watched(page)
            left = [job for job in jobs if _capture_of(job.key) == before]
            for job in left:
                job.watchers.discard(page)
                del keys[job.key]
                if not job.watchers and job.finished and self._jobs.get(job.key) is job:
                    del self._jobs[job.key]
            return left

    def of_page(self, page: str) -> list[Job]:
        """The jobs ``page`` waits for (running or queued), and those that finished since it last asked:
        a finished job is reported once, then the page stops watching it."""
        with self._lock:
            keys, jobs = self._watched(page)
            for job in jobs:
                if job.finished:
                    job.watchers.discard(page)
                    if job.state == "failed":
                        keys[job.key] = job.error  # reopening the view shows it, until Compute
                    else:
                        del keys[job.key]
                    if not job.watchers and self._jobs.get(job.key) is job:
                        del self._jobs[job.key]  # everyone was told (a result is in the captures' cache)
            return jobs

    def cancel(self, page: str) -> list[Job]:
        """``page`` stops waiting for its jobs (each one stops when no page watches it any more); the page
        then says they were cancelled until :meth:`restart`. Returns the jobs it watched."""
        with self._lock:
            keys, jobs = self._watched(page)
            for job in jobs:
                job.watchers.discard(page)
                keys[job.key] = (
                    f"Cancelled: {job.label} was not computed for this page. Press Compute to start it again."
                )
            return jobs

    def restart(self, page: str) -> None:
        """Forget what ``page`` cancelled or saw fail: the next view that asks starts the job again."""
        with self._lock:
            keys = self._pages.get(page, {})
            for key in [k for k, said in keys.items() if said != "watching"]:
                del keys[key]

    def stopped(self, page: str) -> list[str]:
        """What ``page`` was told about its cancelled or failed jobs (Compute starts them again), one
        message each."""
        with self._lock:
            return sorted({said for said in self._pages.get(page, {}).values() if said != "watching"})

    def get(self, key: Hashable) -> Job | None:
        with self._lock:
            return self._jobs.get(key)

    def running(self) -> list[Job]:
        """Every job not finished (for tests and the soak bench)."""
        with self._lock:
            return [job for job in self._jobs.values() if not job.finished]

    def _watched(self, page: str) -> tuple[dict[Hashable, str], list[Job]]:  # with the lock held
        keys = self._pages.get(page, {})
        return keys, [self._jobs[k] for k, said in keys.items() if said == "watching" and k in self._jobs]

    # -- the worker
    def _run(self, job: Job, work: Work) -> None:
        def progress(done: int, total: int, text: str) -> None:
            with self._lock:
                if not job.watchers:
                    raise Cancelled
                job.done, job.total, job.text = done, total, text

        lower_priority()
        try:
            with self._slots:
                progress(0, 0, "starting…")  # no page left while it waited: stop before any work
                with self._lock:
                    job.state = "running"
                work(progress)  # it leaves its result in the captures' cache: a job holds none
            with self._lock:
                job.state = "done"
        except Cancelled:
            with self._lock:
                job.state = "cancelled"
        except BaseException as err:  # noqa: BLE001 - a failed or killed worker becomes the page's message
            message = err if isinstance(err, attnviz.AttnvizError) else None
            ended = isinstance(err, SystemExit | KeyboardInterrupt)  # the page names no exception class
            why = "its thread was ended" if ended else "an unexpected error; the server's log has the details"
            with self._lock:
                job.state = "failed"
                job.error = (
                    f"{job.label[:1].upper()}{job.label[1:]} failed: {message}"
                    if message is not None
                    else f"The background worker computing {job.label} stopped before it finished ({why}). "
                    "Press Compute to try again."
                )
            if message is None and not isinstance(err, SystemExit | KeyboardInterrupt):
                log.error("background job failed", exc_info=err)
        finally:
            with self._lock:
                if not job.watchers and self._jobs.get(job.key) is job:
                    del self._jobs[job.key]  # nobody to tell


def _capture_of(key: Hashable) -> Hashable:
    """The capture a job's key is of: its first item (``(capture key, what…)``), else the key itself."""
    return key[0] if isinstance(key, tuple) and key else key


def lower_priority(nice: int | None = None) -> bool:
    """The calling thread (and the threads it starts from now on, OpenMP's among them) at ``nice`` (None:
    :data:`JOB_NICE`, read when called: a bench on a machine shared with other work sets it), on Linux
    where nice is per thread; elsewhere it would be the whole server's, and nothing is changed. True when
    set. A thread may always lower its own priority; it never raises it back (the job's thread ends)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        tid = threading.get_native_id()
        wanted = JOB_NICE if nice is None else nice
        os.setpriority(os.PRIO_PROCESS, tid, max(os.getpriority(os.PRIO_PROCESS, tid), wanted))
    except OSError:  # a sandbox that refuses it: the job runs as before
        return False
    return True
