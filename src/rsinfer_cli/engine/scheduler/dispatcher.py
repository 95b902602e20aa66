"""The dispatcher: starts what the queue holds on the lanes that are free. Rows are taken oldest request first (up to
`max_rows` per idle lane) and only the taken rows are grouped by length, so a row's wait is bounded by its age, never
by its length; a direct job holds one lane for its whole request. A row's forward runs on a worker thread (or on the
loop, when the learner says the model's forwards are tiny), and the thread that completes a request's last row also
builds its answer (`finish`): a batched request crosses to worker threads twice at most, once to tokenize, once here.
A caller that goes away marks its job done: a direct job stops before its next forward (`Cancelled`)."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any, TypeVar

from ..batching import plan_batches
from ..session import Session
from .admission import Admission, Job
from .contract import Cancelled, Observer, RowForward
from .lanes import Lanes
from .learner import Learner
from .runner import Runner, run_rows, stamped

log = logging.getLogger("rsinfer.engine")

T = TypeVar("T")
Results = list[tuple[Job, Any, BaseException | None]]


class Dispatcher:
    def __init__(self, name: str, forward: RowForward, executor: Executor, admission: Admission, lanes: Lanes,
                 learner: Learner, *, batching: bool, max_rows: int, max_tokens: int, max_padding: int | None,
                 observer: Observer | None) -> None:
        self.name = name
        self.forward = forward
        self.executor = executor
        self.admission = admission
        self.lanes = lanes
        self.learner = learner
        self.batching = batching
        self.max_rows = max_rows
        self.max_tokens = max_tokens
        self.max_padding = max_padding
        self.observer = observer
        if observer is not None:
            admission.on_start = observer.waited
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0

    def _get_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = self.admission.loop = asyncio.get_running_loop()
            self._loop_thread = threading.get_ident()
        return self._loop

    def _whole(self, rows: Sequence[Any], costs: Sequence[int], finish: Callable[[list[Any]], T]
               ) -> Callable[[Runner], T]:
        """Rows that do not batch, as a direct job: all of them on one lane in length-sorted forwards."""
        def whole(runner: Runner) -> T:
            return finish(run_rows(runner, rows, costs, max_rows=self.max_rows, max_tokens=self.max_tokens,
                                   max_padding=self.max_padding))

        return whole

    # ------------------------------------------------------------ on the event loop

    def _dispatch(self) -> None:
        jobs = self.admission.jobs
        lanes = self.lanes
        while jobs:
            head = jobs[0]
            if head.done:
                jobs.popleft()
                continue
            slots = lanes.slots()
            if slots == 0:
                lanes.wait(id(self), self._dispatch)    # another model holds the CPUs: called back
                return
            if head.direct is None:
                self._stage(slots)
                continue
            jobs.popleft()
            self.admission.start(head)
            self.admission.purge()
            tiny = self.learner.tiny()
            wide = not tiny and not jobs and lanes.alone()
            session = lanes.take(wide=wide)
            runner = Runner(session, self.forward, self.observer, head, self.learner, here=tiny,
                            clock=not tiny or self.learner.clock_now(), wide=session is lanes.wide)
            if tiny:
                self._inline(session, head, runner)
            else:
                self._launch(session, self._run_direct, (head, runner))

    def _stage(self, idle: int) -> None:
        """Oldest rows first, up to `max_rows` per idle lane; those grouped by length into one train of
        forwards per idle lane (or the latency lane, for a single forward that would run alone)."""
        staged = self.admission.take_rows(self.max_rows * idle)
        if not staged:
            return
        share = min(max(math.ceil(len(staged) / idle), 1), self.max_rows)
        chunks = plan_batches([job.costs[i] for job, i in staged], share, self.max_tokens, self.max_padding)
        lanes = self.lanes
        if self.learner.tiny():              # forwards of a few µs: all of them here, now, in one train
            session = lanes.take()
            try:
                self._run_train(session, [[staged[i] for i in c] for c in chunks])
            finally:
                lanes.give_back(session)
            return
        if len(chunks) == 1 and lanes.alone():
            self.admission.purge()
            if not self.admission.jobs:
                self._launch(lanes.take(wide=True), self._run_train, [[staged[i] for i in chunks[0]]])
                return
        per_worker = math.ceil(len(chunks) / idle)
        for k in range(0, len(chunks), per_worker):
            train = [[staged[i] for i in c] for c in chunks[k:k + per_worker]]
            self._launch(lanes.take(), self._run_train, train)

    def _launch(self, session: Session, fn: Callable[[Session, Any], None], arg: Any) -> None:
        fut = self._get_loop().run_in_executor(self.executor, fn, session, arg)
        fut.add_done_callback(lambda f: self._release(session, f))

    def _release(self, session: Session, fut: asyncio.Future[None]) -> None:
        if not fut.cancelled() and fut.exception() is not None:  # a bug in the scheduler itself: say so
            log.error("model %s: worker failed: %r", self.name, fut.exception())
        self.lanes.give_back(session)
        self._dispatch()

    def _inline(self, session: Session, job: Job, runner: Runner) -> None:
        """A direct job run here, on the event-loop thread (its forwards take a few µs)."""
        try:
            result = job.direct(runner) if job.direct else None
        except Cancelled:
            result = None
            job.done = True
        except Exception as exc:  # noqa: BLE001 - handed to its caller
            self.lanes.give_back(session)
            self.admission.fail(job, exc)
            return
        self.lanes.give_back(session)
        self.admission.answer([(job, result, None)])

    def _run_here(self, fn: Callable[[Runner], T], timed: Callable[[float, float, float, Any], None] | None
                  ) -> T:
        """A direct request of a tiny model with a lane free and nobody queued: no job, future or timer (no queue
        to wait in, no thread to hop to); the same metrics, timing record and lane accounting as the queued path."""
        now = time.perf_counter()
        if self.observer is not None:
            self.observer.waited(0.0)
        session = self.lanes.take()   # a narrow lane: the latency lane's pool threads spin after each forward,
        runner = Runner(session, self.forward, self.observer, None, self.learner,   # CPU a tiny forward never repays
                        here=True, clock=self.learner.clock_now())
        try:
            return fn(runner)
        finally:
            self.lanes.give_back(session)
            if timed is not None:
                timed(now, now, runner.spent, runner.span)

    # ------------------------------------------------------------ worker threads (or the loop, for tiny forwards)

    def _post(self, results: Results) -> None:
        if results:
            if threading.get_ident() == self._loop_thread:     # a train run on the loop itself
                self.admission.answer(results)
            else:
                self._get_loop().call_soon_threadsafe(self.admission.answer, results)

    def _run_direct(self, session: Session, arg: tuple[Job, Runner]) -> None:
        job, runner = arg
        try:
            self._post([(job, job.direct(runner) if job.direct else None, None)])
        except Cancelled:
            pass  # nobody waits for it
        except Exception as exc:  # noqa: BLE001 - handed to its caller
            self._post([(job, None, exc)])

    def _run_train(self, session: Session, train: list[list[tuple[Job, int]]]) -> None:
        """Each forward of the train; the requests it completes are answered as it completes them."""
        here = threading.get_ident() == self._loop_thread
        for chunk in train:
            live = [(job, i) for job, i in chunk if not job.done]  # a caller gone meanwhile: skip its rows
            if not live:
                continue
            try:
                outs, t0, t1 = stamped(self.forward, session, [job.rows[i] for job, i in live],
                                       [job.costs[i] for job, i in live], self.learner, self.observer, here,
                                       not here or self.learner.clock_now(), session is self.lanes.wide)
            except Exception as exc:  # noqa: BLE001 - handed to exactly the requests with rows in it
                self._post([(job, None, exc) for job in dict.fromkeys(job for job, _ in live)])
                continue
            for job in dict.fromkeys(job for job, _ in live):
                job.ran(t0, t1)
            self._post(self._delivered(live, outs))

    @staticmethod
    def _delivered(live: list[tuple[Job, int]], outs: list[Any]) -> Results:
        """The forward's outputs into their requests; the answers of the requests they complete."""
        answers: Results = []
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
