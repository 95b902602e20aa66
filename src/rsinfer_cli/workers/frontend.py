"""The front-end side of multi-process serving: a front end does everything of a request but the forward (HTTP
and gRPC, validation, tokenizing, cache look-ups, post-processing, JSON) and sends its rows to the engine process
that owns the model (`engine.py`) over a Unix socket (`ipc.py`).

`EngineClient` is one front end's connection to one engine; `RemoteQueue` stands where a `Scheduler` stands in a
single process (`ModelQueue`), so every route, the cache and the metrics work unchanged. A front end learns of a
dead engine from the kernel (its end of the socket closes): what waits on it fails at once with
`EngineUnavailable` (503) and `/health` says so.

`RemoteControl` stands where the engine's `ModelControl` stands in a single process: the repository API's load and
unload go to the engines, and each engine's pushed catalog changes this front end's served set the same way a
reload changes a single process's (new versions' pipelines built here, replaced ones answering what they hold).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import pickle
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import replace
from typing import Any, TypeVar

from aiohttp import web

from ..config import Config, ModelConfig
from ..engine.cancel import running
from ..engine.model import LoadedModel
from ..engine.registry import Registry
from ..engine.scheduler import Asked, ModelQueue, QueueStats
from ..errors import EngineUnavailable, ModelNotFound
from ..runtime.control import Control, ModelState
from ..server.metrics import Metrics
from . import ipc
from .engine import wire_key

log = logging.getLogger("rsinfer.server")
R = TypeVar("R")


class EngineClient:
    def __init__(self, path: str) -> None:
        self.path = path
        self.gone: str | None = None              # why the engine cannot answer any more
        self.catalog: dict[str, Any] = {}         # its latest (engine.EngineServer.catalog)
        self.version = 0                          # the latest's version (its Applied is sent once it serves)
        self.on_catalog: Callable[[EngineClient], None] | None = None   # told when the engine pushes a new one
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[ipc.ToFrontEnd]] = {}
        self._channel: ipc.Channel | None = None

    async def connect(self, timeout_s: float = 60.0) -> list[LoadedModel]:
        """Connect and fetch the engine's catalog; the models it loaded, without their sessions."""
        loop = asyncio.get_running_loop()
        def channel_() -> ipc.Channel:
            return ipc.Channel(self._reply, self._lost, ipc.ToFrontEnd)

        _, channel = await asyncio.wait_for(loop.create_unix_connection(channel_, self.path), timeout_s)
        self._channel = channel
        reply = await asyncio.wait_for(self._ask(ipc.Hello()), timeout_s)
        assert isinstance(reply, ipc.Catalog), reply
        self.catalog = pickle.loads(reply.catalog)  # noqa: S301 - our own engine
        models: list[LoadedModel] = self.catalog["models"]
        return models

    def _reply(self, _channel: ipc.Channel, msg: ipc.ToFrontEnd) -> None:
        if msg.id == 0 and isinstance(msg, ipc.Catalog):       # pushed: the engine's served set changed
            self.catalog = pickle.loads(msg.catalog)  # noqa: S301 - our own engine
            self.version = msg.version
            if self.on_catalog is not None:
                self.on_catalog(self)
            return
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

    def applied(self, version: int) -> None:
        """Tell the engine this front end serves its catalog of `version`."""
        if self._channel is not None and self.gone is None:
            self._channel.send(ipc.Applied(version=version))

    async def control(self, op: str, name: str = "") -> None:
        """Change the engine's served set (engine.EngineServer._control); its new catalog arrives first."""
        reply = await self._ask(ipc.Control(action=op, name=name))
        assert isinstance(reply, ipc.Done), reply

    async def stats(self) -> list[list[Any]]:
        reply = await self._ask(ipc.Stats())
        assert isinstance(reply, ipc.QueueStats), reply
        return reply.stats

    def close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()


class RemoteQueue:
    """A model's queue as a front end sees it: the request is planned and answered here, its rows forwarded by the
    engine's scheduler, batched there with the rows of every front end. A small request (its body) is tokenized and
    answered on this event loop, where a thread hop would cost more than the work; a larger one on the prep pool,
    never holding the loop for long."""

    def __init__(self, client: EngineClient, key: str, prep: Executor) -> None:
        self.client = client
        self.key = key          # the version's wire key (engine.wire_key): its queue in the engine
        self.prep = prep
        self.numbers = QueueStats(0, 0, 0)    # the engine's, at the last `refresh`

    async def answer(self, ask: Asked[R]) -> R:
        token = ask.token
        if ask.small:
            work = running(token, ask.plan)
            outputs = await self.client.rows(self.key, work.rows, work.costs) if work.rows else []
            return running(token, ask.finish, outputs)
        loop = asyncio.get_running_loop()
        work = await loop.run_in_executor(self.prep, running, token, ask.plan)
        outputs = await self.client.rows(self.key, work.rows, work.costs) if work.rows else []
        return await loop.run_in_executor(self.prep, running, token, ask.finish, outputs)

    def stats(self) -> QueueStats:
        return self.numbers

    def stop(self) -> None:
        pass


async def refresh(queues: dict[str, ModelQueue], clients: Sequence[EngineClient]) -> None:
    """The engines' queue numbers into their front-end queues (before `/metrics` renders)."""
    for client in clients:
        if client.gone is not None:
            continue
        for key, waiting, rows, forwards in await client.stats():
            q = queues.get(key)
            if isinstance(q, RemoteQueue):
                q.numbers = QueueStats(waiting, rows, forwards)


class RemoteControl(Control):
    """The served set of a front-end process: the engines change it (a SIGHUP reaches them through the supervisor;
    the repository API through here), and each pushed catalog is applied to this front end's runtime."""

    def __init__(self, runtime: Any, clients: Sequence[EngineClient], changed: Callable[[], None]) -> None:
        self.runtime = runtime
        self.clients = list(clients)
        self.changed = changed
        self.owner: dict[str, EngineClient] = {}       # wire key → the engine that runs it
        self._applying: asyncio.Future[None] | None = None
        self._lock = asyncio.Lock()
        runtime.queue_for = lambda m: RemoteQueue(self.owner[wire_key(m)], wire_key(m), runtime.prep_executor)
        for client in self.clients:
            client.on_catalog = self._pushed
            for m in client.catalog.get("models", ()):
                self.owner[wire_key(m)] = client

    @property
    def states(self) -> dict[str, ModelState]:  # type: ignore[override]  # the engines', read-only here
        out: dict[str, ModelState] = {}
        for client in self.clients:
            for name, (state, reason) in client.catalog.get("states", {}).items():
                out[name] = ModelState(state, reason)
        return out

    async def reload(self) -> None:
        for client in self.clients:
            await client.control("reload")
        await self._settled()

    async def load(self, name: str) -> None:
        await self._each("load", name)

    async def unload(self, name: str) -> None:
        await self._each("unload", name)

    async def _each(self, op: str, name: str) -> None:
        """`op` on the engine that has `name` in its part of the config (each engine has its device's)."""
        missing: ModelNotFound | None = None
        for client in self.clients:
            try:
                await client.control(op, name)
            except ModelNotFound as exc:
                missing = exc
                continue
            await self._settled()
            return
        assert missing is not None
        raise missing

    async def _settled(self) -> None:
        """This front end serves what the engine pushed before it answered."""
        while self._applying is not None and not self._applying.done():
            await asyncio.shield(self._applying)

    def _pushed(self, client: EngineClient) -> None:
        self._applying = asyncio.ensure_future(self._apply(client))

    async def _apply(self, client: EngineClient) -> None:
        """An engine's new catalog: its versions that are new here get pipelines (built on a thread: a tokenizer is
        read) and queues to the engine; names it serves no more stop here; the rest is untouched."""
        async with self._lock:
            catalog, version = client.catalog, client.version
            reg = self.runtime.registry
            by_name: dict[str, list[LoadedModel]] = {}
            for m in catalog["models"]:
                by_name.setdefault(m.name, []).append(m)
            entries = {e.name: e for e in catalog["entries"]}
            mine = {n for n, vs in reg.entries.items() if any(self.owner.get(wire_key(v)) is client for v in vs)}
            for name in sorted(mine | set(by_name)):
                await self._update(client, name, by_name.get(name), entries.get(name))
            reg.unavailable.update(catalog.get("unavailable", {}))
            for name in [n for n in reg.unavailable if n in reg.entries]:
                reg.unavailable.pop(name)
            self._adopt_entries()
            self.changed()
            client.applied(version)

    async def _update(self, client: EngineClient, name: str, new: list[LoadedModel] | None,
                      entry: ModelConfig | None) -> None:
        """Model `name` as the engine now serves it (`new`: its versions; None: not at all)."""
        rt = self.runtime
        old = rt.registry.entries.get(name, [])
        if new and [wire_key(m) for m in new] == [wire_key(m) for m in old]:
            return                        # the same loads: untouched
        if new:
            for m in new:
                self.owner[wire_key(m)] = client
            try:
                pipes = await asyncio.get_running_loop().run_in_executor(None, rt.prepare, new)
            except Exception as exc:  # noqa: BLE001 - the engine serves it; this front end cannot
                log.error("model %s: served by its engine, but this front end cannot build its pipeline: %s",
                          name, exc)
                return
            replaced = rt.install(name, new, pipes, entry)
        else:
            replaced = rt.install(name, None, {})
        rt.retire_later(replaced)

    def _adopt_entries(self) -> None:
        """The config's models as the engines have them now (for the repository index), in the order known."""
        rt = self.runtime
        configured = {m.name: m for c in self.clients for m in c.catalog.get("entries", ())}
        order = [m.name for m in rt.config.models]
        models = sorted(configured.values(), key=lambda m: order.index(m.name) if m.name in order else len(order))
        rt.config = replace(rt.config, models=tuple(models))


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
    queues: dict[str, ModelQueue] = {}
    runtime = Runtime(config, registry, metrics or Metrics(), queues=queues)
    queues.update({key: RemoteQueue(client, wire_key(m), runtime.prep_executor) for key, (m, client) in models.items()})
    # the engines change the served set: no control of its own here (it would read the file and count the
    # engines' loads again)
    app = create_app(runtime, control=lambda state: RemoteControl(runtime, clients, state.refresh))
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
