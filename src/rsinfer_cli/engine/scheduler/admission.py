"""Admission and expiry: a model's one FIFO queue of jobs. A request is refused with `Saturated` (429) when
`max_queue` requests already wait or its rows do not fit `queue_rows` (all or none); one that does not start within
`queue_timeout_s` gets `PoolTimeout` (503), by the queue's one timer. A caller that goes away marks its job done:
its queued rows are dropped before they run. Event-loop thread only, but for `Job.ran`."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ...errors import PoolTimeout, Saturated
from .contract import Asked


@dataclass(eq=False)
class Job:
    """Rows of a request to batch (`rows`, `costs`, `finish`), or a function that holds one lane for the whole
    request (`direct`)."""

    future: asyncio.Future[Any]
    enqueued: float
    rows: Sequence[Any] = ()
    costs: Sequence[int] = ()
    finish: Callable[[list[Any]], Any] | None = None
    direct: Callable[[Any], Any] | None = None
    ask: Asked[Any] | None = None      # the request it works for: its queue wait and forwards go to its record
    outputs: list[Any] = field(default_factory=list)
    remaining: int = 0
    next: int = 0                      # rows handed to forwards so far
    started: float | None = None
    done: bool = False                 # answered, failed or abandoned: skip whatever of it is left
    # one lock for every job's few shared fields (held for a few operations, never nested): no Lock made per request
    lock: ClassVar[threading.Lock] = threading.Lock()
    forward_s: float = 0.0             # the forwards that ran its rows (its share of their time: all of it)
    forwards: tuple[float, float] | None = None   # perf_counter of its first forward's start, last one's end

    def ran(self, t0: float, t1: float) -> None:
        """A forward with rows of this job ran from t0 to t1 (perf_counter), on any worker thread."""
        with self.lock:
            self.forward_s += t1 - t0
            self.forwards = (self.forwards or (t0, t1))[0], t1

    def timed(self) -> None:
        """Its queue wait and forwards into its request's record."""
        if self.ask is not None:
            self.ask.timed(self.enqueued, self.started or self.enqueued, self.forward_s, self.forwards)


class Admission:
    def __init__(self, name: str, capacity: int, max_queue: int, queue_timeout_s: float) -> None:
        self.name = name
        self.capacity = capacity          # rows the queue holds (batching.queue_rows)
        self.max_queue = max_queue
        self.queue_timeout_s = queue_timeout_s
        self.jobs: deque[Job] = deque()
        self.queued_rows = 0
        self.expiry: asyncio.TimerHandle | None = None   # the queue's one timeout timer (arm)
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def waiting(self) -> int:
        """Requests queued and not yet started."""
        return sum(1 for j in self.jobs if not j.done and j.started is None)

    def admit(self, job: Job, rows: int, idle: bool) -> Job:
        """`job` at the queue's end (`idle`: a lane is free and nobody waits, so it starts at once: no limit)."""
        if not idle:
            if len(self.jobs) >= self.max_queue:
                self.purge()
                if len(self.jobs) >= self.max_queue:
                    raise Saturated(f"model '{self.name}' is saturated ({len(self.jobs)} requests waiting); "
                                    "retry later", model=self.name)
            if rows and self.queued_rows + rows > self.capacity:
                raise Saturated(f"model '{self.name}' has {self.queued_rows} rows queued; {rows} more do not fit "
                                f"(batching.queue_rows = {self.capacity}); retry later", model=self.name)
        self.jobs.append(job)
        self.queued_rows += rows
        if self.expiry is None:
            self.arm(job.enqueued)
        return job

    def arm(self, enqueued: float) -> None:
        """The queue's one timer, for the job enqueued at `enqueued`: jobs wait in the order they came and share one
        timeout, so the oldest one waiting is always the next to expire (a timer per job cost its creation and its
        cancel on every request: ~4 µs of an engine process's 39 per request)."""
        assert self.loop is not None
        delay = max(enqueued + self.queue_timeout_s - time.perf_counter(), 0.0)
        self.expiry = self.loop.call_later(delay, self.expire)

    def expire(self) -> None:
        """Jobs past `queue_timeout_s` that no forward has started fail with PoolTimeout; the timer is armed again
        for the oldest job left."""
        self.expiry = None
        due = time.perf_counter() - self.queue_timeout_s
        for job in self.jobs:
            if job.enqueued > due:
                self.arm(job.enqueued)
                return
            if job.started is None and not job.done:
                self.fail(job, PoolTimeout(f"timed out after {self.queue_timeout_s * 1000:.0f} ms in the queue of "
                                           f"model '{self.name}' without a free replica", model=self.name))

    def stop(self) -> None:
        """Fail whatever still waits (after the server drained the requests it accepted)."""
        if self.expiry is not None:
            self.expiry.cancel()
            self.expiry = None
        while self.jobs:
            job = self.jobs.popleft()
            if not job.done:
                self.fail(job, PoolTimeout(f"model '{self.name}' is shutting down", model=self.name))

    def close(self, job: Job) -> None:
        """`job` done: its rows not yet handed to a forward leave the queue's count."""
        if not job.done:
            job.done = True
            self.queued_rows -= len(job.rows) - job.next
            job.next = len(job.rows)

    def fail(self, job: Job, exc: BaseException) -> None:
        self.close(job)
        if not job.future.done():
            job.future.set_exception(exc)

    def answer(self, results: list[tuple[Job, Any, BaseException | None]]) -> None:
        for job, result, exc in results:
            if exc is not None:
                self.fail(job, exc)
            elif not job.future.done():
                job.done = True
                job.future.set_result(result)

    def purge(self) -> None:
        jobs = self.jobs
        while jobs and jobs[0].done:
            jobs.popleft()

    def take_rows(self, limit: int) -> list[tuple[Job, int]]:
        """Oldest rows first, up to `limit`, until a direct job heads the queue (each job's start stamped by
        `start`)."""
        staged: list[tuple[Job, int]] = []
        jobs = self.jobs
        while jobs and len(staged) < limit:
            job = jobs[0]
            if job.done:
                jobs.popleft()
                continue
            if job.direct is not None:
                break
            take = min(limit - len(staged), len(job.rows) - job.next)
            self.start(job)
            staged.extend((job, i) for i in range(job.next, job.next + take))
            job.next += take
            self.queued_rows -= take
            if job.next == len(job.rows):
                jobs.popleft()
        return staged

    on_start: Callable[[float], None] | None = None    # a job's wait (seconds) to the metrics

    def start(self, job: Job) -> None:
        if job.started is None:
            job.started = time.perf_counter()
            if self.on_start is not None:
                self.on_start(job.started - job.enqueued)
