"""What crosses between a front-end process and an engine process: messages of frames on a Unix socket.

A message is MessagePack (msgspec) in frame 0; a numpy array inside it is an extension that points at a later
frame holding the array's own buffer (written from the array's memory, read back as `np.frombuffer` of the
received bytes: no per-array copy in Python). Arrays under `INLINE_BYTES` travel inside frame 0 instead: for a
few hundred bytes a frame of its own costs more than the copy. Token rows are lists of ints, which MessagePack
packs tighter than an int64 array. Never pickle on the request path: pickle is slower, and would run whatever it
is given.

On the wire a batch is `u32 frame count, u64 size per frame, the frames`, and frame 0 is a MessagePack array of
every message a side sent in one event-loop iteration (each encoded when it was sent, so a message that cannot be
encoded fails alone; each decoded alone, so one that cannot be read is reported and skipped): one header, one copy
out of the stream and one decode call a batch instead of one each a message (16 small replies in a tight loop: the
sending and receiving of a reply 8.6 µs of CPU as messages of their own, 3.7-4.7 in one batch).

Why not ZeroMQ (pyzmq), which we tried first: a round trip of a 100-byte message between two processes cost the
asyncio client 154 µs of CPU with `zmq.asyncio` (p50 248 µs) and 50 µs over an asyncio Unix-socket protocol (p50
112 µs) on the 2-core machine - a front end's whole per-request budget is 150 µs. A Unix socket also tells each
side at once when the other process dies (the kernel closes its end), which is how a front end learns that its
engine is gone.

Errors travel by their `type` name from `rsinfer_cli.errors` and come back as the same class, message, `param`
and `model`, so a front end answers them exactly as a single process would.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import threading
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np

from .. import errors

log = logging.getLogger("rsinfer.server")

ARRAY, OBJECTS = 1, 2          # extension codes: a numeric array (inline or a frame), an array of str/bytes
INLINE_BYTES = 16 * 1024
Frame = bytes | memoryview

_meta_enc = msgspec.msgpack.Encoder()
_meta_dec = msgspec.msgpack.Decoder()


def encode_into(message: Any, frames: list[Frame]) -> bytes:
    """A message (dicts, lists, numbers, str, bytes, None, numpy arrays and scalars, Structs) → its MessagePack; each
    array too large to travel inline is appended to `frames` and referred to by its index there (the frames of the
    batch the message joins; index 0 is the batch's own frame)."""

    def hook(obj: Any) -> Any:
        if isinstance(obj, np.generic):
            obj = np.asarray(obj)
        if isinstance(obj, np.ndarray):
            if obj.dtype == object or obj.dtype.kind in "US":
                return msgspec.msgpack.Ext(OBJECTS, _meta_enc.encode([list(obj.shape), obj.ravel().tolist()]))
            shape = list(obj.shape)   # (ascontiguousarray makes a 0-d array 1-d)
            if obj.nbytes < INLINE_BYTES:
                return msgspec.msgpack.Ext(ARRAY, _meta_enc.encode([obj.dtype.str, shape, -1, obj.tobytes()]))
            arr = np.ascontiguousarray(obj)
            frames.append(memoryview(arr).cast("B"))  # type: ignore[arg-type]   # numpy arrays are buffers
            return msgspec.msgpack.Ext(ARRAY, _meta_enc.encode([arr.dtype.str, shape, len(frames) - 1, b""]))
        if isinstance(obj, tuple):
            return list(obj)
        raise TypeError(f"cannot send {type(obj).__name__} between processes")

    return msgspec.msgpack.encode(message, enc_hook=hook)


def _array_head(n: int) -> bytes:
    """The MessagePack header of an array of `n` items (what precedes the items' own encodings)."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


_local = threading.local()   # the frames of the message being decoded (an engine thread and a front end may share
                             # a process: the tests run them so)


def _ext(code: int, data: memoryview) -> Any:
    if code == ARRAY:
        dtype, shape, index, raw = _meta_dec.decode(data)
        buf = _local.frames[index] if index >= 0 else raw
        return np.frombuffer(buf, dtype=np.dtype(dtype)).reshape(shape)
    if code == OBJECTS:
        shape, items = _meta_dec.decode(data)
        out = np.empty(len(items), dtype=object)
        out[:] = items
        return out.reshape(shape)
    raise ValueError(f"unknown extension {code}")


_DECODERS: dict[Any, msgspec.msgpack.Decoder[Any]] = {}


def _decoder(schema: Any) -> msgspec.msgpack.Decoder[Any]:
    """A message's decoder as `schema` (a Struct or union of Structs; Any: plain data); the arrays it makes are
    read-only views of the received frames (no copy)."""
    decoder = _DECODERS.get(schema)
    if decoder is None:
        decoder = _DECODERS[schema] = msgspec.msgpack.Decoder(schema, ext_hook=_ext)
    return decoder


_BATCH = msgspec.msgpack.Decoder(list[msgspec.Raw])   # a batch's frame 0 → its messages, each still encoded


# ------------------------------------------------------------ the messages: tagged by `op`, decoded into their Struct


class Message(msgspec.Struct, tag_field="op", kw_only=True):
    id: int = 0                  # the request's number on its connection; a reply carries the same


class Hello(Message, tag="hello"):
    """front end → engine, once: what do you serve?"""


class Rows(Message, tag="rows"):
    """front end → engine: run these rows of model `key` (batched with everyone's)."""

    key: str
    rows: list[Any]
    costs: list[int]


class Cancel(Message, tag="cancel"):
    """front end → engine: nobody waits for request `id` any more."""


class Stats(Message, tag="stats"):
    """front end → engine: the queues' numbers, for /metrics."""


class Control(Message, tag="control"):
    """front end → engine: change the served set (`action`: reload | load | unload, of model `name`); `Done` or
    `Failed` answers once the engine's own set changed (its new catalog is pushed to every front end first)."""

    action: str
    name: str = ""


class Catalog(Message, tag="catalog"):
    """engine → front end: the answer to `Hello`, and (id 0) pushed to every front end after each change of the
    served set."""

    catalog: bytes               # engine.catalog(): the loaded models without their sessions, the entries and
                                 # their states (pickled: our own engine; at start-up and at each change only)
    version: int = 0             # counts the engine's changes; a front end answers a pushed one with `Applied`


class Applied(Message, tag="applied"):
    """front end → engine: it serves the pushed catalog of this `version` (the engine answers a change's `Control`,
    and tells the supervisor a reload is done, only once every front end does)."""

    version: int


class Done(Message, tag="done"):
    """engine → front end: the `Control` asked for is done."""


class Outputs(Message, tag="outputs"):
    outputs: list[Any]           # one per row, in the rows' order


class QueueStats(Message, tag="queue_stats"):
    stats: list[list[Any]]       # [key, waiting, queued rows, running] per model


class Failed(Message, tag="failed"):
    error: dict[str, Any]        # error_to_wire()


ToEngine = Hello | Rows | Cancel | Stats | Control | Applied
ToFrontEnd = Catalog | Outputs | QueueStats | Failed | Done


# ------------------------------------------------------------ errors

_ERRORS: dict[str, type[errors.RsinferError]] = {
    cls.__name__: cls for cls in vars(errors).values()
    if isinstance(cls, type) and issubclass(cls, errors.RsinferError)
}


def error_to_wire(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, errors.RsinferError) and type(exc).__name__ in _ERRORS:
        return {"class": type(exc).__name__, "message": exc.message, "param": exc.param, "model": exc.model}
    return {"class": "InferenceError", "message": f"the engine failed: {type(exc).__name__}: {exc}",
            "param": None, "model": None}


def error_from_wire(wire: dict[str, Any]) -> errors.RsinferError:
    cls = _ERRORS.get(str(wire.get("class")), errors.InferenceError)
    return cls(str(wire.get("message", "")), param=wire.get("param"), model=wire.get("model"))


# ------------------------------------------------------------ the connection


class Channel(asyncio.Protocol):
    """One connection between a front end and an engine; `on_message(channel, message)` for each message in (decoded
    as `receives`), `on_lost(channel)` once when it closes (the peer stopped, or died)."""

    def __init__(self, on_message: Callable[[Channel, Any], None],
                 on_lost: Callable[[Channel], None] | None = None, receives: Any = Any) -> None:
        self.on_message = on_message
        self.receives = receives        # what the other side sends (ToEngine, ToFrontEnd; Any: plain data)
        self.on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._msgs: list[bytes] = []    # encoded messages queued for the end of this loop iteration
        self._frames: list[Frame] = [b""]   # their large arrays (frame 0: the batch's messages, made at the flush)
        self._need = 4                  # bytes that complete the part being read
        self._sizes: tuple[int, ...] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]   # a stream transport (asyncio's or uvloop's)

    def send(self, message: Any) -> None:
        """Queue a message (encoded now: one the wire cannot carry raises TypeError here, alone); the messages of one
        event-loop iteration leave as one batch in one write (a forward that answers many requests at once, or many
        requests that arrive together, cost one system call, one wake-up and one decode call of the other side, not
        one each)."""
        if self.transport is None or self.transport.is_closing():
            return
        frames = self._frames
        mark = len(frames)
        try:
            head = encode_into(message, frames)
        except BaseException:
            del frames[mark:]          # the arrays of a message that does not go
            raise
        if not self._msgs:
            asyncio.get_running_loop().call_soon(self._flush)
        self._msgs.append(head)

    def _flush(self) -> None:
        msgs, frames = self._msgs, self._frames
        self._msgs, self._frames = [], [b""]
        if not msgs or self.transport is None or self.transport.is_closing():
            return
        frames[0] = _array_head(len(msgs)) + b"".join(msgs)
        sizes = [memoryview(f).nbytes for f in frames]
        self.transport.writelines([struct.pack(f"<I{len(sizes)}Q", len(sizes), *sizes), *frames])

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        while len(buf) >= self._need:
            if self._sizes is None:
                count = struct.unpack_from("<I", buf)[0]
                if len(buf) < 4 + 8 * count:
                    self._need = 4 + 8 * count
                    continue
                self._sizes = struct.unpack_from(f"<{count}Q", buf, 4)
                self._need = 4 + 8 * count + sum(self._sizes)
                continue
            head = 4 + 8 * len(self._sizes)
            view = memoryview(buf)
            body = memoryview(view[head:self._need].tobytes())   # the message's one copy out of the buffer
            view.release()
            del buf[:self._need]
            frames, at = [], 0
            for size in self._sizes:
                frames.append(body[at:at + size])
                at += size
            self._sizes, self._need = None, 4
            try:
                batch = _BATCH.decode(frames[0])
            except Exception as exc:  # noqa: BLE001 - framing stays in step; the batch is reported and skipped
                log.error("unreadable messages between rsinfer processes: %r", exc)
                continue
            decoder = _decoder(self.receives)
            local = _local
            try:
                for raw in batch:
                    local.frames = frames      # (again for each: on_message may decode something of its own)
                    try:
                        message = decoder.decode(raw)
                    except Exception as exc:  # noqa: BLE001 - one message is reported and skipped, the rest go on
                        log.error("unreadable message between rsinfer processes: %r", exc)
                        continue
                    self.on_message(self, message)
            finally:
                local.frames = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.on_lost is not None:
            self.on_lost(self)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
