"""What crosses between a front-end process and an engine process: messages as ZeroMQ multipart frames.

Frame 0 is MessagePack (msgspec) of the message; a numpy array inside it is an extension that points at a later
frame holding the array's own buffer, sent and received without a copy (ZeroMQ frames; `np.frombuffer` on the
received frame). Arrays under `INLINE_BYTES` travel inside frame 0 instead: for a few hundred bytes a frame of its
own costs more than the copy. Token rows are lists of ints, which MessagePack packs tighter than an int64 array.
Never pickle on the request path: the peer is trusted, but pickle is slower and would run whatever it is given.

Errors travel by their `type` name from `rsinfer_cli.errors` and come back as the same class, message, `param`
and `model`, so a front end answers them exactly as a single process would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from .. import errors

ARRAY, OBJECTS = 1, 2          # extension codes: a numeric array (inline or a frame), an array of str/bytes
INLINE_BYTES = 16 * 1024
Frame = bytes | memoryview

_meta_enc = msgspec.msgpack.Encoder()
_meta_dec = msgspec.msgpack.Decoder()


def encode(message: Any) -> list[Frame]:
    """message (dicts, lists, numbers, str, bytes, None, numpy arrays and scalars) → frames."""
    frames: list[Frame] = [b""]

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
            frames.append(memoryview(arr).cast("B"))
            return msgspec.msgpack.Ext(ARRAY, _meta_enc.encode([arr.dtype.str, shape, len(frames) - 1, b""]))
        if isinstance(obj, tuple):
            return list(obj)
        raise TypeError(f"cannot send {type(obj).__name__} between processes")

    frames[0] = msgspec.msgpack.encode(message, enc_hook=hook)
    return frames


def decode(frames: Sequence[Frame]) -> Any:
    """frames → the message; arrays are read-only views of the received frames (no copy)."""

    def hook(code: int, data: memoryview) -> Any:
        if code == ARRAY:
            dtype, shape, index, raw = _meta_dec.decode(data)
            buf = frames[index] if index >= 0 else raw
            return np.frombuffer(buf, dtype=np.dtype(dtype)).reshape(shape)
        if code == OBJECTS:
            shape, items = _meta_dec.decode(data)
            out = np.empty(len(items), dtype=object)
            out[:] = items
            return out.reshape(shape)
        raise ValueError(f"unknown extension {code}")

    return msgspec.msgpack.decode(frames[0], ext_hook=hook)


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
