"""What every handler reaches through the app: registry, pipelines, admission gates, executor, metrics."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from ..config import Config
from ..engine.registry import Registry
from .admission import Gate
from .metrics import Metrics


@dataclass
class ServerState:
    config: Config
    registry: Registry
    pipelines: dict[str, Any]
    gates: dict[str, Gate]
    executor: ThreadPoolExecutor
    metrics: Metrics
    started: float = field(default_factory=time.time)

    async def run(self, model: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a pipeline call off the event loop under the model's admission gate; record its timing."""
        result, waited = await self.gates[model.name].run(self.executor, functools.partial(fn, *args, **kwargs))
        timing = getattr(result[-1] if isinstance(result, tuple) else result, "timing", None)
        if timing is not None:
            self.metrics.observe_run(model.name, timing, waited)
        return result

    def queue_stats(self) -> list[tuple[str, int, int]]:
        return [(name, g.waiting, g.running) for name, g in self.gates.items()]


STATE = web.AppKey("state", ServerState)
