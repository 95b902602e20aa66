"""What every handler reaches through the app: registry, pipelines, schedulers, the tokenizing pool, metrics."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web

from ..config import Config
from ..engine.cache import Cache
from ..engine.model import LoadedModel
from ..engine.registry import Registry
from ..engine.scheduler import REQUEST_STATS, ModelQueue, Runner, as_is
from ..pipelines.base import Cached, RowPipeline, Work
from .metrics import Metrics

R = TypeVar("R")
# how the request's rows came out of the row cache (hit | partial | miss); the observe middleware turns it into
# the `x-rsinfer-cache` header
CACHE_STATUS: contextvars.ContextVar[str | None] = contextvars.ContextVar("rsinfer_cache_status", default=None)
# the request body's size (the observe middleware sets it; gRPC leaves it unknown): a front-end process tokenizes
# and post-processes a request this small on its event loop, where a thread hop would cost more than the work
BODY_BYTES: contextvars.ContextVar[int | None] = contextvars.ContextVar("rsinfer_body_bytes", default=None)
INLINE_BYTES = 4096



@dataclass
class ServerState:
    config: Config
    registry: Registry
    pipelines: dict[str, RowPipeline]
    schedulers: dict[str, ModelQueue]
    prep_executor: ThreadPoolExecutor       # tokenizing for batched requests
    infer_executor: ThreadPoolExecutor      # forwards: one thread per replica
    metrics: Metrics
    started: float = field(default_factory=time.time)
    draining: list[asyncio.Future[Any]] = field(default_factory=list)   # other fronts' drains, awaited at stop
    cache: Cache | None = None
    # a front-end process (server.workers > 1): the forwards run elsewhere, so a small request is tokenized and
    # answered on the event loop (BODY_BYTES), a large one on the prep pool, never holding the loop for long
    inline_prep: bool = False
    unready: Callable[[], str | None] | None = None      # why this server is not ready (front ends: the engine,
                                                         # another front end), None when it is
    before_metrics: Callable[[], Awaitable[None]] | None = None   # a front end fetches the engine's queue numbers
    stopping: bool = False     # a drain started: not ready any more (the listener closes next)
    limiter: Any = None        # server.rate_limit's counters (server/ratelimit.py), None without a limit
    tracing: Any = None        # server.tracing's exporter (server/tracing.py), None when off

    def not_ready(self) -> str | None:
        """Why this server should not get new requests now (a drain, its engine, another front end); None: ready."""
        if self.stopping:
            return "draining: the server is shutting down"
        return self.unready() if self.unready is not None else None

    async def infer(self, model: LoadedModel, plan: Callable[..., Work[R]], *args: Any, **kwargs: Any) -> R:
        """plan(*args, **kwargs) → Work, its rows run, its answer built. When a replica is free (or batching is off):
        all of it in one thread hop on that replica - there is nothing to batch with. Else tokenized on the prep
        pool, then the rows join the model's batching queue, and the worker that runs the request's last forward
        builds the answer (two hops)."""
        pipe = self.pipelines[model.key]
        scheduler = self.schedulers[model.key]
        stats = REQUEST_STATS.get()
        if stats is not None:
            stats["model"] = model.key
            plan = _stamped(plan, stats)
        if self.cache is not None and model.config.cache:
            return await self._infer_cached(model, pipe, scheduler, plan, args, kwargs)
        if self.inline_prep:
            body = BODY_BYTES.get()
            loop = asyncio.get_running_loop()
            if body is not None and body <= INLINE_BYTES:
                work = plan(*args, **kwargs)
                result: R = work.finish(await scheduler.submit(work.rows, work.costs, as_is))
            else:
                work = await loop.run_in_executor(self.prep_executor, functools.partial(plan, *args, **kwargs))
                outputs = await scheduler.submit(work.rows, work.costs, as_is)
                result = await loop.run_in_executor(self.prep_executor, work.finish, outputs)
            timing = work.timing
        elif scheduler.batching and not scheduler.free:
            loop = asyncio.get_running_loop()
            work = await loop.run_in_executor(self.prep_executor, functools.partial(plan, *args, **kwargs))
            result = await scheduler.submit(work.rows, work.costs, work.finish)
            timing = work.timing
        else:
            planned: list[Work[R]] = []

            def whole(runner: Runner) -> R:
                planned.append(plan(*args, **kwargs))
                return pipe.run(planned[0], runner)

            result = await scheduler.run(whole)
            timing = planned[0].timing
        self.metrics.observe_request(model.name, model.version or "", timing)
        if stats is not None:
            stats["rows"] = stats.get("rows", 0) + timing.rows
        return result

    async def _infer_cached(self, model: LoadedModel, pipe: RowPipeline, scheduler: ModelQueue,
                            plan: Callable[..., Work[R]], args: Any, kwargs: Any) -> R:
        """Rows already in the cache are not run again: the missing ones go through the scheduler like any other
        rows (batched with other requests'), and the answer is built from all of them in the request's order."""
        assert self.cache is not None
        cache = self.cache
        loop = asyncio.get_running_loop()

        def keyed() -> tuple[Work[R], list[bytes]]:
            work = plan(*args, **kwargs)
            return work, pipe.row_keys(work)

        work, keys = await loop.run_in_executor(self.prep_executor, keyed)
        split = Cached(work, await cache.aget_many(keys), keys)
        CACHE_STATUS.set(split.status)
        self.metrics.cache_lookup(model.name, len(work.rows) - split.misses, split.misses)
        if not split.missing:
            result = await loop.run_in_executor(self.prep_executor, work.finish, split.outputs)
        else:
            def finish(outs: list[Any]) -> tuple[list[Any], R]:
                return outs, work.finish(split.merge(outs))

            min_ms = self.config.server.cache.min_inference_ms if self.config.server.cache else 0.0
            t0 = time.perf_counter()
            outs, result = await scheduler.submit(split.rows, split.costs, finish)
            if (time.perf_counter() - t0) * 1000 >= min_ms:  # inferstack's rule: only what was worth computing
                await cache.aset_many(split.entries(keys, outs))
        self.metrics.observe_request(model.name, model.version or "", work.timing)
        stats = REQUEST_STATS.get()
        if stats is not None:
            stats["rows"] = stats.get("rows", 0) + work.timing.rows
        return result

    def queue_stats(self) -> list[tuple[str, str, int, int, int]]:
        """(model, version, requests waiting, rows queued, forwards running)."""
        return [(m.name, m.version or "", s.waiting, s.queued_rows, s.running)
                for m, s in ((self.registry.models[key], s) for key, s in self.schedulers.items())]


def _stamped(plan: Callable[..., Work[R]], stats: dict[str, Any]) -> Callable[..., Work[R]]:
    """`plan` (tokenizing, on whichever thread) recording its perf_counter start and end for traces."""
    def timed(*args: Any, **kwargs: Any) -> Work[R]:
        t0 = time.perf_counter()
        try:
            return plan(*args, **kwargs)
        finally:
            stats["t_tokenize"] = (t0, time.perf_counter())

    return timed


STATE = web.AppKey("state", ServerState)
