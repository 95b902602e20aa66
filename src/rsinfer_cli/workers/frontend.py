"""The front-end side of multi-process serving: a front end does everything of a request but the forward (HTTP
and gRPC, validation, tokenizing, cache look-ups, post-processing, JSON) and sends its rows to the engine process
that owns the model (`engine.py`) over a Unix socket (`ipc.py`).

`EngineClient` is one front end's connection to one engine; `RemoteQueue` stands where a `Scheduler` stands in a
single process (`ModelQueue`), so every route, the cache and the metrics work unchanged. A front end learns of a
dead engine from the kernel (its end of the socket closes): what waits on it fails at once with
`EngineUnavailable` (503) and `/health` says so.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import pickle
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from aiohttp import web

from ..config import Config
from ..engine.model import LoadedModel
from ..engine.registry import Registry
from ..engine.scheduler import ModelQueue, Runner
from ..errors import EngineUnavailable
from ..server.metrics import Metrics
from . import ipc

log = logging.getLogger("rsinfer.server")
T = TypeVar("T")


class EngineClient:
    def __init__(self, path: str) -> None:
        self.path = path
        self.gone: str | None = None              # why the engine cannot answer any more
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[ipc.ToFrontEnd]] = {}
        self._channel: ipc.Channel | None = None

    async def connect(self, timeout_s: float = 60.0) -> list[LoadedModel]:
        """Connect and fetch the engine's catalog (the models it loaded, without their sessions)."""
        loop = asyncio.get_running_loop()
        def channel_() -> ipc.Channel:
            return ipc.Channel(self._reply, self._lost, ipc.ToFrontEnd)

        _, channel = await asyncio.wait_for(loop.create_unix_connection(channel_, self.path), timeout_s)
        self._channel = channel
        reply = await asyncio.wait_for(self._ask(ipc.Hello()), timeout_s)
        assert isinstance(reply, ipc.Catalog), reply
        models: list[LoadedModel] = pickle.loads(reply.catalog)  # noqa: S301 - our own engine, at start-up only
        return models

    def _reply(self, _channel: ipc.Channel, msg: ipc.ToFrontEnd) -> None:
        fut = self._pending.get(msg.id)
        if fut is not None and not fut.done():
            fut.set_result(msg)

    def _lost(self, _channel: ipc.Channel) -> None:
        """The engine's end closed: it stopped or died. What waits on it fails now, with 503."""
        if self.gone is None:
            # our own close() clears the channel first; otherwise the engine went away
            self.gone = "the engine process exited" if self._channel is not None else "the front end is stopping"
            if self._channel is not None:
                log.error("%s: failing %d request(s) waiting on it", self.gone, len(self._pending))
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(EngineUnavailable(f"{self.gone}; retry on another replica"))

    async def _ask(self, msg: ipc.ToEngine) -> ipc.ToFrontEnd:
        if self.gone is not None:
            raise EngineUnavailable(f"{self.gone}; retry on another replica")
        channel = self._channel
        if channel is None:
            raise EngineUnavailable("the front end is stopping; retry on another replica")
        rid = msg.id = next(self._ids)
        fut: asyncio.Future[ipc.ToFrontEnd] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            channel.send(msg)
            reply = await fut
        except asyncio.CancelledError:
            if isinstance(msg, ipc.Rows) and self.gone is None:  # nobody waits: the engine drops its rows
                channel.send(ipc.Cancel(id=rid))
            raise
        finally:
            self._pending.pop(rid, None)
        if isinstance(reply, ipc.Failed):
            raise ipc.error_from_wire(reply.error)
        return reply

    async def rows(self, key: str, rows: Sequence[Any], costs: Sequence[int]) -> list[Any]:
        reply = await self._ask(ipc.Rows(key=key, rows=list(rows), costs=list(costs)))
        assert isinstance(reply, ipc.Outputs), reply
        return reply.outputs

    async def stats(self) -> list[list[Any]]:
        reply = await self._ask(ipc.Stats())
        assert isinstance(reply, ipc.QueueStats), reply
        return reply.stats

    def close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()


class RemoteQueue:
    """A model's scheduler as a front end sees it: rows go to the engine's scheduler, batched there with the rows of
    every front end; the answer is built here."""

    batching = True     # the engine's scheduler decides (a request runs direct there when batching is off)
    free = False        # never a one-hop path here: the forward is always in the engine

    def __init__(self, client: EngineClient, key: str) -> None:
        self.client = client
        self.key = key
        self.waiting = 0       # the engine's numbers at the last `refresh`
        self.queued_rows = 0
        self.running = 0

    async def submit(self, rows: Sequence[Any], costs: Sequence[int], finish: Callable[[list[Any]], T]) -> T:
        if not rows:
            return finish([])
        return finish(await self.client.rows(self.key, rows, costs))

    async def run(self, fn: Callable[[Runner], T]) -> T:
        raise RuntimeError("a front end never holds a replica")  # `free` is False: the server submits rows

    def now(self) -> bool:
        return False        # the forward is always in the engine

    def run_now(self, rows: Sequence[Any], costs: Sequence[int]) -> list[Any]:
        raise RuntimeError("a front end never holds a replica")  # `now()` is False

    def stop(self) -> None:
        pass


async def refresh(queues: dict[str, ModelQueue], clients: Sequence[EngineClient]) -> None:
    """The engines' queue numbers into their front-end queues (before `/metrics` renders)."""
    for client in clients:
        if client.gone is not None:
            continue
        for key, waiting, rows, running in await client.stats():
            q = queues.get(key)
            if isinstance(q, RemoteQueue):
                q.waiting, q.queued_rows, q.running = waiting, rows, running


async def connect(engines: Sequence[str],
                  timeout_s: float = 60.0) -> tuple[list[EngineClient], dict[str, tuple[LoadedModel, EngineClient]]]:
    """A client per engine socket and every model they loaded, by key, with the engine that runs it."""
    clients = [EngineClient(path) for path in engines]
    models: dict[str, tuple[LoadedModel, EngineClient]] = {}
    for client in clients:
        for m in await client.connect(timeout_s):
            models[m.key] = (m, client)
    return clients, models


def frontend_app(config: Config, clients: Sequence[EngineClient], models: dict[str, tuple[LoadedModel, EngineClient]],
                 metrics: Metrics | None = None, unready: Callable[[], str | None] | None = None) -> web.Application:
    """The daemon's app over models whose forwards run in engine processes; `unready` adds the supervisor's view
    (every front end up) to the engines' own."""
    from ..runtime import Runtime
    from ..server.app import create_app
    from ..server.routes.common import STATE

    registry = Registry({k: m for k, (m, _) in models.items()}, {m.name: m for m in config.models})
    queues: dict[str, ModelQueue] = {key: RemoteQueue(client, key) for key, (_, client) in models.items()}
    app = create_app(Runtime(config, registry, metrics or Metrics(), queues=queues, inline_prep=True))
    state = app[STATE]

    def why() -> str | None:
        gone = next((c.gone for c in clients if c.gone is not None), None)
        return gone if gone is not None else unready() if unready is not None else None

    async def before_metrics() -> None:
        await refresh(queues, clients)

    state.unready = why
    state.before_metrics = before_metrics

    async def close(app: web.Application) -> None:
        for client in clients:
            client.close()

    app.on_cleanup.append(close)
    return app
