"""JSON for the wire and for JSONL output. Response bodies are msgspec Structs (the documented schemas), encoded by
msgspec; the numpy arrays inside them (vectors, scores, tensors) are written by orjson, which serialises an array
natively at its own precision - a float32 vector in its shortest float32 form, as fast as the rest of the body,
where msgspec alone would go through Python floats (1.6-1.9x slower on embedding bodies, 1.8x the bytes:
benchmarks/RESULTS.md)."""

from __future__ import annotations

from typing import Any

import msgspec
import orjson

# arrays and objects inside each other in a request body, at most (a tensor of 8 dimensions in a KServe body is 11
# deep); deeper bodies are refused before they are decoded - msgspec's and orjson's recursion would otherwise fail
# wherever the value is next walked (a RecursionError, a 500)
MAX_JSON_DEPTH = 64
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')

_OPTS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, option=_OPTS)


def depth(raw: bytes, limit: int = MAX_JSON_DEPTH) -> int:
    """How deep arrays and objects nest in the JSON text `raw` (strings skipped), or 0 when it cannot pass `limit`
    (fewer brackets than that: two counts, the common case). Linear, at C speed: replaces, a translate, two cumsums."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return 0
    import numpy as np  # the CLI's --help imports this module, never numpy

    # escapes gone (a backslash pair, then an escaped quote), the quotes alternate: a bracket after an odd number
    # of them is inside a string
    bare = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    marks = np.frombuffer(bare, dtype=np.uint8)
    quote = marks == ord('"')
    outside = (np.cumsum(quote) & 1) == 0
    steps = np.where((marks == ord("[")) | (marks == ord("{")), 1, -1)
    steps[quote | ~outside] = 0
    return int(np.cumsum(steps).max(initial=0))


def loads(data: bytes | str) -> Any:
    return orjson.loads(data)


JSONDecodeError = orjson.JSONDecodeError


def exact_int(text: str) -> Any:
    """A JSON integer as an int, or as written when it is past the 64 bits orjson writes."""
    value = int(text)
    return value if -(2 ** 63) <= value < 2 ** 64 else orjson.Fragment(text)


def exact_float(text: str) -> Any:
    """A JSON number with a fraction or exponent as a float, or as written when no finite float holds it."""
    value = float(text)
    return value if value - value == 0 else orjson.Fragment(text)


def kept_constant(text: str) -> Any:
    """NaN, Infinity and -Infinity (not JSON, but Python's json reads them) as written."""
    return orjson.Fragment(text)


def loads_exact(text: str) -> Any:
    """JSON text with every number kept as written where no int of 64 bits or finite float holds it (a record
    written back then says the same); json.JSONDecodeError as json.loads."""
    import json

    return json.loads(text, parse_int=exact_int, parse_float=exact_float, parse_constant=kept_constant)


def loads_record(text: str, where: str) -> dict[str, Any]:
    """One JSON record (an object), its numbers as `loads_exact` keeps them; InputError naming `where` (a file's
    line, a column's row) otherwise."""
    import json

    from .errors import InputError

    try:
        data = loads_exact(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(data, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(data).__name__}")
    return data


def dumps_sorted(obj: Any) -> str:
    """Compact JSON with sorted keys (a value redacted whole is this text of it)."""
    return orjson.dumps(obj, option=_OPTS | orjson.OPT_SORT_KEYS).decode("utf-8")


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
