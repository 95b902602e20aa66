"""What every handler reaches through the app: registry, pipelines, schedulers, the tokenizing pool, metrics."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web

from ..config import Config
from ..engine.model import LoadedModel
from ..engine.registry import Registry
from ..engine.scheduler import Runner, Scheduler
from ..pipelines.base import RowPipeline, Work
from .metrics import Metrics

R = TypeVar("R")


@dataclass
class ServerState:
    config: Config
    registry: Registry
    pipelines: dict[str, RowPipeline]
    schedulers: dict[str, Scheduler]
    prep_executor: ThreadPoolExecutor       # tokenizing for batched requests
    infer_executor: ThreadPoolExecutor      # forwards: one thread per replica
    metrics: Metrics
    started: float = field(default_factory=time.time)
    draining: list[asyncio.Future[Any]] = field(default_factory=list)   # other fronts' drains, awaited at stop

    async def infer(self, model: LoadedModel, plan: Callable[..., Work[R]], *args: Any, **kwargs: Any) -> R:
        """plan(*args, **kwargs) → Work, its rows run, its answer built. When a replica is free (or batching is off):
        all of it in one thread hop on that replica - there is nothing to batch with. Else tokenized on the prep
        pool, then the rows join the model's batching queue, and the worker that runs the request's last forward
        builds the answer (two hops)."""
        pipe = self.pipelines[model.key]
        scheduler = self.schedulers[model.key]
        if scheduler.batching and not scheduler.free:
            loop = asyncio.get_running_loop()
            work = await loop.run_in_executor(self.prep_executor, functools.partial(plan, *args, **kwargs))
            result: R = await scheduler.submit(work.rows, work.costs, work.finish)
            timing = work.timing
        else:
            planned: list[Work[R]] = []

            def whole(runner: Runner) -> R:
                planned.append(plan(*args, **kwargs))
                return pipe.run(planned[0], runner)

            result = await scheduler.run(whole)
            timing = planned[0].timing
        self.metrics.observe_request(model.name, model.version or "", timing)
        return result

    def queue_stats(self) -> list[tuple[str, str, int, int, int]]:
        """(model, version, requests waiting, rows queued, forwards running)."""
        return [(m.name, m.version or "", s.waiting, s.queued_rows, s.running)
                for m, s in ((self.registry.models[key], s) for key, s in self.schedulers.items())]


STATE = web.AppKey("state", ServerState)
