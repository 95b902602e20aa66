"""The engine side of multi-process serving: one engine per device owns its models' ORT sessions and their
schedulers, and runs the rows that every front-end process sends it, so cross-request batching sees the rows of
all front ends.

It listens on a Unix socket (`ipc.py`); each front end holds one connection and sends
- `hello` → the catalog: each model as loaded (config, resolved files, graph signature, EPs, limits, digest), all
  a front end needs to build the same pipelines without the sessions (pickled once at start-up, never per request);
- `rows` (id, model key, rows, costs) → the outputs of those rows in order, or the error as `ipc.error_to_wire`;
- `cancel` (id) → its queued rows are dropped and its direct forwards stop (the client left, or its deadline
  passed); a front end whose connection closes (it stopped, or died) has all of its requests cancelled so;
- `stats` (id) → each model's queue depth, rows queued and forwards running, for the front end's `/metrics`;
- `control` (id, reload | load | unload, name) → the served set changed here (runtime/control.py), then the new
  catalog pushed to every front end (`catalog` with id 0), then `done` (or the error).

A model's rows are addressed by its key and load serial (`wire_key`): a front end that still holds a version a
reload replaced sends that version's rows to that version's queue, which drains before it is freed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ..config import Config
from ..engine.model import LoadedModel
from ..engine.registry import Registry
from ..engine.scheduler import RowForward, Scheduler, as_is
from ..engine.session import Session
from ..errors import InputError, ModelNotFound
from ..pipelines.base import RowPipeline
from ..runtime import Runtime
from ..server.metrics import Metrics
from . import ipc

log = logging.getLogger("rsinfer.engine")



def shell(model: LoadedModel) -> LoadedModel:
    """The model as a front end holds it: everything but the sessions."""
    return replace(model, sessions=[], wide=None,
                   towers={name: replace(t, sessions=[], wide=None) for name, t in model.towers.items()})


def wire_key(model: LoadedModel) -> str:
    """How a front end names a loaded version's queue: its key and its load serial."""
    return f"{model.key}@{model.stats.get('serial', 0)}"


# a replaced version's queue is freed once empty this long: rows a front end tokenized before it learnt of the
# change still arrive
QUIET_S = 0.5


class EngineServer:
    def __init__(self, config: Config, registry: Registry, metrics: Metrics,
                 select: Callable[[Config], Config] | None = None) -> None:
        """`select(config)`: the models of this engine's device (a reloaded file holds every device's)."""
        from ..runtime.control import ModelControl

        self.config = config
        self.registry = registry
        self.metrics = metrics
        # the models' queues over their replicas here; the cache is the front ends' (start(cache=False) only hashes
        # the graph digests of its keys, once here for every front end)
        self.runtime = Runtime(config, registry, metrics, forward=self._tagged).start(cache=False)
        self.control = ModelControl(self.runtime, select=select, changed=self._changed, metrics=metrics,
                                    quiet_s=QUIET_S)
        self.schedulers: dict[str, Scheduler] = {}      # by wire key, the versions draining too
        self._rewire()
        # rows queued and not yet answered, by (front end, request id): what abandons them
        self._pending: dict[tuple[ipc.Channel, int], Callable[[], None]] = {}
        self._channels: set[ipc.Channel] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.version = 0                                  # changes of the served set so far
        self._acks: dict[ipc.Channel, int] = {}           # the version each front end serves

    def _tagged(self, pipe: RowPipeline, model: LoadedModel) -> RowForward:
        """The pipeline's forward over rows tagged with the front end each came from; how many front ends shared
        each forward is observed (`rsinfer_batch_frontends`)."""
        shared = self.metrics.batch_frontends.labels(model.name, model.version or "")
        forward = pipe.forward

        def run(session: Session, rows: Sequence[Any]) -> list[Any]:
            shared.observe(len({r[0] for r in rows}))
            return forward(session, [r[1] for r in rows])

        return run

    def catalog(self) -> bytes:
        """What a front end needs to serve this engine's models: each loaded version without its sessions, the
        entries of the config as this engine has them, and each entry's state."""
        reg = self.registry
        return pickle.dumps({
            "models": [shell(m) for m in reg.models.values()],
            "entries": list(self.runtime.config.models),
            "states": {n: (st.state, st.reason) for n, st in self.control.states.items()},
            "unavailable": dict(reg.unavailable)})

    def _rewire(self) -> None:
        """The queues by wire key: every served version's, and those of replaced versions still draining."""
        core = self.runtime.core
        live = {wire_key(m): q for m in self.registry.models.values()
                if isinstance(q := self.runtime.queues[m.key], Scheduler)}
        draining = {id(q) for _, q in core.retiring.values()}
        live.update({k: q for k, q in self.schedulers.items() if k not in live and id(q) in draining})
        self.schedulers = live

    def _changed(self) -> None:
        """The served set changed: every front end gets the new catalog."""
        self._rewire()
        self.version += 1
        catalog = self.catalog()
        for channel in list(self._channels):
            channel.send(ipc.Catalog(id=0, catalog=catalog, version=self.version))

    async def applied(self, timeout_s: float) -> None:
        """Until every connected front end serves the latest catalog (at most `timeout_s`: a front end that cannot
        apply it logs why; the change is not taken back)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while any(self._acks.get(c, 0) < self.version for c in self._channels):
            if asyncio.get_running_loop().time() > deadline:
                log.warning("a front end did not confirm the new set of models within %.0f s", timeout_s)
                return
            await asyncio.sleep(0.005)

    async def _control(self, channel: ipc.Channel, msg: ipc.Control) -> None:
        try:
            if msg.action == "reload":
                await self.control.reload()
            elif msg.action == "load":
                await self.control.load(msg.name)
            elif msg.action == "unload":
                await self.control.unload(msg.name)
            else:
                raise InputError(f"unknown control operation '{msg.action}'")
            await self.applied(self.config.server.request_timeout_ms / 1000)
        except Exception as exc:  # noqa: BLE001 - the front end's answer
            channel.send(ipc.Failed(id=msg.id, error=ipc.error_to_wire(exc)))
            return
        channel.send(ipc.Done(id=msg.id))

    # ------------------------------------------------------------ serving

    async def serve(self, path: str, stop: asyncio.Event, ready: Callable[[], None] | None = None) -> None:
        """Answer front ends on the Unix socket `path` until `stop` is set; then fail what still waits and release
        the sessions. `ready()` once the socket listens."""
        loop = asyncio.get_running_loop()
        server = await loop.create_unix_server(self._connected, path)
        flusher = asyncio.ensure_future(self._flush_every(1.0))
        os.chmod(path, 0o600)
        if ready is not None:
            ready()
        try:
            await stop.wait()
        finally:
            flusher.cancel()
            self.metrics.flush()
            server.close()
            for abandon in list(self._pending.values()):
                abandon()
            for channel in list(self._channels):   # the front ends learn at once that this engine is gone
                channel.close()
            await self.runtime.close()

    async def _flush_every(self, seconds: float) -> None:
        """The metrics files never lag more than this behind (a scrape asks for a flush itself)."""
        while True:
            await asyncio.sleep(seconds)
            self.metrics.flush()

    def _connected(self) -> ipc.Channel:
        channel = ipc.Channel(self._handle, self._lost, ipc.ToEngine)
        self._channels.add(channel)
        return channel

    def _lost(self, channel: ipc.Channel) -> None:
        """A front end went away: nobody waits for its requests any more."""
        self._channels.discard(channel)
        self._acks.pop(channel, None)
        for (owner, rid), abandon in list(self._pending.items()):
            if owner is channel:
                self._pending.pop((owner, rid), None)
                abandon()

    def _handle(self, channel: ipc.Channel, msg: ipc.ToEngine) -> None:
        match msg:
            case ipc.Rows():
                self._rows(channel, msg)
            case ipc.Cancel():
                abandon = self._pending.pop((channel, msg.id), None)
                if abandon is not None:
                    abandon()
            case ipc.Stats():             # a front end renders /metrics next: the files get this engine's numbers
                self.metrics.flush()
                stats = [[m.key, q.waiting, q.queued_rows, q.running] for m in self.registry.models.values()
                     if isinstance(q := self.runtime.queues[m.key], Scheduler)]
                channel.send(ipc.QueueStats(id=msg.id, stats=stats))
            case ipc.Hello():
                self._acks[channel] = self.version        # it starts from the catalog it gets now
                channel.send(ipc.Catalog(id=msg.id, catalog=self.catalog(), version=self.version))
            case ipc.Applied():
                self._acks[channel] = max(self._acks.get(channel, 0), msg.version)
            case ipc.Control():
                task = asyncio.ensure_future(self._control(channel, msg))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    def _rows(self, channel: ipc.Channel, msg: ipc.Rows) -> None:
        """The rows into their model's queue with a callback for the answer (Scheduler.enqueue): no task per request;
        what abandons them is kept until they are answered, for a Cancel or the front end's loss."""
        scheduler = self.schedulers.get(msg.key)
        if scheduler is None:        # a front end asks only for models of the catalog this engine sent it
            channel.send(ipc.Failed(id=msg.id, error=ipc.error_to_wire(ModelNotFound(
                f"model '{msg.key.split('@')[0]}' is not served by this engine any more; send the request again",
                model=msg.key.split('@')[0]))))
            return
        key = (channel, msg.id)
        source = id(channel)

        def done(outputs: Any, exc: BaseException | None) -> None:
            self._pending.pop(key, None)
            self._reply(channel, msg.id, ipc.Outputs(id=msg.id, outputs=outputs) if exc is None
                        else ipc.Failed(id=msg.id, error=ipc.error_to_wire(exc)))

        try:
            abandon = scheduler.enqueue([(source, r) for r in msg.rows], msg.costs, as_is, done)
        except Exception as exc:  # noqa: BLE001 - Saturated and the like: the front end's answer
            channel.send(ipc.Failed(id=msg.id, error=ipc.error_to_wire(exc)))
            return
        if abandon is not None:          # answered later (done() drops it); None: answered already (no rows, or a
            self._pending[key] = abandon  # tiny forward run at once)

    def _reply(self, channel: ipc.Channel, rid: int, reply: ipc.ToFrontEnd) -> None:
        try:
            channel.send(reply)
        except TypeError as exc:   # an output the wire cannot carry: the request's error, not the engine's
            channel.send(ipc.Failed(id=rid, error=ipc.error_to_wire(exc)))
