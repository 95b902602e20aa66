"""Cross-request batching: rows of concurrent requests share forwards (the only async code in the engine).

A row arriving while a replica is idle is dispatched at once, so batching never adds latency. A backlog is
drained without waiting for more: up to `max_rows` x idle replicas rows, sorted by length, cut into one chunk
per idle replica (share = ceil(staged / idle), at most `max_rows` rows) and closed before a chunk would pass
`max_tokens` padded tokens; a single over-budget row runs alone. A request's rows are queued all or none.

Rows are whatever the pipeline makes of a request (texts, pairs, windows); the batcher only sees token rows
and hands each request back its rows' outputs in its own order.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from ..errors import PoolTimeout, Saturated
from .batching import plan_batches
from .inputs import Encoded

# forward(ids, type_ids) → one output per row; runs on a worker thread
Forward = Callable[[Sequence[Sequence[int]], Sequence[Sequence[int]] | None], list[Any]]
# observe(rows, padded tokens, seconds) after each forward
Observe = Callable[[int, int, float], None]


@dataclass(eq=False)
class _Job:
    enc: Encoded
    future: asyncio.Future
    outputs: list[Any]
    remaining: int
    enqueued: float
    started: float | None = None
    done: bool = False
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)

    def fail(self, exc: BaseException) -> None:
        if not self.done:
            self.done = True
            if not self.future.done():
                self.future.set_exception(exc)


@dataclass(eq=False)
class _Row:
    job: _Job
    index: int
    length: int


class Batcher:
    def __init__(self, name: str, forward: Forward, *, workers: int, max_rows: int, max_tokens: int,
                 queue_rows: int, queue_timeout_s: float, executor: Executor,
                 observe: Observe | None = None, max_padding: int | None = None) -> None:
        self.name = name
        self.forward = forward
        self.workers = workers
        self.max_rows = max_rows
        self.max_tokens = max_tokens
        self.max_padding = max_padding
        self.capacity = max(queue_rows, max_rows, 1)
        self.queue_timeout_s = queue_timeout_s
        self.executor = executor
        self.observe = observe
        self.queue: deque[_Row] = deque()
        self.queued = 0          # rows waiting (cancelled ones included until the gatherer drops them)
        self.idle = workers
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    # ------------------------------------------------------------ lifetime

    def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._gather(), name=f"batcher-{self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        while self.queue:
            self.queue.popleft().job.fail(PoolTimeout(f"model '{self.name}' is shutting down", model=self.name))

    @property
    def running(self) -> int:
        return self.workers - self.idle

    # ------------------------------------------------------------ callers

    async def submit(self, enc: Encoded) -> tuple[list[Any], float]:
        """Queue every row of one request (all or none) → (its rows' outputs in order, seconds queued)."""
        n = len(enc.ids)
        if n == 0:
            return [], 0.0
        if self.queued + n > self.capacity:
            raise Saturated(f"model '{self.name}' has {self.queued} rows queued; {n} more do not fit "
                            f"(batching.queue_rows = {self.capacity}); retry later", model=self.name)
        loop = asyncio.get_running_loop()
        job = _Job(enc, loop.create_future(), [None] * n, n, time.perf_counter())
        job.timer = loop.call_later(self.queue_timeout_s, self._expire, job)
        self.queue.extend(_Row(job, i, len(r)) for i, r in enumerate(enc.ids))
        self.queued += n
        assert self._wake is not None, "Batcher.start() was not called"
        if self.idle:
            self._dispatch_backlog()  # a replica is free: go now, without a round trip through the gatherer
        if self.queue:
            self._wake.set()
        try:
            outputs = await job.future
        except asyncio.CancelledError:
            job.done = True  # the caller went away: its queued rows are dropped, the rest proceed
            raise
        finally:
            if job.timer is not None:
                job.timer.cancel()
        return outputs, (job.started or job.enqueued) - job.enqueued

    def _expire(self, job: _Job) -> None:
        if job.started is None:
            job.fail(PoolTimeout(f"waited {self.queue_timeout_s * 1000:.0f} ms in the queue of model '{self.name}' "
                                 "without a free replica", model=self.name))

    # ------------------------------------------------------------ the gatherer

    async def _gather(self) -> None:
        assert self._wake is not None
        while True:
            while not (self.queue and self.idle):
                self._wake.clear()
                await self._wake.wait()
            self._dispatch_backlog()

    def _dispatch_backlog(self) -> None:
        staged: list[_Row] = []
        limit = self.max_rows * self.idle
        while self.queue and len(staged) < limit:
            row = self.queue.popleft()
            self.queued -= 1
            if not row.job.done:
                staged.append(row)
        if not staged:
            return
        share = min(max(math.ceil(len(staged) / self.idle), 1), self.max_rows)
        chunks = [[staged[i] for i in c] for c in
                  plan_batches([r.length for r in staged], share, self.max_tokens, self.max_padding)]
        # one train of forwards per idle replica, each about `share` rows: a replica runs its chunks back to back
        # (answers go out after each forward) instead of a round trip through the loop between them
        per_worker = math.ceil(len(chunks) / self.idle)
        for k in range(0, len(chunks), per_worker):
            self._run(chunks[k:k + per_worker])

    def _run(self, train: list[list[_Row]]) -> None:
        self.idle -= 1
        now = time.perf_counter()
        for rows in train:
            for r in rows:
                if r.job.started is None:
                    r.job.started = now
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self.executor, self._train, loop, train)
        fut.add_done_callback(self._finished)

    def _train(self, loop: asyncio.AbstractEventLoop, train: list[list[_Row]]) -> None:
        """On a worker thread: each forward of the train, its outputs (or error) handed back as it completes."""
        for rows in train:
            rows = [r for r in rows if not r.job.done]  # a caller gone meanwhile: skip its rows
            if not rows:
                continue
            ids = [r.job.enc.ids[r.index] for r in rows]
            types = [r.job.enc.type_ids[r.index] for r in rows] \
                if all(r.job.enc.type_ids is not None for r in rows) else None
            t0 = time.perf_counter()
            try:
                out = self.forward(ids, types)
            except Exception as exc:  # noqa: BLE001 - handed to exactly the callers of this forward
                loop.call_soon_threadsafe(self._deliver, rows, None, exc)
                continue
            if self.observe is not None:
                self.observe(len(ids), len(ids) * max(len(r) for r in ids), time.perf_counter() - t0)
            loop.call_soon_threadsafe(self._deliver, rows, out, None)

    def _finished(self, fut: asyncio.Future) -> None:
        self.idle += 1
        assert self._wake is not None
        self._wake.set()
        if not fut.cancelled() and fut.exception() is not None:  # the train itself broke (not a forward)
            raise fut.exception()  # type: ignore[misc]

    def _deliver(self, rows: list[_Row], outputs: list[Any] | None, exc: BaseException | None) -> None:
        if exc is not None:
            for r in rows:  # a failed forward fails only the requests that had rows in it
                r.job.fail(exc)
            return
        assert outputs is not None
        for r, out in zip(rows, outputs, strict=True):
            job = r.job
            if job.done:
                continue
            job.outputs[r.index] = out
            job.remaining -= 1
            if job.remaining == 0:
                job.done = True
                if not job.future.done():
                    job.future.set_result(job.outputs)
