"""What every front door (HTTP routes, KServe gRPC) reaches: the runtime (registry, pipelines, queues, cache and the
inference core they all call), the metrics, and the server's own state (readiness, limits, tracing). No aiohttp
here: the HTTP app finds it under `routes.common.STATE`."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ..config import Config
from ..engine.cache import Cache
from ..engine.registry import Registry
from ..pipelines.base import RowPipeline
from ..runtime import Runtime
from ..runtime.control import Control
from ..runtime.core import Inference
from .metrics import Metrics


@dataclass
class ServerState:
    runtime: Runtime            # started: its core exists
    metrics: Metrics
    started: float = field(default_factory=time.time)
    unready: Callable[[], str | None] | None = None      # why this server is not ready (front ends: the engine,
                                                         # another front end), None when it is
    before_metrics: Callable[[], Awaitable[None]] | None = None   # a front end fetches the engine's queue numbers
    stopping: bool = False     # a drain started: not ready any more (the listener closes next)
    limiter: Any = None        # server.rate_limit's counters (server/ratelimit.py), None without a limit
    tracing: Any = None        # server.tracing's exporter (server/tracing.py), None when off
    control: Control | None = None   # who changes the served set (SIGHUP, the repository API): the runtime's
                                     # ModelControl, or a front-end process's RemoteControl; set by create_app
    # the runtime's parts every request reads, as plain attributes (no property call on the hot path)
    config: Config = field(init=False)
    registry: Registry = field(init=False)
    pipelines: dict[str, RowPipeline] = field(init=False)
    core: Inference = field(init=False)

    def __post_init__(self) -> None:
        self.refresh()

    def refresh(self) -> None:
        """The runtime's parts read again (after a reload or a repository load changed the served set)."""
        self.config = self.runtime.config
        self.registry = self.runtime.registry
        self.pipelines = self.runtime.pipelines
        self.core = self.runtime.core

    @property
    def cache(self) -> Cache | None:
        return self.runtime.cache

    @property
    def models(self) -> Control:
        """The control of the served set (always set once create_app returned)."""
        if self.control is None:
            raise RuntimeError("the server state has no model control")
        return self.control

    def not_ready(self) -> str | None:
        """Why this server should not get new requests now (a drain, its engine, another front end); None: ready."""
        if self.stopping:
            return "draining: the server is shutting down"
        return self.unready() if self.unready is not None else None

    def queue_stats(self) -> list[tuple[str, str, int, int, int]]:
        """(model, version, requests waiting, rows queued, forwards running)."""
        return self.runtime.queue_stats()
