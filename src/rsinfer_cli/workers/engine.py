"""The engine side of multi-process serving: one engine per device owns its models' ORT sessions and their
schedulers, and runs the rows that every front-end process sends it, so cross-request batching sees the rows of
all front ends.

It listens on a Unix socket (`ipc.py`); each front end holds one connection and sends
- `hello` → the catalog: each model as loaded (config, resolved files, graph signature, EPs, limits, digest), all
  a front end needs to build the same pipelines without the sessions (pickled once at start-up, never per request);
- `rows` (id, model key, rows, costs) → the outputs of those rows in order, or the error as `ipc.error_to_wire`;
- `cancel` (id) → its queued rows are dropped and its direct forwards stop (the client left, or its deadline
  passed); a front end whose connection closes (it stopped, or died) has all of its requests cancelled so;
- `stats` (id) → each model's queue depth, rows queued and forwards running, for the front end's `/metrics`.
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
from ..errors import ModelNotFound
from ..pipelines.base import RowPipeline
from ..runtime import Runtime
from ..server.metrics import Metrics
from . import ipc

log = logging.getLogger("rsinfer.engine")



def shell(model: LoadedModel) -> LoadedModel:
    """The model as a front end holds it: everything but the sessions."""
    return replace(model, sessions=[], wide=None)


class EngineServer:
    def __init__(self, config: Config, registry: Registry, metrics: Metrics) -> None:
        self.config = config
        self.registry = registry
        self.metrics = metrics
        # the models' queues over their replicas here; the cache is the front ends' (start(cache=False) only hashes
        # the graph digests of its keys, once here for every front end)
        self.runtime = Runtime(config, registry, metrics, forward=self._tagged).start(cache=False)
        self.schedulers = {k: q for k, q in self.runtime.queues.items() if isinstance(q, Scheduler)}
        # rows queued and not yet answered, by (front end, request id): what abandons them
        self._pending: dict[tuple[ipc.Channel, int], Callable[[], None]] = {}
        self._channels: set[ipc.Channel] = set()

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
        return pickle.dumps([shell(m) for m in self.registry.models.values()])

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
                stats = [[k, s.waiting, s.queued_rows, s.running] for k, s in self.schedulers.items()]
                channel.send(ipc.QueueStats(id=msg.id, stats=stats))
            case ipc.Hello():
                channel.send(ipc.Catalog(id=msg.id, catalog=self.catalog()))

    def _rows(self, channel: ipc.Channel, msg: ipc.Rows) -> None:
        """The rows into their model's queue with a callback for the answer (Scheduler.enqueue): no task per request;
        what abandons them is kept until they are answered, for a Cancel or the front end's loss."""
        scheduler = self.schedulers.get(msg.key)
        if scheduler is None:        # a front end asks only for models of the catalog this engine sent it
            channel.send(ipc.Failed(id=msg.id, error=ipc.error_to_wire(ModelNotFound(
                f"model '{msg.key}' is not served by this engine", model=msg.key))))
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
