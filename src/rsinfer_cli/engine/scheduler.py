"""One scheduler per model: admission, cross-request batching of generic rows, dispatch to idle replicas,
cancellation. The only async code in the engine.

Two kinds of job share one FIFO queue:
- **rows** (batching on): a request's rows - texts, pairs, windows, tensor rows: whatever a family makes of it,
  each with a cost (its length in tokens). Rows of many requests share forwards.
- **direct**: a function that holds one replica for a whole request (batching off, or a request larger than
  the batching queue): tokenize, its forwards in length-sorted slices and post-processing in one thread hop.

Admission: a request is refused with `Saturated` (429) when `max_queue` requests already wait or its rows do not
fit `queue_rows` (all or none); one that does not start within `queue_timeout_s` gets `PoolTimeout` (503).
Fairness: rows are taken oldest request first (up to `max_rows` per idle replica), and only the taken rows are
grouped by length, so a row's wait is bounded by its age, never by its length.
Cancellation: a caller that goes away (client disconnect, request deadline) marks its job done: its queued rows
are dropped before they run and a direct job stops before its next forward.
A row's forward runs on a worker thread, and the worker that completes a request's last row also builds its
answer (`finish`), so a batched request crosses to worker threads twice at most: once to tokenize, once here.
Lanes (engine/threads.py): the sessions are the model's narrow lanes (one forward each at a time). A planned CPU
model also has a latency lane (`wide`, every CPU on one forward) and shares the process's `CpuBudget` with the other
planned models: a narrow forward takes `cost` CPUs of it, and work that forms a single forward with nothing else
running or waiting anywhere in the process goes to the latency lane, which takes all of them. A lone one-row request
whose latency-lane forward is known to be short runs there on the event loop's own thread (`lone`): a hop to a worker
thread and back cost a one-client request ~0.3 ms on 2 CPUs (benchmarks/latency.py), and the loop would have nothing
else to start meanwhile - the lane holds every CPU.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

from ..errors import PoolTimeout, Saturated
from .batching import plan_batches
from .session import Session
from .threads import CpuBudget

log = logging.getLogger("rsinfer.engine")

P = TypeVar("P")   # a row as the family made it
T = TypeVar("T")

# collate rows → feeds, run them on one session, split the outputs back: one output per row (worker thread)
RowForward = Callable[[Session, Sequence[Any]], list[Any]]


class Observer(Protocol):
    """Where the scheduler reports, once per forward and once per request (metrics)."""

    def forward(self, rows: int, padded: int, seconds: float) -> None: ...
    def waited(self, seconds: float) -> None: ...


class Forwarding(Protocol):
    """A family's pipeline as the scheduler sees it: how rows run and how they may be grouped."""

    max_rows: int
    max_tokens: int
    max_padding: int | None

    @property
    def batching(self) -> bool: ...
    def forward(self, session: Session, rows: Sequence[Any]) -> list[Any]: ...


class ModelQueue(Protocol):
    """What a server front uses of a model's scheduler: the `Scheduler` itself (one process), or a front-end
    process's proxy of the one in its engine process (`rsinfer_cli.workers.frontend`)."""

    @property
    def batching(self) -> bool: ...
    @property
    def waiting(self) -> int: ...
    @property
    def queued_rows(self) -> int: ...
    @property
    def running(self) -> int: ...
    @property
    def free(self) -> bool: ...
    async def run(self, fn: Callable[[Runner], T]) -> T: ...
    def now(self) -> bool: ...
    def lone(self, rows: int = 1, cost: int = 0) -> bool: ...
    def run_now(self, rows: Sequence[Any], costs: Sequence[int], lone: bool = False) -> list[Any]: ...
    async def submit(self, rows: Sequence[Any], costs: Sequence[int], finish: Callable[[list[Any]], T]) -> T: ...
    def stop(self) -> None: ...


# a model whose forwards average less than this runs them on the event loop: a hop to a worker thread and back cost
# ~270 µs of CPU under load (KServe add_one, 64 clients: 490 vs 220 µs a request on 2 cores)
INLINE_FORWARD_S = 100e-6
INLINE_AFTER = 16           # forwards measured (on worker threads) before that is decided
# one forward counts at most this much in that average: one spike (the thread preempted, a wait for the GIL, a cold
# cache: add_one's 5 µs forward read up to 330 µs of CPU and 440 µs of wall time on the loop) moves it by a bounded
# step, and a model whose every forward is slow still crosses the line within a few
SPIKE_S = 2 * INLINE_FORWARD_S
# what is averaged: a model whose forwards compute on the thread that calls them (the CPU provider with one intra-op
# thread: `cpu_clock`, every planned CPU model) by that thread's CPU time wherever they run. A forward's wall time on
# the loop also counts the thread's preemption, a CPU quota's throttled periods and its waits for the GIL: under gRPC
# load on 2 CPUs (clients, grpc's threads) add_one's forwards read 30 µs at the median, 81 at p99, up to 440; judged
# by it, one client's calls ran on worker threads for 3-100 % of a 5 s run (under a 0.5 CPU quota, 32 % in one run of
# four), each back only after a probe on the loop whose one wall time, taken as it is, could fail it and double the
# wait. On the loop the clock is read on every CLOCK_EVERY-th forward and on those after a forward whose wall or CPU
# time crossed INLINE_FORWARD_S (a system call at each end, ~0.5 µs); the others count their wall time, which is at
# least their CPU time
CLOCK_EVERY = 16
# any other model (more intra-op threads, a device, a script's process) by wall time, with a probe on the loop now and
# then when its CPU time on worker threads says tiny
PROBE_GAP = (32, 4096)      # forwards between two probes on the loop: the first gap, the longest after failures
# a lone row runs on the latency lane on the loop's thread when its forward should take at most this (its tokens times
# the lane's one-row seconds per token, which overestimates a longer row than those measured): the loop is held no
# longer (health probes, timers and other models' answers wait that long at most), and the hop it saves (~0.3 ms) is
# under 3 % of anything slower
LONE_FORWARD_S = 0.010

@dataclass(slots=True)
class RequestRecord:
    """One request's own numbers (TEI's ResponseMetadata): the front that serves it (the HTTP middleware) makes one
    and sets it in REQUEST_RECORD; the core notes its model, rows, cache status and post-processing, and every job of
    the request its queue wait and forward time. Its timing headers, access line, spans and metrics read these
    fields; a field nobody set stays None (and out of the access line)."""

    body_bytes: int | None = None                # the body's size, when the front knows it
    model: str | None = None                     # the model's key, once the core has the request
    cache: str | None = None                     # hit | partial | miss, with a row cache
    rows: int | None = None
    queue_ms: float | None = None
    inference_ms: float | None = None
    postprocess_ms: float | None = None
    t_tokenize: tuple[float, float] | None = None   # perf_counter spans, for traces and the tokenization header
    t_queue: tuple[float, float] | None = None
    t_forward: tuple[float, float] | None = None

    def log_fields(self) -> dict[str, Any]:
        """The fields of the access line: those set, milliseconds rounded to µs, no perf_counter spans."""
        out: dict[str, Any] = {}
        for name in _LOGGED:
            value = getattr(self, name)
            if value is not None:
                out[name] = round(value, 3) if isinstance(value, float) else value
        return out


_LOGGED = ("body_bytes", "model", "cache", "rows", "queue_ms", "inference_ms", "postprocess_ms")

# the request's record: set by the caller (the HTTP middleware), written by the core and by every job of the request
REQUEST_RECORD: contextvars.ContextVar[RequestRecord | None] = contextvars.ContextVar("rsinfer_request_record",
                                                                                     default=None)


class Cancelled(Exception):
    """Raised in a worker when the request it works for has no caller any more."""


@dataclass(eq=False)
class _Job:
    future: asyncio.Future[Any]
    enqueued: float
    rows: Sequence[Any] = ()
    costs: Sequence[int] = ()
    finish: Callable[[list[Any]], Any] | None = None
    direct: Callable[[Runner], Any] | None = None
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


class Runner:
    """The forwards of one request on one replica (the direct path, and the CLI): observed, and stopped
    between forwards once the request's caller is gone."""

    def __init__(self, session: Session, forward: RowForward, observer: Observer | None = None,
                 job: _Job | None = None) -> None:
        self.session = session
        self._forward = forward
        self._observer = observer
        self._job = job

    @property
    def cancelled(self) -> bool:
        return self._job is not None and self._job.done

    def forward(self, rows: Sequence[Any], costs: Sequence[int]) -> list[Any]:
        if self.cancelled:
            raise Cancelled
        cpu = self.on_thread
        t0, c0 = time.perf_counter(), time.thread_time() if cpu else 0.0
        out = self._forward(self.session, rows)
        t1, c1 = time.perf_counter(), time.thread_time() if cpu else 0.0
        if self._job is not None:
            self._job.ran(t0, t1)
        else:
            self.spent += t1 - t0
            self.span = (self.span or (t0, t1))[0], t1
        if self._observer is not None:
            self._observer.forward(len(rows), len(rows) * max(costs, default=1), t1 - t0)
        self.took, self.took_cpu = t1 - t0, (c1 - c0) if cpu else None
        self.took_cost = costs[0] if len(rows) == 1 else None
        return out

    took = 0.0      # the last forward's seconds, and its CPU seconds on this thread (None: not read): the scheduler
    took_cpu: float | None = None   # learns from them whether this model's forwards are tiny
    took_cost: int | None = None    # (and, of one row, its cost: the latency lane learns its seconds per token)
    on_thread = True    # read the thread's CPU clock too (a worker thread's wall time counts its wait for the GIL)
    spent = 0.0     # without a job (run here, at once): the forwards' seconds, and the first start to the last end
    span: tuple[float, float] | None = None


def as_is(outputs: list[Any]) -> list[Any]:
    """A `finish` that answers with the rows' outputs themselves (their answer is built elsewhere: by a front
    end after its engine ran them, or by the caller after the rows came back)."""
    return outputs


def _record(enqueued: float, started: float, forward_s: float, forwards: tuple[float, float] | None) -> None:
    """A job's queue wait and forward time into its request's record (REQUEST_RECORD, when the caller set one):
    milliseconds for the access line and headers, perf_counter spans for traces."""
    record = REQUEST_RECORD.get()
    if record is not None:
        record.queue_ms = (record.queue_ms or 0.0) + (started - enqueued) * 1000
        record.inference_ms = (record.inference_ms or 0.0) + forward_s * 1000
        record.t_queue = (enqueued, started)
        if forwards is not None:
            record.t_forward = forwards


def run_rows(runner: Runner, rows: Sequence[P], costs: Sequence[int], *, max_rows: int, max_tokens: int,
             max_padding: int | None = None) -> list[Any]:
    """All rows on one replica in length-sorted forwards of at most `max_rows` rows / `max_tokens` padded
    tokens; one output per row, in row order."""
    if len(rows) == 1:                    # one row: one forward, nothing to plan
        return runner.forward(rows, costs)
    outputs: list[Any] = [None] * len(rows)
    for batch in plan_batches(costs, max_rows, max_tokens, max_padding):
        outs = runner.forward([rows[i] for i in batch], [costs[i] for i in batch])
        for i, out in zip(batch, outs, strict=True):
            outputs[i] = out
    return outputs


class Scheduler:
    def __init__(self, name: str, sessions: Sequence[Session], forward: RowForward, executor: Executor, *,
                 batching: bool, max_rows: int, max_tokens: int, max_padding: int | None = None,
                 queue_rows: int = 1024, max_queue: int = 256, queue_timeout_s: float = 30.0,
                 observer: Observer | None = None, wide: Session | None = None, budget: CpuBudget | None = None,
                 cost: int = 1, cpu_clock: bool = False) -> None:
        if not sessions:
            raise ValueError("a scheduler needs at least one session")
        self.name = name
        self.replicas = len(sessions)
        self.wide = wide
        self.budget = budget if budget is not None or wide is None else CpuBudget(len(sessions))
        self.cost = cost
        self.cpu_clock = cpu_clock      # a forward's CPU time on its calling thread is its cost (CLOCK_EVERY)
        self.forward = forward
        self.executor = executor
        self.batching = batching
        self.max_rows = max_rows
        self.max_tokens = max_tokens
        self.max_padding = max_padding
        self.capacity = max(queue_rows, max_rows, 1)
        self.max_queue = max_queue
        self.queue_timeout_s = queue_timeout_s
        self.observer = observer
        self._idle: list[Session] = list(sessions)
        self._queue: deque[_Job] = deque()
        self.queued_rows = 0
        self.running = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._expiry: asyncio.TimerHandle | None = None   # the queue's one timeout timer (_arm)
        # a running mean of the direct forwards' time: a request whose forward takes a few µs (a small tensor
        # graph) is run on the event loop itself, since handing it to a worker thread and back costs more CPU than
        # the forward (benchmarks/overhead.py); anything slower keeps the thread hop, and the loop stays free
        # the forwards' seconds (EWMA) that decide whether they run on the loop: their CPU time for a cpu_clock
        # model, else their wall time (on the loop, or before any try there; SPIKE_S)
        self._forward_s = 1.0
        self._cpu_s = 1.0             # their CPU seconds on the thread that ran them (EWMA)
        self._forwards = 0
        self._probing = False
        self._ran_here = False
        self._probe_gap = PROBE_GAP[0]
        self._next_probe = INLINE_AFTER
        self._clock_due = 0           # cpu_clock: forwards on the loop until the next one whose CPU time is read
        self._loop_thread = 0
        self._lone_s = math.inf       # the latency lane's one-row forwards' wall seconds per token (EWMA); unknown

    @classmethod
    def for_model(cls, key: str, model: Any, pipe: Forwarding, executor: Executor, *,
                  queue_rows: int, max_queue: int, queue_timeout_ms: int, observer: Observer | None = None,
                  forward: RowForward | None = None, budget: CpuBudget | None = None) -> Scheduler:
        """A model's (`LoadedModel`) scheduler over its lanes, with its pipeline's batching settings and the server's
        admission limits; a planned CPU model takes its CPUs from `budget`. `forward` replaces the pipeline's (the
        engine process tags rows with the front end they came from)."""
        planned = model.threads.budgeted
        on_caller = model.backend == "onnx" and model.on_cpu and model.threads.threads == 1
        return cls(key, model.sessions, forward or pipe.forward, executor, batching=pipe.batching,
                   max_rows=pipe.max_rows, max_tokens=pipe.max_tokens, max_padding=pipe.max_padding,
                   queue_rows=queue_rows, max_queue=max_queue, queue_timeout_s=queue_timeout_ms / 1000,
                   observer=observer, wide=model.wide, budget=budget if planned else None,
                   cost=model.threads.threads, cpu_clock=on_caller)

    # ------------------------------------------------------------ lifetime and state

    def stop(self) -> None:
        """Fail whatever still waits (after the server drained the requests it accepted)."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        while self._queue:
            job = self._queue.popleft()
            if not job.done:
                self._fail(job, PoolTimeout(f"model '{self.name}' is shutting down", model=self.name))

    @property
    def free(self) -> bool:
        """A replica is idle and nothing waits: a request now would start at once."""
        self._purge()
        return self._slots() > 0 and not self._queue

    @property
    def waiting(self) -> int:
        """Requests queued and not yet started."""
        return sum(1 for j in self._queue if not j.done and j.started is None)

    # ------------------------------------------------------------ callers

    async def run(self, fn: Callable[[Runner], T]) -> T:
        """fn(runner) on a worker thread holding one replica: a whole request in one hop; at once, here, when the
        model's forwards are tiny and a lane is free with nobody queued before it."""
        if self.now():
            return self._run_here(fn)
        job = self._admit(_Job(self._get_loop().create_future(), time.perf_counter(), direct=fn), 0)
        result: T = await self._wait(job)
        return result

    async def submit(self, rows: Sequence[P], costs: Sequence[int], finish: Callable[[list[Any]], T]) -> T:
        """A request's rows → finish(their outputs in row order). Batched with other requests' rows when
        batching is on and they fit the queue; else on one replica as a direct job."""
        n = len(rows)
        if n == 0:
            return finish([])
        if not self.batching or n > self.capacity:
            return await self.run(self._whole(rows, costs, finish))
        job = _Job(self._get_loop().create_future(), time.perf_counter(), rows=rows, costs=costs, finish=finish,
                   outputs=[None] * n, remaining=n)
        self._admit(job, n)
        result: T = await self._wait(job)
        return result

    def enqueue(self, rows: Sequence[P], costs: Sequence[int], finish: Callable[[list[Any]], Any],
                done: Callable[[Any, BaseException | None], None]) -> Callable[[], None] | None:
        """`submit` without a coroutine or task of its own (an engine process takes thousands of small requests a
        second): `done(answer, None)` or `done(None, error)` once the rows are answered, failed or timed out, never
        after they were abandoned. Returns the function that abandons them, or None when `done` was called before
        this returned: no rows, or a tiny model's direct request run at once on a free lane (as `run` does: no job,
        future or callback). Rows that do not batch (batching off, or more than the queue holds) run as one direct
        job, as `submit` runs them. Saturated is raised here, as submit raises it. (A lone row is not run at once
        here: rows of several front ends arrive together, and the first one run on the loop would keep the others
        from being read, then batched, until its forward ended.)"""
        n = len(rows)
        if n == 0:
            done(finish([]), None)
            return None
        loop = self._get_loop()
        if not self.batching or n > self.capacity:
            if self.now():
                try:
                    answer = finish(self.run_now(rows, costs))
                except Exception as exc:  # noqa: BLE001 - the request's error, handed to its caller
                    done(None, exc)
                else:
                    done(answer, None)
                return None
            job = self._admit(_Job(loop.create_future(), time.perf_counter(), direct=self._whole(rows, costs, finish)),
                              0)
        else:
            job = _Job(loop.create_future(), time.perf_counter(), rows=rows, costs=costs, finish=finish,
                       outputs=[None] * n, remaining=n)
            self._admit(job, n)

        def answered(future: asyncio.Future[Any]) -> None:
            if not future.cancelled():   # cancelled: abandoned, nobody to tell
                exc = future.exception()
                done(None if exc is not None else future.result(), exc)

        job.future.add_done_callback(answered)
        self._dispatch()

        def abandon() -> None:
            self._close(job)
            job.future.cancel()

        return abandon

    def _whole(self, rows: Sequence[P], costs: Sequence[int], finish: Callable[[list[Any]], T]
               ) -> Callable[[Runner], T]:
        """Rows that do not batch, as a direct job: all of them on one replica in length-sorted forwards."""
        def whole(runner: Runner) -> T:
            return finish(run_rows(runner, rows, costs, max_rows=self.max_rows, max_tokens=self.max_tokens,
                                   max_padding=self.max_padding))

        return whole

    def _get_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop_thread = threading.get_ident()
        return self._loop

    def _admit(self, job: _Job, rows: int) -> _Job:
        if not (self._idle and not self._queue):
            if len(self._queue) >= self.max_queue:
                self._purge()
                if len(self._queue) >= self.max_queue:
                    raise Saturated(f"model '{self.name}' is saturated ({len(self._queue)} requests waiting); "
                                    "retry later", model=self.name)
            if rows and self.queued_rows + rows > self.capacity:
                raise Saturated(f"model '{self.name}' has {self.queued_rows} rows queued; {rows} more do not fit "
                                f"(batching.queue_rows = {self.capacity}); retry later", model=self.name)
        self._queue.append(job)
        self.queued_rows += rows
        if self._expiry is None:
            self._arm(job.enqueued)
        return job

    async def _wait(self, job: _Job) -> Any:
        self._dispatch()
        try:
            return await job.future
        except asyncio.CancelledError:
            self._close(job)  # the caller went away: drop its queued rows, stop its direct forwards
            raise
        finally:
            _record(job.enqueued, job.started or job.enqueued, job.forward_s, job.forwards)

    def _arm(self, enqueued: float) -> None:
        """The queue's one timer, for the job enqueued at `enqueued`: jobs wait in the order they came and share one
        timeout, so the oldest one waiting is always the next to expire (a timer per job cost its creation and its
        cancel on every request: ~4 µs of an engine process's 39 per request)."""
        delay = max(enqueued + self.queue_timeout_s - time.perf_counter(), 0.0)
        self._expiry = self._get_loop().call_later(delay, self._expire)

    def _expire(self) -> None:
        """Jobs past `queue_timeout_s` that no forward has started fail with PoolTimeout; the timer is armed again
        for the oldest job left."""
        self._expiry = None
        due = time.perf_counter() - self.queue_timeout_s
        for job in self._queue:
            if job.enqueued > due:
                self._arm(job.enqueued)
                return
            if job.started is None and not job.done:
                self._fail(job, PoolTimeout(f"timed out after {self.queue_timeout_s * 1000:.0f} ms in the queue of "
                                            f"model '{self.name}' without a free replica", model=self.name))

    # ------------------------------------------------------------ job state (event-loop thread only)

    def _close(self, job: _Job) -> None:
        if not job.done:
            job.done = True
            self.queued_rows -= len(job.rows) - job.next
            job.next = len(job.rows)

    def _fail(self, job: _Job, exc: BaseException) -> None:
        self._close(job)
        if not job.future.done():
            job.future.set_exception(exc)

    def _answer(self, results: list[tuple[_Job, Any, BaseException | None]]) -> None:
        for job, result, exc in results:
            if exc is not None:
                self._fail(job, exc)
            elif not job.future.done():
                job.done = True
                job.future.set_result(result)

    def _purge(self) -> None:
        while self._queue and self._queue[0].done:
            self._queue.popleft()

    # ------------------------------------------------------------ dispatch

    def _slots(self) -> int:
        """Narrow lanes that may start a forward now: idle ones, as far as the CPU budget has room."""
        if self.budget is None:
            return len(self._idle)
        return min(len(self._idle), self.budget.free // self.cost)

    def _alone(self) -> bool:
        """A forward started now would run alone in the process: the latency lane may have every CPU."""
        return (self.wide is not None and self.running == 0 and self.budget is not None
                and self.budget.free == self.budget.total)

    def _dispatch(self) -> None:
        queue = self._queue
        while queue:
            head = queue[0]
            if head.done:
                queue.popleft()
                continue
            slots = self._slots()
            if slots == 0:
                if self.budget is not None and self._idle:   # another model holds the CPUs: called back
                    self.budget.wait(id(self), self._dispatch)
                return
            if head.direct is not None:
                queue.popleft()
                self._start(head)
                self._purge()
                tiny = self._tiny()
                session = self._take(wide=not tiny and not queue and self._alone())
                arg = (head, Runner(session, self.forward, self.observer, head))
                arg[1].on_thread = not tiny or self._clock_now()
                if tiny:
                    self._inline(session, arg)
                else:
                    self._launch(session, self._run_direct, arg)
            else:
                self._stage(slots)

    def _take(self, wide: bool = False) -> Session:
        """A lane for one forward (or train of forwards): the latency lane, else an idle narrow one; its CPUs come
        out of the budget."""
        if wide and self.wide is not None and self.budget is not None:
            self.budget.take(self.budget.total)
            return self.wide
        if self.budget is not None:
            self.budget.take(self.cost)
        return self._idle.pop()

    def _start(self, job: _Job) -> None:
        if job.started is None:
            job.started = time.perf_counter()
            if self.observer is not None:
                self.observer.waited(job.started - job.enqueued)

    def _stage(self, idle: int) -> None:
        """Oldest rows first, up to `max_rows` per idle lane; those grouped by length into one train of
        forwards per idle lane (or the latency lane, for a single forward that would run alone)."""
        limit = self.max_rows * idle
        staged: list[tuple[_Job, int]] = []
        queue = self._queue
        while queue and len(staged) < limit:
            job = queue[0]
            if job.done:
                queue.popleft()
                continue
            if job.direct is not None:
                break
            take = min(limit - len(staged), len(job.rows) - job.next)
            self._start(job)
            staged.extend((job, i) for i in range(job.next, job.next + take))
            job.next += take
            self.queued_rows -= take
            if job.next == len(job.rows):
                queue.popleft()
        if not staged:
            return
        share = min(max(math.ceil(len(staged) / idle), 1), self.max_rows)
        chunks = plan_batches([job.costs[i] for job, i in staged], share, self.max_tokens, self.max_padding)
        if self._tiny():                    # forwards of a few µs: all of them here, now, in one train
            session = self._take()
            self.running += 1
            try:
                self._run_train(session, [[staged[i] for i in c] for c in chunks])
            finally:
                self._give_back(session)
            return
        if len(chunks) == 1 and self._alone():
            self._purge()
            if not queue:
                self._launch(self._take(wide=True), self._run_train, [[staged[i] for i in chunks[0]]])
                return
        per_worker = math.ceil(len(chunks) / idle)
        for k in range(0, len(chunks), per_worker):
            train = [[staged[i] for i in c] for c in chunks[k:k + per_worker]]
            self._launch(self._take(), self._run_train, train)

    def _launch(self, session: Session, fn: Callable[[Session, Any], None], arg: Any) -> None:
        loop = self._get_loop()
        self.running += 1
        fut = loop.run_in_executor(self.executor, fn, session, arg)
        fut.add_done_callback(lambda f: self._release(session, f))

    def _inline(self, session: Session, arg: tuple[_Job, Runner]) -> None:
        """A direct job run here, on the event-loop thread (its forwards take a few µs)."""
        job, runner = arg
        self.running += 1
        try:
            result = job.direct(runner) if job.direct else None
        except Cancelled:
            result = None
            job.done = True
        except Exception as exc:  # noqa: BLE001 - handed to its caller
            self._learn(runner)
            self._give_back(session)
            self._fail(job, exc)
            return
        self._learn(runner)
        self._give_back(session)
        self._answer([(job, result, None)])

    def now(self) -> bool:
        """A request would run at once, here on the event loop's thread (`run_now`, `_run_here`): the model's forwards
        are tiny, a lane is free and nobody is queued before it."""
        if self._queue or not self._idle or self._loop_thread != threading.get_ident():
            return False
        budget = self.budget       # _slots() > 0, written out: this runs for every request
        if budget is not None and budget.free < self.cost:
            return False
        return (self._forwards >= INLINE_AFTER and self._forward_s < INLINE_FORWARD_S) or self._tiny()

    def lone(self, rows: int = 1, cost: int = 0) -> bool:
        """`rows` of `cost` (tokens) would run at once, here on the event loop's thread, on the latency lane
        (`run_now(..., lone=True)`): one row, nothing else running or waiting in the process, and its forward known
        to take at most LONE_FORWARD_S (cost 0: before the request is tokenized, whether a one-row forward ever
        does)."""
        return rows == 1 and max(cost, 1) * self._lone_s <= LONE_FORWARD_S and not self._queue and self._alone() \
            and self._loop_thread == threading.get_ident()

    def run_now(self, rows: Sequence[Any], costs: Sequence[int], lone: bool = False) -> list[Any]:
        """A request's rows at once, here (only when `now()` says so, or `lone()` for `lone`): one row is one forward
        on a lane with no job, future or runner (the core's path for a small request of a tiny model: ~2 µs less than
        `_run_here` in a tight loop, 4-8 µs less under load; a lone row's on the latency lane); more rows run as the
        direct path runs them. The same metrics, learning, lane accounting and timing record as a queued forward."""
        if len(rows) != 1:
            return self._run_here(self._whole(rows, costs, as_is))
        observer = self.observer
        if observer is not None:
            observer.waited(0.0)
        # the lane _take would give (the latency lane, else a narrow one), not taken: this forward runs to its end
        # on the event loop's thread, the only one that takes lanes and CPUs or reads them (`now`, `lone`, the
        # dispatch), so nothing could see them taken; and nothing to give back after it, a failure included
        session = self.wide if lone and self.wide is not None and self.budget is not None else self._idle[-1]
        # (_clock_now(), written out; a latency-lane forward's clock is always read: it counts only the calling
        # thread's part of its CPU, but such forwards take milliseconds, tiny by either judgement)
        clock = lone or self.cpu_clock and self._clock_due <= 0
        t0, c0 = time.perf_counter(), time.thread_time() if clock else 0.0
        out = self.forward(session, rows)
        t1 = time.perf_counter()
        cpu = time.thread_time() - c0 if clock else None
        self._took(t1 - t0, cpu, True)
        if lone:
            self._lone_took(t1 - t0, costs[0])
        if observer is not None:
            observer.forward(1, costs[0], t1 - t0)
        _record(t0, t0, t1 - t0, (t0, t1))
        return out

    def _run_here(self, fn: Callable[[Runner], T]) -> T:
        """A direct request of a tiny model with a lane free and nobody queued: no job, future or timer (no queue
        to wait in, no thread to hop to); the same metrics, timing record and lane accounting as the queued path."""
        now = time.perf_counter()
        if self.observer is not None:
            self.observer.waited(0.0)
        session = self._take()      # a narrow lane: the latency lane's pool threads spin after each forward,
        self.running += 1           # CPU a forward of a few µs never pays back
        runner = Runner(session, self.forward, self.observer)
        runner.on_thread = self._clock_now()
        try:
            return fn(runner)
        finally:
            self._learn(runner)
            self._give_back(session)
            _record(now, now, runner.spent, runner.span)

    def _tiny(self) -> bool:
        """This model's forwards take a few µs (measured): run them on the event loop, not a worker thread. A
        model judged by wall time (not `cpu_clock`) whose CPU on its worker threads says tiny but whose wall time
        does not (the wait for the GIL a busy loop holds counts in it, or a device that takes long) is tried on the
        loop now and then, with a longer gap after each try that says no."""
        if self._forwards < INLINE_AFTER:
            return False
        if self._forward_s < INLINE_FORWARD_S:
            return True
        if self.cpu_clock:       # its CPU time, wherever read, is its cost: nothing to try
            return False
        if self._cpu_s < 2 * INLINE_FORWARD_S and self._forwards >= self._next_probe:
            self._probing = True
            return True
        return False

    def _learn(self, runner: Runner) -> None:
        if runner.took:
            self._took(runner.took, runner.took_cpu, threading.get_ident() == self._loop_thread)
            if runner.took_cost is not None and runner.session is self.wide:
                self._lone_took(runner.took, runner.took_cost)

    def _lone_took(self, wall: float, cost: int) -> None:
        """A one-row forward of `cost` tokens on the latency lane took `wall` seconds (whichever thread ran it)."""
        per = wall / max(cost, 1)
        self._lone_s = per if self._lone_s == math.inf else self._lone_s + (per - self._lone_s) * 0.1

    def _clock_now(self) -> bool:
        """Read the thread's CPU clock around the next forward on the loop (CLOCK_EVERY)."""
        return self.cpu_clock and self._clock_due <= 0

    def _took(self, wall: float, cpu: float | None, here: bool) -> None:
        """A forward's wall seconds and its CPU seconds on the thread that ran it (None: not read; always read on
        a worker thread); `here`: it ran on the event loop."""
        self._forwards += 1
        weight = 1.0 if self._forwards == 1 else 0.1
        if self.cpu_clock:                   # the CPU time is the cost: one average for both decisions
            if cpu is None:
                if wall >= INLINE_FORWARD_S:  # preempted, a wait for the GIL, or slow: the next one's CPU says
                    self._clock_due = 0
                    return
                cpu = wall                   # (at least its CPU time, and below the line)
                self._clock_due -= 1
            else:
                self._clock_due = CLOCK_EVERY if cpu < INLINE_FORWARD_S else 0
            self._cpu_s = self._forward_s = self._cpu_s + (min(cpu, SPIKE_S) - self._cpu_s) * weight
            return
        if cpu is None:                      # not read: on the loop (the wall time stands for it)
            cpu = wall
        self._cpu_s += (cpu - self._cpu_s) * weight
        if self._probing and here:           # a try on the loop: a clean measurement, taken as it is
            self._probing = False
            self._forward_s = wall
            ok = wall < INLINE_FORWARD_S
            self._probe_gap = PROBE_GAP[0] if ok else min(self._probe_gap * 2, PROBE_GAP[1])
            self._next_probe = self._forwards + self._probe_gap
        elif here:      # clipped: a spike moves the average by a bounded step (see SPIKE_S)
            self._forward_s += (min(wall, SPIKE_S) - self._forward_s) * weight
        elif not self._ran_here:             # worker threads' wall times only until one ran on the loop
            self._forward_s += (wall - self._forward_s) * weight
        self._ran_here = self._ran_here or here

    def _give_back(self, session: Session) -> None:
        """A lane back after its forward (a worker's or one run here); its CPUs back to the budget (models waiting
        for them are called, in turn)."""
        self.running -= 1
        wide = session is self.wide
        if not wide:
            self._idle.append(session)
        if self.budget is not None:
            self.budget.give(self.budget.total if wide else self.cost)

    def _release(self, session: Session, fut: asyncio.Future[None]) -> None:
        if not fut.cancelled() and fut.exception() is not None:  # a bug in the scheduler itself: say so
            log.error("model %s: worker failed: %r", self.name, fut.exception())
        self._give_back(session)
        self._dispatch()

    # ------------------------------------------------------------ worker threads

    def _post(self, results: list[tuple[_Job, Any, BaseException | None]]) -> None:
        if results:
            if threading.get_ident() == self._loop_thread:     # a train run on the loop itself
                self._answer(results)
            else:
                self._get_loop().call_soon_threadsafe(self._answer, results)

    def _run_direct(self, session: Session, arg: tuple[_Job, Runner]) -> None:
        job, runner = arg
        try:
            self._post([(job, job.direct(runner) if job.direct else None, None)])
        except Cancelled:
            pass  # nobody waits for it
        except Exception as exc:  # noqa: BLE001 - handed to its caller
            self._post([(job, None, exc)])
        finally:
            self._learn(runner)   # (a float and an int: a stale read by the loop only delays the switch)

    def _run_train(self, session: Session, train: list[list[tuple[_Job, int]]]) -> None:
        """Each forward of the train; the requests it completes are answered as it completes them."""
        for chunk in train:
            live = [(job, i) for job, i in chunk if not job.done]  # a caller gone meanwhile: skip its rows
            if not live:
                continue
            outs = self._timed_forward(session, live)
            if outs is not None:
                self._post(self._delivered(live, outs))

    def _timed_forward(self, session: Session, live: list[tuple[_Job, int]]) -> list[Any] | None:
        """One forward of a train over `live` rows, timed and counted; None when it failed (its requests told)."""
        costs = [job.costs[i] for job, i in live]
        here = threading.get_ident() == self._loop_thread
        clock = not here or self._clock_now()
        t0, c0 = time.perf_counter(), time.thread_time() if clock else 0.0
        try:
            outs = self.forward(session, [job.rows[i] for job, i in live])
        except Exception as exc:  # noqa: BLE001 - handed to exactly the requests with rows in it
            self._post([(job, None, exc) for job in dict.fromkeys(job for job, _ in live)])
            return None
        t1 = time.perf_counter()
        self._took(t1 - t0, time.thread_time() - c0 if clock else None, here)
        if len(live) == 1 and session is self.wide:
            self._lone_took(t1 - t0, costs[0])
        for job in dict.fromkeys(job for job, _ in live):
            job.ran(t0, t1)
        if self.observer is not None:
            self.observer.forward(len(live), len(live) * max(costs), t1 - t0)
        return outs

    @staticmethod
    def _delivered(live: list[tuple[_Job, int]], outs: list[Any]) -> list[tuple[_Job, Any, BaseException | None]]:
        """The forward's outputs into their requests; the answers of the requests they complete."""
        answers: list[tuple[_Job, Any, BaseException | None]] = []
        for (job, i), out in zip(live, outs, strict=True):
            with job.lock:
                job.outputs[i] = out
                job.remaining -= 1
                last = job.remaining == 0
            if last and not job.done and job.finish is not None:
                try:
                    answers.append((job, job.finish(job.outputs), None))
                except Exception as exc:  # noqa: BLE001 - this request's own error
                    answers.append((job, None, exc))
        return answers
