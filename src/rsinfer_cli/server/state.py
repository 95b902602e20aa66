"""What every handler reaches through the app: registry, pipelines, batchers, gates, executors, metrics."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from ..config import Config
from ..engine.batcher import Batcher
from ..engine.registry import Registry
from .admission import Gate
from .metrics import Metrics

INLINE_FINISH_ROWS = 16


@dataclass
class ServerState:
    config: Config
    registry: Registry
    pipelines: dict[str, Any]
    gates: dict[str, Gate]
    batchers: dict[str, Batcher]
    infer_executor: ThreadPoolExecutor      # forwards: at most one per replica at a time
    prep_executor: ThreadPoolExecutor       # tokenization and post-processing
    metrics: Metrics
    started: float = field(default_factory=time.time)

    async def infer(self, model: Any, plan: Callable[..., Any], *args: Any, inline: bool = False,
                    **kwargs: Any) -> Any:
        """Tokenize off the loop (on it when `inline`: a tiny request, cheaper than the hand-off to a thread),
        run the rows (batched across requests when the model batches and the request fits its queue, else alone
        in max_batch slices under the admission gate), then build the answer."""
        loop = asyncio.get_running_loop()
        if inline:
            work = plan(*args, **kwargs)
        else:
            work = await loop.run_in_executor(self.prep_executor, functools.partial(plan, *args, **kwargs))
        batcher = self.batchers.get(model.name)
        if batcher is not None and work.rows <= batcher.capacity:
            outputs, waited = await batcher.submit(work.enc)
            if work.rows <= INLINE_FINISH_ROWS and not self.pipelines[model.name].ragged:
                result = work.finish(outputs)  # a few vectors: cheaper here than a thread hop
            else:
                result = await loop.run_in_executor(self.prep_executor, work.finish, outputs)
        else:
            pipe = self.pipelines[model.name]
            result, waited = await self.gates[model.name].run(self.infer_executor, pipe.run, work)
        self.metrics.observe_run(model.name, work.timing, waited)
        return result

    def queue_stats(self) -> list[tuple[str, int, int, int]]:
        """(model, requests waiting for a slot, rows queued for batching, forwards running)."""
        out = []
        for name, g in self.gates.items():
            b = self.batchers.get(name)
            out.append((name, g.waiting, b.queued if b else 0, g.running + (b.running if b else 0)))
        return out


STATE = web.AppKey("state", ServerState)
