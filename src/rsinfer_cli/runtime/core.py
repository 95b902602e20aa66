"""The transport-free inference core (what TEI's `core::Infer` is): a request's plan → its answer, for every front
that serves requests - the HTTP routes, KServe gRPC and the front end of the worker split. It owns the row-cache
lookup, the path choice (the whole request on a free replica now, or tokenized and queued to batch with others), the
record of the request (tokenize, queue, inference, post-processing: `REQUEST_RECORD` and the pipeline's
`Timing`) and what the metrics hear of it. Cancellation is the scheduler's: a caller that goes away (its task
cancelled) takes its queued rows with it. Nothing here knows HTTP or gRPC; the one-shot CLI's requests come through
`run`, synchronously on one replica, with the same cache."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, ParamSpec, Protocol, TypeVar

from ..engine.cache import Cache
from ..engine.cancel import Token, running
from ..engine.model import LoadedModel
from ..engine.scheduler import REQUEST_RECORD, ModelQueue, RequestRecord, Runner, as_is
from ..errors import ModelNotFound
from .base import Cached, RowPipeline, Timing, Work

R = TypeVar("R")
# a family's plan's own parameters, carried through every layer to it: what a route passes is checked against them
PlanArgs = ParamSpec("PlanArgs")
# a front-end process (server.workers > 1) tokenizes and post-processes a request this small (its record's
# body_bytes) on its event loop, where a thread hop would cost more than the work
INLINE_BYTES = 4096


class Observer(Protocol):
    """What the metrics hear of each request (server/metrics.Metrics)."""

    def observe_request(self, model: str, version: str, timing: Timing) -> None:
        """A request that tokenized (its tokens or its tokenize time): its usage."""

    def cache_lookup(self, model: str, hits: int, misses: int) -> None: ...

    def outcome(self, model: str, version: str, ok: bool, seconds: float, record: RequestRecord | None) -> None: ...

    def cpu(self, model: str, seconds: float) -> None:
        """The CPU time of a request's work on the threads that ran it (a cancelled one's too)."""


class Inference:
    """Every served model's way from a plan (`pipeline.plan_*`: tokenizing, → `Work`) to the answer."""

    def __init__(self, pipelines: dict[str, RowPipeline], queues: dict[str, ModelQueue], prep: Executor,
                 observer: Observer, cache: Cache | None = None, min_inference_ms: float = 0.0,
                 inline_prep: bool = False, timeout_s: float = 120.0) -> None:
        self.pipelines = pipelines
        self.queues = queues
        self.prep = prep                 # tokenizing and answers of batched requests
        self.observer = observer
        self.cache = cache
        self.min_inference_ms = min_inference_ms   # cache a request's rows only if their forwards took this long
        # a front-end process (server.workers > 1): the forwards run elsewhere, so a small request is tokenized and
        # answered here (its record's body_bytes), a large one on the prep pool, never holding the loop for long
        self.inline_prep = inline_prep
        # requests in flight by model (id of its LoadedModel): what a reload waits for before it frees a version
        self.busy: dict[int, int] = {}
        self.in_flight = 0               # all of them
        # versions a reload replaced or removed, by id, with their pipeline and queue: what they still hold finishes
        self.retiring: dict[int, tuple[RowPipeline, ModelQueue]] = {}
        # a request's tokenizing and post-processing stop at its deadline (server.request_timeout_ms) or when its
        # caller goes away (engine/cancel.py); `tokens`: those of the requests in flight, cancelled by `cancel_all`
        self.timeout_s = timeout_s
        self.tokens: set[Token] = set()

    async def infer(self, model: LoadedModel, plan: Callable[PlanArgs, Work[R]], *args: PlanArgs.args,
                    **kwargs: PlanArgs.kwargs) -> R:
        """plan(*args, **kwargs) → Work, its rows run, its answer built. When a replica is free (or batching is off):
        all of it in one thread hop on that replica - there is nothing to batch with. Else tokenized on the prep
        pool, then the rows join the model's batching queue, and the worker that runs the request's last forward
        builds the answer (two hops). A tiny model's request with a lane free and nobody queued: all of it here, now,
        on the event loop (no hop, no job: `run_now`); so is a small request's one row that would run alone on the
        latency lane (`lone`), when that lane's one-row forward is short."""
        pipe, queue = self._serving(model)
        stats = REQUEST_RECORD.get()
        if stats is not None:
            stats.model = model.key
        cached = self.cache is not None and model.config.cache
        # the request counted in flight (what a reload waits for, what `_still_alone` reads) unless it runs now:
        # from here to its answer without an await, so nothing else runs while it does and nobody could read it
        now = not cached and queue.now()
        token = Token(self.timeout_s)
        if not now:
            self._enter(model, token)
        t0 = time.perf_counter()
        ok = False
        try:     # a request run now takes no coroutine of its own: `_now` is a plain call
            if cached:
                result: R = await self._cached(model, pipe, queue, _stamped(plan, stats), args, kwargs, token)
            else:
                if now:
                    work, result = self._now(queue, plan, stats, token, args, kwargs)
                else:
                    work, result = await self._queued(pipe, queue, plan, stats, token, args, kwargs)
                self._observed(model, work.timing, stats)
            ok = True
            return result
        except asyncio.CancelledError:    # its deadline or its caller's leaving: what runs of it on a thread stops
            token.cancelled = True          # (at its next checkpoint; the CPU it takes till then is counted too)
            token.late = functools.partial(self.observer.cpu, model.config.name)
            raise
        finally:
            if not now:
                self._leave(model, token)
            config = model.config      # (as in _observed)
            if token.cpu_s:
                self.observer.cpu(config.name, token.cpu_s)
            self.observer.outcome(config.name, config.version or "", ok, time.perf_counter() - t0, stats)

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

    def _enter(self, model: LoadedModel, token: Token) -> None:
        ident = id(model)
        self.busy[ident] = self.busy.get(ident, 0) + 1
        self.in_flight += 1
        self.tokens.add(token)

    def _leave(self, model: LoadedModel, token: Token) -> None:
        self.tokens.discard(token)
        self.in_flight -= 1
        ident = id(model)
        n = self.busy[ident] - 1
        if n:
            self.busy[ident] = n
        else:
            del self.busy[ident]

    @staticmethod
    def _now(queue: ModelQueue, plan: Callable[..., Work[R]], stats: RequestRecord | None, token: Token,
             args: Any, kwargs: Any) -> tuple[Work[R], R]:
        """The whole request here, on the event loop (a tiny model, a lane free, nobody queued), under its token
        once (each `running` reads the thread's CPU clock twice: ~0.3 µs a read)."""
        return running(token, _here, queue, plan, stats, args, kwargs)

    async def _queued(self, pipe: RowPipeline, queue: ModelQueue, plan: Callable[..., Work[R]],
                      stats: RequestRecord | None, token: Token, args: Any, kwargs: Any) -> tuple[Work[R], R]:
        """A request that does not run now: alone on the latency lane, through a front end's remote queue, batched
        with others, or whole on one replica (one thread hop)."""
        if stats is not None and stats.body_bytes is not None and stats.body_bytes <= INLINE_BYTES \
                and queue.lone() and await self._still_alone(queue):
            work = running(token, _planned, plan, stats, args, kwargs)     # a small body: tokenized here, then
            if queue.lone(len(work.rows), work.costs[0] if work.rows else 0):   # one short row: its forward too
                return work, running(token, _finish, work, queue.run_now(work.rows, work.costs, lone=True), stats)
            return work, await queue.run(functools.partial(running, token, pipe.run, work))
        plan = _stamped(plan, stats)
        loop = asyncio.get_running_loop()
        if self.inline_prep:
            return await self._remote(queue, plan, stats, token, args, kwargs)
        if queue.batching and not queue.free:
            work = await loop.run_in_executor(self.prep, functools.partial(running, token, plan, *args, **kwargs))
            return work, await queue.submit(work.rows, work.costs,
                                            functools.partial(running, token, _finish, work, stats=stats))
        planned: list[Work[R]] = []

        def whole(runner: Runner) -> R:
            planned.append(plan(*args, **kwargs))
            return pipe.run(planned[0], runner)

        result = await queue.run(functools.partial(running, token, whole))
        return planned[0], result

    async def _remote(self, queue: ModelQueue, plan: Callable[..., Work[R]], stats: RequestRecord | None,
                      token: Token, args: Any, kwargs: Any) -> tuple[Work[R], R]:
        """A front-end process: a small body tokenized and answered on the loop, a large one on the prep pool; the
        rows forwarded by the engine."""
        body = stats.body_bytes if stats is not None else None
        if body is not None and body <= INLINE_BYTES:
            work = running(token, plan, *args, **kwargs)
            outputs = await queue.submit(work.rows, work.costs, as_is)
            return work, running(token, _finish, work, outputs, stats)
        loop = asyncio.get_running_loop()
        work = await loop.run_in_executor(self.prep, functools.partial(running, token, plan, *args, **kwargs))
        outputs = await queue.submit(work.rows, work.costs, as_is)
        return work, await loop.run_in_executor(self.prep, running, token, _finish, work, outputs, stats)

    def cancel_all(self) -> None:
        """Every request in flight told to stop its work at its next checkpoint (the server is closing)."""
        for token in self.tokens:
            token.cancelled = True

    async def _still_alone(self, queue: ModelQueue) -> bool:
        """Whether a request that would run alone still would once the requests that came in with it have started:
        a loop iteration later, nothing else is in flight (under load, clients' requests arrive together; the first
        one run on the loop would keep the others from being read, then batched, until its forward ended)."""
        await asyncio.sleep(0)
        return self.in_flight == 1 and queue.lone()

    def run(self, model: LoadedModel, plan: Callable[PlanArgs, Work[R]], *args: PlanArgs.args,
            **kwargs: PlanArgs.kwargs) -> R:
        """plan(*args, **kwargs) → its answer, here and now on the model's first replica (the one-shot CLI: no
        queue): the rows in length-sorted forwards, those in the cache not run again."""
        pipe = self.pipelines[model.key]
        work = plan(*args, **kwargs)
        if self.cache is None or not model.config.cache:
            return pipe.run(work)
        keys = pipe.row_keys(work)
        split = Cached(work, self.cache.get_many(keys), keys)
        outs = pipe.forwards(split.rows, split.costs) if split.missing else []
        self.cache.set_many(split.entries(keys, outs))
        return work.finish(split.merge(outs))

    async def _cached(self, model: LoadedModel, pipe: RowPipeline, queue: ModelQueue, plan: Callable[..., Work[R]],
                      args: Any, kwargs: Any, token: Token) -> R:
        """Rows already in the cache are not run again: the missing ones go through the scheduler like any other
        rows (batched with other requests'), and the answer is built from all of them in the request's order."""
        assert self.cache is not None
        cache = self.cache
        loop = asyncio.get_running_loop()
        stats = REQUEST_RECORD.get()

        def keyed() -> tuple[Work[R], list[bytes]]:
            work = plan(*args, **kwargs)
            return work, pipe.row_keys(work)

        work, keys = await loop.run_in_executor(self.prep, running, token, keyed)
        split = Cached(work, await cache.aget_many(keys), keys)
        if stats is not None:
            stats.cache = split.status
        self.observer.cache_lookup(model.name, len(work.rows) - split.misses, split.misses)
        if not split.missing:
            result: R = await loop.run_in_executor(self.prep, running, token, _finish, work, split.outputs, stats)
        else:
            def finish(outs: list[Any]) -> tuple[list[Any], R]:
                return outs, _finish(work, split.merge(outs), stats)

            t0 = time.perf_counter()
            outs, result = await queue.submit(split.rows, split.costs, functools.partial(running, token, finish))
            if (time.perf_counter() - t0) * 1000 >= self.min_inference_ms:  # only what was worth computing
                await cache.aset_many(split.entries(keys, outs))
        self._observed(model, work.timing, stats)
        return result

    def _observed(self, model: LoadedModel, timing: Timing, stats: RequestRecord | None) -> None:
        """A request's usage to the metrics (only a request that tokenized has any), its rows to its record."""
        if timing.tokens or timing.tokenize_s:
            config = model.config      # its name and version: not the properties, a call each
            self.observer.observe_request(config.name, config.version or "", timing)
        if stats is not None:
            stats.rows = (stats.rows or 0) + timing.rows

    def queue_stats(self, models: dict[str, LoadedModel]) -> list[tuple[str, str, int, int, int]]:
        """(model, version, requests waiting, rows queued, forwards running)."""
        return [(models[key].name, models[key].version or "", q.waiting, q.queued_rows, q.running)
                for key, q in self.queues.items()]


def _here(queue: ModelQueue, plan: Callable[..., Work[R]], stats: RequestRecord | None, args: Any, kwargs: Any
          ) -> tuple[Work[R], R]:
    """A request's plan, its rows at once on a free lane (`run_now`) and its answer."""
    if stats is None:       # no record to stamp (a gRPC call): the plan and the answer, no wrapper
        work = plan(*args, **kwargs)
        return work, work.finish(queue.run_now(work.rows, work.costs))
    work = _planned(plan, stats, args, kwargs)
    return work, _finish(work, queue.run_now(work.rows, work.costs), stats)


def _finish(work: Work[R], outputs: list[Any], stats: RequestRecord | None = None) -> R:
    """The answer from the rows' outputs, its post-processing time in the request's record."""
    t0 = time.perf_counter()
    try:
        return work.finish(outputs)
    finally:
        if stats is not None:
            stats.postprocess_ms = (stats.postprocess_ms or 0.0) + (time.perf_counter() - t0) * 1000


def _planned(plan: Callable[..., Work[R]], stats: RequestRecord | None, args: Any, kwargs: Any) -> Work[R]:
    """plan(*args, **kwargs), its perf_counter start and end in the request's timing record (for traces and the
    tokenization header) when there is one."""
    t0 = time.perf_counter()
    try:
        return plan(*args, **kwargs)
    finally:
        if stats is not None:
            stats.t_tokenize = (t0, time.perf_counter())


def _stamped(plan: Callable[PlanArgs, Work[R]], stats: RequestRecord | None) -> Callable[PlanArgs, Work[R]]:
    """`plan` as a function of its own arguments (for another thread) that stamps its time as `_planned` does."""
    if stats is None:
        return plan

    def timed(*args: PlanArgs.args, **kwargs: PlanArgs.kwargs) -> Work[R]:
        return _planned(plan, stats, args, kwargs)

    return timed
