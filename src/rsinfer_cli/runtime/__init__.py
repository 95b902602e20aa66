"""The engine as one object: every served model's pipeline, its queue over its replicas, the forward and tokenizing
threads, the row cache and the inference core (runtime/core.py). `rsinfer serve`, the front-end and engine
processes of the worker split, and the one-shot CLI commands each build one and hand it to their front doors (the
aiohttp app, the gRPC server, a command); nothing here knows HTTP, gRPC or Typer.

Its life: built (pipelines, queues, threads: nothing runs yet) → `start()` (the cache opened, its keys' graph digests
hashed, the core built) → serving → `drain()` (the front doors' requests in flight finish) → `close()` (queues
stopped, threads joined, the cache closed)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from ..config import Config, ModelConfig, ServerConfig
from ..engine.cache import Cache, CacheStats
from ..engine.model import LoadedModel
from ..engine.registry import Registry
from ..engine.scheduler import ModelQueue, Observer, RowForward, Scheduler
from ..engine.threads import CpuBudget
from ..pipelines import build_pipeline
from ..pipelines.base import RowPipeline, Timing
from .core import Inference
from .record import RequestRecord

# the engine process's forward: the pipeline's, wrapped (it tags rows with the front end they came from)
ForwardWrap = Callable[[RowPipeline, LoadedModel], RowForward]


class RuntimeMetrics(CacheStats, Protocol):
    """What the runtime reports to (server/metrics.Metrics): each request, each cache lookup, each model's forwards."""

    def observe_request(self, model: str, version: str, timing: Timing) -> None: ...

    def cache_lookup(self, model: str, hits: int, misses: int) -> None: ...

    def outcome(self, model: str, version: str, ok: bool, seconds: float, record: RequestRecord | None) -> None: ...

    def cpu(self, model: str, seconds: float) -> None: ...

    def observer(self, model: str, version: str = "") -> Observer: ...

    def with_cache(self, read_bytes: Callable[[], float] | None) -> None: ...


class Unobserved:
    """The one-shot CLI's metrics: none."""

    def observe_request(self, model: str, version: str, timing: Timing) -> None:
        pass

    def cache_lookup(self, model: str, hits: int, misses: int) -> None:
        pass

    def outcome(self, model: str, version: str, ok: bool, seconds: float, record: RequestRecord | None) -> None:
        pass

    def cpu(self, model: str, seconds: float) -> None:
        pass

    def error(self, backend: str) -> None:
        pass


class Runtime:
    """`queues`: the models' queues when their forwards run elsewhere (a front-end process: `RemoteQueue`s to its
    engine; `queue_for` makes the queue of a model loaded later); by default each model gets a `Scheduler` over its
    replicas here. `forward`: wraps each pipeline's forward (the engine process)."""

    def __init__(self, config: Config, registry: Registry, metrics: RuntimeMetrics | None = None, *,
                 queues: dict[str, ModelQueue] | None = None, forward: ForwardWrap | None = None,
                 queue_for: Callable[[LoadedModel], ModelQueue] | None = None) -> None:
        self.config = config
        self.registry = registry
        self.metrics = metrics
        plan = registry.plan
        self.pipelines: dict[str, RowPipeline] = {key: build_pipeline(m)
                                                  for key, m in registry.models.items()}
        # forwards: one thread per replica; tokenizing and the answers of batched requests
        self.infer_executor = ThreadPoolExecutor(max_workers=plan.infer_threads if queues is None else 1,
                                                 thread_name_prefix="infer")
        self.prep_executor = ThreadPoolExecutor(max_workers=plan.prep_threads, thread_name_prefix="prep")
        self.budget = CpuBudget(plan.cpus.count)  # the planned CPU models' forwards share the CPUs (threads.py)
        self.forward = forward
        self.queue_for = queue_for
        self.queues: dict[str, ModelQueue] = queues if queues is not None else {
            key: self._queue(m, self.pipelines[key]) for key, m in registry.models.items()}
        self.cache: Cache | None = None
        self.draining: list[asyncio.Future[Any]] = []   # the front doors' drains, awaited by drain()
        self._retiring: set[asyncio.Task[None]] = set()  # replaced versions draining (retire_later)
        self._core: Inference | None = None

    def _queue(self, m: LoadedModel, pipe: RowPipeline) -> ModelQueue:
        if self.queue_for is not None:
            return self.queue_for(m)
        metrics = self.metrics
        return Scheduler.for_model(m.key, m, pipe, self.infer_executor, queue_rows=m.config.batching.queue_rows,
                                   max_queue=self.config.max_queue_of(m.config),
                                   queue_timeout_ms=self.config.server.queue_timeout_ms,
                                   observer=metrics.observer(m.name, m.version or "") if metrics else None,
                                   forward=self.forward(pipe, m) if self.forward else None, budget=self.budget,
                                   prep=self.prep_executor)

    # ------------------------------------------------------------ changing the served set (runtime/control.py)

    def prepare(self, versions: list[LoadedModel]) -> dict[str, RowPipeline]:
        """The pipelines of newly loaded versions, built and checked (a load thread: a tokenizer is read here), the
        graph digest of a cached one hashed; nothing is served yet."""
        pipes = {m.key: build_pipeline(m) for m in versions}
        if self.config.server.cache is not None:
            for m in versions:
                if m.config.cache:
                    pipes[m.key].identity()
        return pipes

    def install(self, name: str, versions: list[LoadedModel] | None, pipes: dict[str, RowPipeline],
                config: ModelConfig | None = None) -> list[LoadedModel]:
        """`versions` (with their `prepare`d pipelines) serve as model `name` from the next request on; None: the
        name is served no more. On the event loop, in one step. Returns the versions replaced: they answer what
        they already hold (`retire` frees them)."""
        old = self.registry.entries.get(name, [])
        queues = {m.key: self._queue(m, pipes[m.key]) for m in versions or ()}
        core = self.core
        for m in old:
            core.retiring[id(m)] = (self.pipelines.pop(m.key), self.queues.pop(m.key))
        self.pipelines.update(pipes)
        self.queues.update(queues)
        self.registry.swap(name, versions, config)
        pool = self.infer_executor
        if self.queue_for is None and pool._max_workers < self.registry.plan.infer_threads:  # noqa: SLF001
            # a thread per lane: the pool grows with the plan (ThreadPoolExecutor starts threads as work arrives,
            # up to this number, read at each submit)
            pool._max_workers = self.registry.plan.infer_threads  # noqa: SLF001
        return old

    def retire_later(self, versions: list[LoadedModel], quiet_s: float = 0.0) -> None:
        """`retire` the versions `install` replaced, in the background (a change does not wait for the requests
        the old versions hold), at most the request deadline; `close` stops what is still draining."""
        if not versions:
            return
        timeout = self.config.server.request_timeout_ms / 1000 + 1
        task = asyncio.ensure_future(self.retire(list(versions), timeout, quiet_s))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def retire(self, versions: list[LoadedModel], timeout_s: float, quiet_s: float = 0.0) -> None:
        """Once the replaced `versions` hold nothing (no request in flight here, nothing queued or running in their
        queues, for `quiet_s` on end: an engine process also waits for rows its front ends already sent), at most
        `timeout_s` (the request deadline), their queues stop and the last references to their sessions go."""
        core = self.core
        held = [(m, core.retiring.get(id(m))) for m in versions]
        deadline = time.monotonic() + timeout_s
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            if any(m.in_flight or (q is not None and any(q[1].stats())) for m, q in held):
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= quiet_s:
                break
            await asyncio.sleep(0.02)
        for m, _ in held:
            gone = core.retiring.pop(id(m), None)
            if gone is not None:
                gone[1].stop()
        versions.clear()

    @classmethod
    def one_shot(cls, model: LoadedModel, server: ServerConfig) -> Runtime:
        """One model for a one-shot command: no queue; `run` answers on its first replica, through the cache of the
        config's `server.cache` when it has one."""
        return cls(Config(models=(model.config,), server=server), Registry({model.key: model}), queues={})

    @property
    def core(self) -> Inference:
        """The inference core every front door calls: `core.infer` (a request through its model's queue) and
        `core.run` (synchronously on the first replica: the one-shot CLI). No wrapper layer of its own here."""
        if self._core is None:
            raise RuntimeError("Runtime.start() was not called")
        return self._core

    def start(self, cache: bool = True) -> Runtime:
        """The row cache (`server.cache`; `cache=False`: not here - the engine process, whose front ends keep it)
        opened, the graph digests of its keys hashed now rather than by the first request, and the core built.
        Once: a second call changes nothing."""
        if self._core is not None:
            return self
        settings = self.config.server.cache
        cached = [key for key, m in self.registry.models.items() if m.config.cache]
        if settings is not None and cached:
            if cache:
                from ..engine.cache import MemoryCache, open_cache

                self.cache = open_cache(settings, self.metrics)
                if self.metrics is not None:
                    c = self.cache
                    self.metrics.with_cache((lambda: float(c.bytes)) if isinstance(c, MemoryCache) else None)
            for key in cached:
                self.pipelines[key].identity()
        self._core = Inference(self.pipelines, self.queues, self.prep_executor, self.metrics or Unobserved(),
                               self.cache, settings.min_inference_ms if settings is not None else 0.0,
                               self.config.server.request_timeout_ms / 1000, self.budget)
        return self

    def queue_stats(self) -> list[tuple[str, str, int, int, int]]:
        """(model, version, requests waiting, rows queued, forwards running)."""
        return self.core.queue_stats(self.registry.models)

    async def drain(self) -> None:
        """Every front door's requests in flight answered (each front adds its drain to `draining`)."""
        for drain in self.draining:
            await drain

    async def close(self) -> None:
        """The queues stopped (what still waits fails), the work still running on threads told to stop, the threads
        joined, the cache closed."""
        if self._core is not None:
            self._core.cancel_all()
        for task in list(self._retiring):
            task.cancel()
        for q in self.queues.values():
            q.stop()
        if self._core is not None:
            for _, q in self._core.retiring.values():   # versions a reload replaced, still draining
                q.stop()
        self.infer_executor.shutdown(wait=True)
        self.prep_executor.shutdown(wait=True)
        if self.cache is not None:
            await self.cache.close()
