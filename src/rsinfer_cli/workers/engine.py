"""The engine side of multi-process serving: one engine per device owns its models' ORT sessions and their
schedulers, and runs the rows that every front-end process sends it, so cross-request batching sees the rows of
all front ends.

It answers on a ZeroMQ ROUTER socket (`ipc.py` frames). A front end sends
- `hello` → the catalog: each model as loaded (config, resolved files, graph signature, EPs, limits, digest), all
  a front end needs to build the same pipelines without the sessions (pickled once at start-up, never per request);
- `rows` (id, model key, rows, costs) → the outputs of those rows in order, or the error as `ipc.error_to_wire`;
- `cancel` (id) → its queued rows are dropped and its direct forwards stop (the client left, or its deadline
  passed);
- `stats` (id) → each model's queue depth, rows queued and forwards running, for the front end's `/metrics`.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from ..config import Config
from ..engine.model import LoadedModel
from ..engine.registry import Registry
from ..engine.scheduler import RowForward, Scheduler
from ..engine.session import Session
from ..pipelines import build_pipeline
from ..pipelines.base import RowPipeline
from ..server.metrics import Metrics
from . import ipc

log = logging.getLogger("rsinfer.engine")


def _same(outputs: list[Any]) -> list[Any]:
    return outputs


def shell(model: LoadedModel) -> LoadedModel:
    """The model as a front end holds it: everything but the sessions."""
    return replace(model, sessions=[])


class EngineServer:
    def __init__(self, config: Config, registry: Registry, metrics: Metrics) -> None:
        self.config = config
        self.registry = registry
        self.metrics = metrics
        replicas = sum(m.replicas for m in registry.models.values())
        self.executor = ThreadPoolExecutor(max_workers=max(1, replicas), thread_name_prefix="infer")
        self.pipelines: dict[str, RowPipeline] = {}
        self.schedulers: dict[str, Scheduler] = {}
        for key, m in registry.models.items():
            pipe = self.pipelines[key] = build_pipeline(m, config.server)
            if config.server.cache is not None and m.config.cache:
                pipe.identity()   # the graph digest of the cache keys, hashed once here for every front end
            self.schedulers[key] = Scheduler.for_model(
                key, m.sessions, pipe, self.executor, queue_rows=m.config.batching.queue_rows,
                max_queue=config.server.max_queue, queue_timeout_ms=config.server.queue_timeout_ms,
                observer=metrics.observer(m.name, m.version or ""), forward=self._tagged(pipe, m))
        self._sources: dict[bytes, int] = {}
        self._tasks: dict[tuple[bytes, int], asyncio.Task[None]] = {}
        self._socket: Any = None

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

    def bind(self, address: str) -> None:
        import zmq
        import zmq.asyncio

        self._context = zmq.asyncio.Context()
        sock = self._context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 0)   # a reply to a front end that is gone is dropped, not an error
        sock.bind(address)
        self._socket = sock

    async def serve(self, stop: asyncio.Event) -> None:
        """Answer front ends until `stop` is set; then fail what still waits and release the sessions."""
        sock = self._socket
        receiving: asyncio.Task[Any] | None = None
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while True:
                receiving = asyncio.ensure_future(sock.recv_multipart(copy=False))
                done, _ = await asyncio.wait({receiving, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if receiving not in done:
                    break
                frames = receiving.result()
                receiving = None
                self._handle(frames[0].bytes, [f.buffer for f in frames[1:]])
        finally:
            for task in (receiving, stopping):
                if task is not None:
                    task.cancel()
            for task in list(self._tasks.values()):
                task.cancel()
            for s in self.schedulers.values():
                s.stop()
            self.executor.shutdown(wait=True)
            sock.close(0)
            self._context.term()

    def _handle(self, ident: bytes, frames: list[memoryview]) -> None:
        try:
            msg = ipc.decode(frames)
            op = msg["op"]
        except Exception as exc:  # noqa: BLE001 - a malformed message is logged, never fatal
            log.error("engine: unreadable message from a front end: %r", exc)
            return
        if op == "rows":
            key = (ident, msg["id"])
            task = asyncio.ensure_future(self._rows(ident, msg))
            self._tasks[key] = task
            task.add_done_callback(lambda _t: self._tasks.pop(key, None))
        elif op == "cancel":
            task = self._tasks.pop((ident, msg["id"]), None)
            if task is not None:
                task.cancel()
        elif op == "stats":
            stats = [[k, s.waiting, s.queued_rows, s.running] for k, s in self.schedulers.items()]
            self._send(ident, {"id": msg["id"], "stats": stats})
        elif op == "hello":
            self._send(ident, {"id": msg.get("id", 0), "catalog": self.catalog()})
        else:
            log.error("engine: unknown operation %r", op)

    async def _rows(self, ident: bytes, msg: dict[str, Any]) -> None:
        rid = msg["id"]
        try:
            scheduler = self.schedulers[msg["key"]]
            source = self._sources.setdefault(ident, len(self._sources))
            outputs = await scheduler.submit([(source, r) for r in msg["rows"]], msg["costs"], _same)
            reply: dict[str, Any] = {"id": rid, "outputs": outputs}
        except asyncio.CancelledError:
            return  # the front end no longer waits for it
        except Exception as exc:  # noqa: BLE001 - handed back to the front end that asked
            reply = {"id": rid, "error": ipc.error_to_wire(exc)}
        self._send(ident, reply)

    def _send(self, ident: bytes, reply: dict[str, Any]) -> None:
        try:
            frames = ipc.encode(reply)
        except TypeError as exc:
            frames = ipc.encode({"id": reply.get("id"), "error": ipc.error_to_wire(exc)})
        self._socket.send_multipart([ident, *frames], copy=False)
