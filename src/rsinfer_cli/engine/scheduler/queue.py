"""One scheduler per model: the local `ModelQueue`. `answer` picks a request's path, the only place that does:

- **now**: the model's forwards are tiny (the learner), a lane is free and nobody is queued: plan, forward and answer
  here on the event loop, with no job, future or thread hop.
- **lone**: a small request (its body) that would run alone in the process on the latency lane: tokenized here, and
  its one row's forward here too when the lane's one-row forward is known to be short (a hop to a worker thread and
  back cost a one-client request ~0.3 ms on 2 CPUs, benchmarks/latency.py).
- **batched**: batching on and no lane free: tokenized on the prep pool, its rows queued to share forwards with other
  requests' rows; the worker that runs its last row builds the answer.
- **direct**: otherwise (a lane free, or batching off, or more rows than the queue holds): the whole request on one
  lane in one thread hop (plan, length-sorted forwards, answer).

The engine process of the worker split sends rows, not requests: `enqueue` (no coroutine or task per request)."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from threading import get_ident as _thread
from typing import Any, TypeVar

from ..cancel import running
from ..session import Session
from ..threads import CpuBudget
from .admission import Admission, Job
from .contract import Asked, Forwarding, Observer, QueueStats, RowForward, Rows, as_is
from .dispatcher import Dispatcher
from .lanes import Lanes
from .learner import Learner, Tunables
from .runner import Runner, run_rows, stamped

P = TypeVar("P")
R = TypeVar("R")
T = TypeVar("T")


class Scheduler(Dispatcher):
    def __init__(self, name: str, sessions: Sequence[Session], forward: RowForward, executor: Executor, *,
                 batching: bool, max_rows: int, max_tokens: int, max_padding: int | None = None,
                 queue_rows: int = 1024, max_queue: int = 256, queue_timeout_s: float = 30.0,
                 observer: Observer | None = None, wide: Session | None = None, budget: CpuBudget | None = None,
                 cost: int = 1, cpu_clock: bool = False, prep: Executor | None = None,
                 tunables: Tunables | None = None) -> None:
        lanes = Lanes(sessions, wide, budget, cost)
        admission = Admission(name, max(queue_rows, max_rows, 1), max_queue, queue_timeout_s)
        super().__init__(name, forward, executor, admission, lanes, Learner(cpu_clock, tunables), batching=batching,
                         max_rows=max_rows, max_tokens=max_tokens, max_padding=max_padding, observer=observer)
        self.prep = prep or executor      # tokenizing and the answers of batched requests
        self.replicas = lanes.replicas

    @classmethod
    def for_model(cls, key: str, model: Any, pipe: Forwarding, executor: Executor, *,
                  queue_rows: int, max_queue: int, queue_timeout_ms: int, observer: Observer | None = None,
                  forward: RowForward | None = None, budget: CpuBudget | None = None,
                  prep: Executor | None = None) -> Scheduler:
        """A model's (`LoadedModel`) scheduler over its lanes, with its pipeline's batching settings and the server's
        admission limits; a planned CPU model takes its CPUs from `budget`. `forward` replaces the pipeline's (the
        engine process tags rows with the front end they came from)."""
        planned = model.threads.budgeted
        on_caller = model.backend == "onnx" and model.on_cpu and model.threads.threads == 1
        return cls(key, model.sessions, forward or pipe.forward, executor, batching=pipe.batching,
                   max_rows=pipe.max_rows, max_tokens=pipe.max_tokens, max_padding=pipe.max_padding,
                   queue_rows=queue_rows, max_queue=max_queue, queue_timeout_s=queue_timeout_ms / 1000,
                   observer=observer, wide=model.wide, budget=budget if planned else None,
                   cost=model.threads.threads, cpu_clock=on_caller, prep=prep)

    # ------------------------------------------------------------ ModelQueue

    async def answer(self, ask: Asked[R]) -> R:
        """The request's path (the module's doc), its answer."""
        token = ask.token
        if self.now():
            here: R = running(token, self._here, ask)
            return here
        if ask.small and self.lone() and await self._still_alone():
            work = running(token, ask.plan)
            if self.lone(len(work.rows), work.costs[0] if work.rows else 0):   # one short row: its forward too
                lone: R = running(token, self._here_lone, ask, work)
                return lone
            return await self.run(functools.partial(running, token, self._whole(work.rows, work.costs, ask.finish)),
                                  ask)
        if self.batching and not self.free:
            loop = self._get_loop()
            planned = await loop.run_in_executor(self.prep, running, token, ask.plan)
            return await self.submit(planned.rows, planned.costs, functools.partial(running, token, ask.finish),
                                     ask)
        return await self.run(functools.partial(running, token, self._planned_whole, ask), ask)

    def stats(self) -> QueueStats:
        return QueueStats(self.admission.waiting, self.admission.queued_rows, self.lanes.running)

    def stop(self) -> None:
        """Fail whatever still waits (after the server drained the requests it accepted)."""
        self.admission.stop()

    # ------------------------------------------------------------ the paths

    def _here(self, ask: Asked[R]) -> R:
        work = ask.plan()
        return ask.finish(self.run_now(work.rows, work.costs, ask=ask))

    def _here_lone(self, ask: Asked[R], work: Rows) -> R:
        return ask.finish(self.run_now(work.rows, work.costs, lone=True, ask=ask))

    def _planned_whole(self, ask: Asked[R], runner: Runner) -> R:
        work = ask.plan()
        return ask.finish(run_rows(runner, work.rows, work.costs, max_rows=self.max_rows,
                                   max_tokens=self.max_tokens, max_padding=self.max_padding))

    async def _still_alone(self) -> bool:
        """Whether a request that would run alone still would once the requests that came in with it have started:
        a loop iteration later, nothing else is in flight in the process (under load, clients' requests arrive
        together; the first one run on the loop would keep the others from being read, then batched, until its
        forward ended)."""
        await asyncio.sleep(0)
        budget = self.lanes.budget
        return (budget is None or budget.requests <= 1) and self.lone()

    @property
    def free(self) -> bool:
        """A lane is idle and nothing waits: a request now would start at once."""
        self.admission.purge()
        return self.lanes.slots() > 0 and not self.admission.jobs

    @property
    def waiting(self) -> int:
        return self.admission.waiting

    @property
    def queued_rows(self) -> int:
        return self.admission.queued_rows

    @property
    def running(self) -> int:
        return self.lanes.running

    def now(self) -> bool:
        """A request would run at once, here on the event loop's thread (`run_now`, `_run_here`): the model's forwards
        are tiny, a lane is free and nobody is queued before it."""
        lanes = self.lanes      # (Lanes.open and Learner.inline, written out: this runs for every request)
        if self.admission.jobs or not lanes.idle or self._loop_thread != _thread():
            return False
        budget = lanes.budget
        if budget is not None and budget.free < lanes.cost:
            return False
        learner = self.learner
        return (learner.forwards >= learner.t.inline_after and learner.forward_s < learner.t.inline_forward_s) \
            or learner.tiny()

    def lone(self, rows: int = 1, cost: int = 0) -> bool:
        """`rows` of `cost` (tokens) would run at once, here on the event loop's thread, on the latency lane: one
        row, nothing else running or waiting in the process, and its forward known to take at most the learner's
        lone_forward_s (cost 0: before the request is tokenized, whether a one-row forward ever does)."""
        return rows == 1 and self.learner.lone_short(cost) and not self.admission.jobs and self.lanes.alone() \
            and self._loop_thread == _thread()

    def run_now(self, rows: Sequence[Any], costs: Sequence[int], lone: bool = False,
                ask: Asked[Any] | None = None) -> list[Any]:
        """A request's rows at once, here (only when `now()` says so, or `lone()` for `lone`): one row is one forward
        on a lane with no job, future or runner; more rows run as the direct path runs them. The same metrics,
        learning, lane accounting and timing record as a queued forward."""
        if len(rows) != 1:
            return self._run_here(self._whole(rows, costs, as_is), ask.timed if ask is not None else None)
        observer = self.observer
        if observer is not None:
            observer.waited(0.0)
        # the lane `take` would give, not taken: this forward runs to its end on the event loop's thread, the only
        # one that takes lanes and CPUs or reads them, so nothing could see them taken (a latency-lane forward's
        # clock is always read: such forwards take milliseconds, tiny by either judgement)
        lanes, learner = self.lanes, self.learner     # (Lanes.lone_lane and Learner.clock_now, written out)
        session = lanes.wide if lone and lanes.wide is not None and lanes.budget is not None else lanes.idle[-1]
        out, t0, t1 = stamped(self.forward, session, rows, costs, learner, observer, True,   # here, on the loop
                              lone or learner.cpu_clock and learner.clock_due <= 0, lone)
        if ask is not None:
            ask.timed(t0, t0, t1 - t0, (t0, t1))
        return out

    # ------------------------------------------------------------ jobs

    async def run(self, fn: Callable[[Runner], T], ask: Asked[Any] | None = None) -> T:
        """fn(runner) on a worker thread holding one lane: a whole request in one hop; at once, here, when the
        model's forwards are tiny and a lane is free with nobody queued before it."""
        if self.now():
            return self._run_here(fn, ask.timed if ask is not None else None)
        job = self.admission.admit(Job(self._get_loop().create_future(), time.perf_counter(), direct=fn, ask=ask),
                                   0, self._idle_now())
        result: T = await self._wait(job)
        return result

    async def submit(self, rows: Sequence[P], costs: Sequence[int], finish: Callable[[list[Any]], T],
                     ask: Asked[Any] | None = None) -> T:
        """A request's rows → finish(their outputs in row order). Batched with other requests' rows when
        batching is on and they fit the queue; else on one lane as a direct job."""
        n = len(rows)
        if n == 0:
            return finish([])
        if not self.batching or n > self.admission.capacity:
            return await self.run(self._whole(rows, costs, finish), ask)
        job = Job(self._get_loop().create_future(), time.perf_counter(), rows=rows, costs=costs, finish=finish,
                  ask=ask, outputs=[None] * n, remaining=n)
        self.admission.admit(job, n, self._idle_now())
        result: T = await self._wait(job)
        return result

    def enqueue(self, rows: Sequence[P], costs: Sequence[int], finish: Callable[[list[Any]], Any],
                done: Callable[[Any, BaseException | None], None]) -> Callable[[], None] | None:
        """`submit` without a coroutine or task of its own (an engine process takes thousands of small requests a
        second): `done(answer, None)` or `done(None, error)` once the rows are answered, failed or timed out, never
        after they were abandoned. Returns the function that abandons them, or None when `done` was called before
        this returned: no rows, or a tiny model's direct request run at once on a free lane. Saturated is raised
        here, as submit raises it. (A lone row is not run at once here: rows of several front ends arrive together,
        and the first one run on the loop would keep the others from being read, then batched.)"""
        n = len(rows)
        if n == 0:
            done(finish([]), None)
            return None
        loop = self._get_loop()
        if not self.batching or n > self.admission.capacity:
            if self.now():
                try:
                    answer = finish(self.run_now(rows, costs))
                except Exception as exc:  # noqa: BLE001 - the request's error, handed to its caller
                    done(None, exc)
                else:
                    done(answer, None)
                return None
            job = Job(loop.create_future(), time.perf_counter(), direct=self._whole(rows, costs, finish))
            self.admission.admit(job, 0, self._idle_now())
        else:
            job = Job(loop.create_future(), time.perf_counter(), rows=rows, costs=costs, finish=finish,
                      outputs=[None] * n, remaining=n)
            self.admission.admit(job, n, self._idle_now())

        def answered(future: asyncio.Future[Any]) -> None:
            if not future.cancelled():   # cancelled: abandoned, nobody to tell
                exc = future.exception()
                done(None if exc is not None else future.result(), exc)

        job.future.add_done_callback(answered)
        self._dispatch()

        def abandon() -> None:
            self.admission.close(job)
            job.future.cancel()

        return abandon

    def _idle_now(self) -> bool:
        """A lane is idle and nobody waits: a job admitted now starts at once (no admission limit applies)."""
        return bool(self.lanes.idle) and not self.admission.jobs

    async def _wait(self, job: Job) -> Any:
        self._dispatch()
        try:
            return await job.future
        except asyncio.CancelledError:
            self.admission.close(job)  # the caller went away: drop its queued rows, stop its direct forwards
            raise
        finally:
            job.timed()
