"""JSON for the wire and for JSONL output. Response bodies are msgspec Structs (the documented schemas), encoded by
msgspec; the numpy arrays inside them (vectors, scores, tensors) are written by orjson, which serialises an array
natively at its own precision - a float32 vector in its shortest float32 form, as fast as the rest of the body,
where msgspec alone would go through Python floats (1.6-1.9x slower on embedding bodies, 1.8x the bytes:
benchmarks/RESULTS.md)."""

from __future__ import annotations

from typing import Any

import msgspec
import orjson

_OPTS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, option=_OPTS)


def loads(data: bytes | str) -> Any:
    return orjson.loads(data)


JSONDecodeError = orjson.JSONDecodeError


def dumps_line(obj: Any) -> str:
    """One JSONL line (UTF-8 kept, numpy vectors at their own precision)."""
    return orjson.dumps(obj, option=_OPTS | orjson.OPT_APPEND_NEWLINE).decode("utf-8")


def _numpy(obj: Any) -> Any:
    """msgspec's hook for what it does not encode itself: a numpy array or scalar as orjson's JSON of it (spliced in
    as is: a float32 in its shortest float32 form)."""
    import numpy as np  # the CLI's --help imports this module, never numpy

    if isinstance(obj, (np.ndarray, np.generic)):
        return msgspec.Raw(orjson.dumps(obj, option=_OPTS))
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


_ENCODER = msgspec.json.Encoder(enc_hook=_numpy)


def encode(obj: Any) -> bytes:
    """A response body: a Struct (or a list of them, or plain JSON values), numpy arrays anywhere inside."""
    return _ENCODER.encode(obj)
