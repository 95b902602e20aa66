"""What every front (HTTP routes, KServe gRPC) reaches: registry, pipelines, schedulers, the tokenizing pool, metrics,
and the inference core they all call. No aiohttp here: the HTTP app finds it under `routes.common.STATE`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..config import Config
from ..engine.cache import Cache
from ..engine.model import LoadedModel
from ..engine.registry import Registry
from ..engine.scheduler import ModelQueue
from ..pipelines.base import RowPipeline, Work
from ..pipelines.infer import Inference, PlanArgs
from .metrics import Metrics

R = TypeVar("R")


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
    # answered on the event loop (its body's size: the request record's body_bytes), a large one on the prep pool, never
    # holding the loop for long
    inline_prep: bool = False
    unready: Callable[[], str | None] | None = None      # why this server is not ready (front ends: the engine,
                                                         # another front end), None when it is
    before_metrics: Callable[[], Awaitable[None]] | None = None   # a front end fetches the engine's queue numbers
    stopping: bool = False     # a drain started: not ready any more (the listener closes next)
    limiter: Any = None        # server.rate_limit's counters (server/ratelimit.py), None without a limit
    tracing: Any = None        # server.tracing's exporter (server/tracing.py), None when off
    core: Inference = field(init=False)

    def __post_init__(self) -> None:
        self.connect()

    def connect(self) -> None:
        """(Re)build the inference core over this state's pipelines, queues and cache."""
        cache = self.config.server.cache
        self.core = Inference(self.pipelines, self.schedulers, self.prep_executor, self.metrics, self.cache,
                              cache.min_inference_ms if cache is not None else 0.0, self.inline_prep)

    def not_ready(self) -> str | None:
        """Why this server should not get new requests now (a drain, its engine, another front end); None: ready."""
        if self.stopping:
            return "draining: the server is shutting down"
        return self.unready() if self.unready is not None else None

    async def infer(self, model: LoadedModel, plan: Callable[PlanArgs, Work[R]], *args: PlanArgs.args,
                    **kwargs: PlanArgs.kwargs) -> R:
        """The request through the inference core (pipelines/infer.py), which every front shares."""
        return await self.core.infer(model, plan, *args, **kwargs)

    def queue_stats(self) -> list[tuple[str, str, int, int, int]]:
        """(model, version, requests waiting, rows queued, forwards running)."""
        return self.core.queue_stats(self.registry.models)

