"""The engine as one object: every served model's pipeline, its queue over its replicas, the forward and tokenizing
threads, the row cache and the inference core (pipelines/infer.py). `rsinfer serve`, the front-end and engine
processes of the worker split, and the one-shot CLI commands each build one and hand it to their front doors (the
aiohttp app, the gRPC server, a command); nothing here knows HTTP, gRPC or Typer.

Its life: built (pipelines, queues, threads: nothing runs yet) → `start()` (the cache opened, its keys' graph digests
hashed, the core built) → serving → `drain()` (the front doors' requests in flight finish) → `close()` (queues
stopped, threads joined, the cache closed)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from .config import Config, ServerConfig
from .engine.cache import Cache, CacheStats
from .engine.model import LoadedModel
from .engine.registry import Registry
from .engine.scheduler import ModelQueue, Observer, RowForward, Scheduler
from .engine.threads import CpuBudget
from .pipelines import build_pipeline
from .pipelines.base import RowPipeline, Timing
from .pipelines.infer import Inference

# the engine process's forward: the pipeline's, wrapped (it tags rows with the front end they came from)
ForwardWrap = Callable[[RowPipeline, LoadedModel], RowForward]


class RuntimeMetrics(CacheStats, Protocol):
    """What the runtime reports to (server/metrics.Metrics): each request, each cache lookup, each model's forwards."""

    def observe_request(self, model: str, version: str, timing: Timing) -> None: ...

    def cache_lookup(self, model: str, hits: int, misses: int) -> None: ...

    def observer(self, model: str, version: str = "") -> Observer: ...

    def with_cache(self, read_bytes: Callable[[], float] | None) -> None: ...


class Unobserved:
    """The one-shot CLI's metrics: none."""

    def observe_request(self, model: str, version: str, timing: Timing) -> None:
        pass

    def cache_lookup(self, model: str, hits: int, misses: int) -> None:
        pass

    def error(self, backend: str) -> None:
        pass


class Runtime:
    """`queues`: the models' queues when their forwards run elsewhere (a front-end process: `RemoteQueue`s to its
    engine); by default each model gets a `Scheduler` over its replicas here. `forward`: wraps each pipeline's
    forward (the engine process). `inline_prep`: a front-end process tokenizes small requests on its event loop."""

    def __init__(self, config: Config, registry: Registry, metrics: RuntimeMetrics | None = None, *,
                 queues: dict[str, ModelQueue] | None = None, forward: ForwardWrap | None = None,
                 inline_prep: bool = False) -> None:
        self.config = config
        self.registry = registry
        self.metrics = metrics
        self.inline_prep = inline_prep
        plan = registry.plan
        self.pipelines: dict[str, RowPipeline] = {key: build_pipeline(m)
                                                  for key, m in registry.models.items()}
        # forwards: one thread per replica; tokenizing and the answers of batched requests
        self.infer_executor = ThreadPoolExecutor(max_workers=plan.infer_threads if queues is None else 1,
                                                 thread_name_prefix="infer")
        self.prep_executor = ThreadPoolExecutor(max_workers=plan.prep_threads, thread_name_prefix="prep")
        budget = CpuBudget(plan.cpus.count)    # the planned CPU models' forwards share the CPUs (engine/threads.py)
        self.queues: dict[str, ModelQueue] = queues if queues is not None else {
            key: Scheduler.for_model(key, m, self.pipelines[key], self.infer_executor,
                                     queue_rows=m.config.batching.queue_rows, max_queue=config.max_queue_of(m.config),
                                     queue_timeout_ms=config.server.queue_timeout_ms,
                                     observer=metrics.observer(m.name, m.version or "") if metrics else None,
                                     forward=forward(self.pipelines[key], m) if forward else None, budget=budget)
            for key, m in registry.models.items()
        }
        self.cache: Cache | None = None
        self.draining: list[asyncio.Future[Any]] = []   # the front doors' drains, awaited by drain()
        self._core: Inference | None = None

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
                from .engine.cache import MemoryCache, open_cache

                self.cache = open_cache(settings, self.metrics)
                if self.metrics is not None:
                    c = self.cache
                    self.metrics.with_cache((lambda: float(c.bytes)) if isinstance(c, MemoryCache) else None)
            for key in cached:
                self.pipelines[key].identity()
        self._core = Inference(self.pipelines, self.queues, self.prep_executor, self.metrics or Unobserved(),
                               self.cache, settings.min_inference_ms if settings is not None else 0.0,
                               self.inline_prep)
        return self

    def queue_stats(self) -> list[tuple[str, str, int, int, int]]:
        """(model, version, requests waiting, rows queued, forwards running)."""
        return self.core.queue_stats(self.registry.models)

    async def drain(self) -> None:
        """Every front door's requests in flight answered (each front adds its drain to `draining`)."""
        for drain in self.draining:
            await drain

    async def close(self) -> None:
        """The queues stopped (what still waits fails), the threads joined, the cache closed."""
        for q in self.queues.values():
            q.stop()
        self.infer_executor.shutdown(wait=True)
        self.prep_executor.shutdown(wait=True)
        if self.cache is not None:
            await self.cache.close()
