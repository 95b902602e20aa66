"""The transport-free inference core (what TEI's `core::Infer` is): a request's plan → its answer, for every front
door - the HTTP routes, KServe gRPC, the front end of the worker split, the one-shot CLI and the Python API. Each
passes the request's own `RequestRecord`. The core resolves the model's version (a version a reload retired answers
what it still holds), splits the rows by the row cache, awaits the model's queue's `answer` (the queue alone picks
the path: engine/scheduler/queue.py, workers/frontend.py) and tells the metrics. Cancellation is the queue's: a caller
that goes away (its task cancelled) takes its queued rows with it; its tokenizing and post-processing stop at their
next checkpoint (engine/cancel.py). Nothing here knows HTTP or gRPC."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, Generic, ParamSpec, Protocol, TypeVar

from ..engine.cache import Cache
from ..engine.cancel import Stop, Token, running
from ..engine.model import LoadedModel
from ..engine.scheduler import ModelQueue, QueueStats, as_is
from ..engine.threads import CpuBudget
from ..errors import ModelNotFound
from ..pipelines.base import Cached, RowPipeline, Timing, Work
from .record import RequestRecord

R = TypeVar("R")
# a family's plan's own parameters, carried through every layer to it: what a route passes is checked against them
PlanArgs = ParamSpec("PlanArgs")
# a request this small (its record's body_bytes) may be tokenized and answered on the event loop, where a thread hop
# would cost more than the work (the queue decides when)
INLINE_BYTES = 4096


class Observer(Protocol):
    """What the metrics hear of each request (server/metrics.Metrics)."""

    def observe_request(self, model: str, version: str, timing: Timing) -> None:
        """A request that tokenized (its tokens or its tokenize time): its usage."""

    def cache_lookup(self, model: str, hits: int, misses: int) -> None: ...

    def outcome(self, model: str, version: str, ok: bool, seconds: float, record: RequestRecord | None) -> None: ...

    def cpu(self, model: str, seconds: float) -> None:
        """The CPU time of a request's work on the threads that ran it (a cancelled one's too)."""


class _Rest(Generic[R]):
    """The rows the row cache did not hold, as a request of their own (engine/scheduler's `Asked`): planned already;
    its answer is theirs (to cache) and the whole request's, built from them and the cache's in the request's order;
    its spans and times go to the request's record."""

    __slots__ = ("record", "split", "work", "token", "small", "timed")

    def __init__(self, record: RequestRecord, split: Cached) -> None:
        self.record, self.split = record, split
        self.token, self.small, self.timed = record.token, record.small, record.timed
        self.work: Work[list[Any]] = Work(split.rows, split.costs, as_is)

    def plan(self) -> Work[list[Any]]:
        return self.work

    def finish(self, outputs: list[Any]) -> tuple[list[Any], R]:
        answer: R = self.record.finish(self.split.merge(outputs))
        return outputs, answer


class Inference:
    """Every served model's way from a plan (`pipeline.plan_*`: tokenizing, → `Work`) to the answer."""

    def __init__(self, pipelines: dict[str, RowPipeline], queues: dict[str, ModelQueue], prep: Executor,
                 observer: Observer, cache: Cache | None = None, min_inference_ms: float = 0.0,
                 timeout_s: float = 120.0, flight: CpuBudget | None = None) -> None:
        self.pipelines = pipelines
        self.queues = queues
        self.prep = prep                 # the cache's keys and the answers of requests it held whole
        self.observer = observer
        self.cache = cache
        self.min_inference_ms = min_inference_ms   # cache a request's rows only if their forwards took this long
        # requests in flight: each version counts its own (LoadedModel.in_flight, what a reload waits for before it
        # frees the version), and all of them, in the process's CPU budget (a queue runs a lone request on the loop
        # only while it is the one)
        self.flight = flight if flight is not None else CpuBudget(1)
        # versions a reload replaced or removed, by id, with their pipeline and queue: what they still hold finishes
        self.retiring: dict[int, tuple[RowPipeline, ModelQueue]] = {}
        # a request's tokenizing and post-processing stop at its deadline (server.request_timeout_ms), when its
        # caller goes away, or when the server closes (`cancel_all`: every token's `stop`; engine/cancel.py)
        self.timeout_s = timeout_s
        self.stop = Stop()

    @property
    def in_flight(self) -> int:
        return self.flight.requests

    async def infer(self, record: RequestRecord, model: LoadedModel, plan: Callable[PlanArgs, Work[R]],
                    *args: PlanArgs.args, **kwargs: PlanArgs.kwargs) -> R:
        """plan(*args, **kwargs) → Work, its rows run, its answer built: by the model's queue, after the row cache
        where the model has one."""
        key = model.key
        pipe = self.pipelines.get(key)
        if pipe is not None and pipe.model is model:    # the version served now (_serving, written out)
            queue = self.queues[key]
        else:
            pipe, queue = self._serving(model)
        config = model.config      # its name and version: not the properties, a call each
        record.model = key
        token = record.token = Token(self.timeout_s, self.stop)
        record.call = (plan, args, kwargs)
        body = record.body_bytes
        record.small = body is not None and body <= INLINE_BYTES
        model.in_flight += 1                    # in flight (written out: a call each costs every request)
        self.flight.requests += 1
        t0 = time.perf_counter()
        ok = False
        try:
            if self.cache is not None and config.cache:
                result: R = await self._cached(model, pipe, queue, record)
            else:
                result = await queue.answer(record)
            work = record.work
            if work is not None:           # its usage to the metrics (a request that tokenized), its rows to its record
                timing = work.timing
                if timing.tokens or timing.tokenize_s:
                    self.observer.observe_request(config.name, config.version or "", timing)
                record.rows = (record.rows or 0) + len(work.rows)
            ok = True
            return result
        except asyncio.CancelledError:    # its deadline or its caller's leaving: what runs of it on a thread stops
            token.cancelled = True          # (at its next checkpoint; the CPU it takes till then is counted too)
            token.late = functools.partial(self.observer.cpu, config.name)
            raise
        finally:
            self.flight.requests -= 1
            model.in_flight -= 1
            if token.cpu_s:
                self.observer.cpu(config.name, token.cpu_s)
            self.observer.outcome(config.name, config.version or "", ok, time.perf_counter() - t0, record)

    def _serving(self, model: LoadedModel) -> tuple[RowPipeline, ModelQueue]:
        """The model's pipeline and queue; a version a reload replaced or removed while the request was on its
        way answers from what it still holds (ModelNotFound once it is gone)."""
        pipe = self.pipelines.get(model.key)
        if pipe is not None and pipe.model is model:
            return pipe, self.queues[model.key]
        held = self.retiring.get(id(model))
        if held is None:
            raise ModelNotFound(f"model '{model.name}' was unloaded while this request waited; send it again",
                                model=model.name)
        return held

    def cancel_all(self) -> None:
        """Every request in flight told to stop its work at its next checkpoint (the server is closing)."""
        self.stop.now = True

    def run(self, record: RequestRecord, model: LoadedModel, plan: Callable[PlanArgs, Work[R]],
            *args: PlanArgs.args, **kwargs: PlanArgs.kwargs) -> R:
        """plan(*args, **kwargs) → its answer, here and now on the model's first replica (the one-shot CLI and the
        Python API: no queue): the rows in length-sorted forwards, those in the cache not run again."""
        pipe = self.pipelines[model.key]
        record.model = model.key
        record.call = (plan, args, kwargs)
        work = record.plan()
        runner = pipe.runner()
        t0 = time.perf_counter()
        if self.cache is None or not model.config.cache:
            outs = pipe.forwards(work.rows, work.costs, runner)
        else:
            keys = pipe.row_keys(work)
            split = Cached(work, self.cache.get_many(keys), keys)
            record.cache = split.status
            done = pipe.forwards(split.rows, split.costs, runner) if split.missing else []
            self.cache.set_many(split.entries(keys, done))
            outs = split.merge(done)
        record.timed(t0, t0, runner.spent, runner.span)
        record.rows = len(work.rows)
        answer: R = record.finish(outs)
        return answer

    async def _cached(self, model: LoadedModel, pipe: RowPipeline, queue: ModelQueue, record: RequestRecord
                      ) -> R:
        """Rows already in the cache are not run again: the missing ones go to the queue like any other request's
        rows, and the answer is built from all of them in the request's order."""
        assert self.cache is not None
        cache = self.cache
        loop = asyncio.get_running_loop()

        def keyed() -> tuple[Work[R], list[bytes]]:
            work = record.plan()
            return work, pipe.row_keys(work)

        work, keys = await loop.run_in_executor(self.prep, running, record.token, keyed)
        split = Cached(work, await cache.aget_many(keys), keys)
        record.cache = split.status
        self.observer.cache_lookup(model.name, len(work.rows) - split.misses, split.misses)
        if not split.missing:
            answer: R = await loop.run_in_executor(self.prep, running, record.token, record.finish, split.outputs)
            return answer
        t0 = time.perf_counter()
        rest: _Rest[R] = _Rest(record, split)
        outs, result = await queue.answer(rest)
        if (time.perf_counter() - t0) * 1000 >= self.min_inference_ms:  # only what was worth computing
            await cache.aset_many(split.entries(keys, outs))
        return result

    def queue_stats(self, models: dict[str, LoadedModel]) -> list[tuple[str, str, int, int, int]]:
        """(model, version, requests waiting, rows queued, forwards running)."""
        out = []
        for key, q in self.queues.items():
            s: QueueStats = q.stats()
            out.append((models[key].name, models[key].version or "", s.waiting, s.queued_rows, s.running))
        return out
