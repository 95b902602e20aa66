"""An ONNX file's nodes and small constants, read from the file's protobuf wire format without loading its weights.

A combined CLIP graph (`onnx/model.onnx` in Xenova's layout) is 150 to 600 MB; the two numbers zero-shot needs
from it (`logit_scale`, `logit_bias`) are scalars near its outputs. `onnx.load` parses every weight into memory
(and `onnx` is not a core dependency), ONNX Runtime does not expose initializers, and protobuf has no lazy field
access: so the file is memory-mapped and walked field by field, each weight's bytes skipped by its length (pages
never touched are never read). Only what a protobuf message's wire format defines is decoded; the field numbers
are onnx.proto's.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

# onnx.proto field numbers
_MODEL_GRAPH = 7
_GRAPH_NODE, _GRAPH_INITIALIZER = 1, 5
_NODE_INPUT, _NODE_OUTPUT, _NODE_OP = 1, 2, 4
_NODE_ATTRIBUTE = 5
_ATTR_NAME, _ATTR_F, _ATTR_T = 1, 2, 5
_TENSOR_DIMS, _TENSOR_TYPE, _TENSOR_FLOATS, _TENSOR_INT32S = 1, 2, 4, 5
_TENSOR_INT64S, _TENSOR_NAME, _TENSOR_RAW, _TENSOR_DOUBLES, _TENSOR_LOCATION = 7, 8, 9, 10, 14
# TensorProto.DataType → numpy, for the types a constant scalar comes in
DTYPES = {1: "<f4", 10: "<f2", 11: "<f8", 6: "<i4", 7: "<i8"}
SMALL = 64          # a constant wider than this many bytes is not read (weights are skipped, never decoded)


class Buf(Protocol):
    """What the reader indexes: bytes, a memoryview of a mapped file, RangeBytes."""

    def __len__(self) -> int: ...

    def __getitem__(self, key: Any, /) -> Any: ...


class OnnxFileError(ValueError):
    """A file that is not a readable ONNX model (the message says where it stopped)."""


@dataclass
class Node:
    op: str
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    value: np.ndarray | None = None       # a Constant node's small value


@dataclass
class Graph:
    """The top-level graph: every node, and the small initializers (by name) as numpy arrays."""

    nodes: list[Node]
    constants: dict[str, np.ndarray]

    def producer(self) -> dict[str, Node]:
        return {out: n for n in self.nodes for out in n.outputs}

    def to_json(self) -> dict[str, Any]:
        return {"nodes": [[n.op, n.inputs, n.outputs, _array_json(n.value)] for n in self.nodes],
                "constants": {k: _array_json(v) for k, v in self.constants.items()}}

    @classmethod
    def from_json(cls, data: Any) -> Graph:
        """The graph `to_json` wrote (OnnxFileError where `data` is not one)."""
        try:
            nodes = [Node(str(op), [str(i) for i in ins], [str(o) for o in outs], _array_of(value))
                     for op, ins, outs, value in data["nodes"]]
            constants = {str(k): _array_of(v) for k, v in data["constants"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise OnnxFileError(f"not a graph's constants ({type(exc).__name__}: {exc})") from None
        return cls(nodes, {k: v for k, v in constants.items() if v is not None})


def _array_json(value: np.ndarray | None) -> Any:
    if value is None:
        return None
    return {"dtype": value.dtype.str, "shape": list(value.shape), "data": value.reshape(-1).tolist()}


def _array_of(data: Any) -> np.ndarray | None:
    if data is None:
        return None
    if data["dtype"] not in DTYPES.values():
        raise ValueError(f"dtype {data['dtype']!r}")
    out: np.ndarray = np.asarray(data["data"], dtype=data["dtype"]).reshape(data["shape"])
    return out


class RangeBytes:
    """A remote file as the reader indexes it: `fetch(start, end)` returns bytes [start, end) (one range request).
    Reads are cached by block; a block that continues the last one doubles its size (a run of nodes is read in a
    few requests), a jump past a weight starts again at 64 KiB (a weight's header needs tens of bytes)."""

    FIRST, LARGEST = 1 << 16, 1 << 22

    def __init__(self, size: int, fetch: Callable[[int, int], bytes], max_requests: int = 4096) -> None:
        self.size, self.fetch, self.max_requests = size, fetch, max_requests
        self.blocks: list[tuple[int, bytes]] = []      # (start, data), the latest last
        self.requests = 0
        self._next = self.FIRST

    def __len__(self) -> int:
        return self.size

    def _block(self, pos: int) -> tuple[int, bytes]:
        for start, data in reversed(self.blocks[-8:]):
            if start <= pos < start + len(data):
                return start, data
        if self.requests >= self.max_requests:
            raise OnnxFileError(f"more than {self.max_requests} range requests")
        last = self.blocks[-1] if self.blocks else None
        self._next = min(self._next * 2, self.LARGEST) if last and last[0] + len(last[1]) == pos else self.FIRST
        end = min(self.size, pos + self._next)
        data = self.fetch(pos, end)
        self.requests += 1
        if len(data) != end - pos:
            raise OnnxFileError(f"a range request for bytes {pos}-{end} returned {len(data)}")
        self.blocks = [*self.blocks[-7:], (pos, data)]
        return pos, data

    def __getitem__(self, key: int | slice) -> Any:
        if isinstance(key, int):
            start, data = self._block(key)
            return data[key - start]
        lo, hi = key.start or 0, min(key.stop if key.stop is not None else self.size, self.size)
        out = bytearray()
        while lo < hi:
            start, data = self._block(lo)
            piece = data[lo - start:hi - start]
            out += piece
            lo += len(piece)
        return bytes(out)


def _varint(buf: Buf, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise OnnxFileError(f"a varint runs past byte {pos}")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def _fields(buf: Buf, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """(field number, wire type, value or offset, length) of each field of the message at buf[start:end]; a
    length-delimited field's value is its offset, a varint's its value."""
    return list(_each_field(buf, start, end))


def _each_field(buf: Buf, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """_fields one by one, each read when the previous one has been used (a remote file is walked in order)."""
    pos = start
    while pos < end:
        tag, pos = _varint(buf, pos)
        num, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield num, wire, value, 0
            continue
        if wire not in (1, 2, 5):
            raise OnnxFileError(f"wire type {wire} at byte {pos} is not ONNX's")
        if wire == 2:
            n, pos = _varint(buf, pos)
        else:
            n = 8 if wire == 1 else 4
        if pos + n > end:
            raise OnnxFileError(f"field {num} at byte {pos} runs past its message")
        yield num, wire, pos, n
        pos += n


def _text(buf: Buf, off: int, n: int) -> str:
    return bytes(buf[off:off + n]).decode("utf-8", "replace")


def _tensor(buf: Buf, start: int, end: int) -> tuple[str, np.ndarray | None]:
    """(name, value) of a TensorProto; the value is None where it is wide, external or of another type."""
    name, dtype, dims, location = "", 0, [], 0
    data: tuple[int, int, int] | None = None        # (field, offset, length)
    for num, wire, v, n in _fields(buf, start, end):
        if num == _TENSOR_NAME:
            name = _text(buf, v, n)
        elif num == _TENSOR_TYPE:
            dtype = v
        elif num == _TENSOR_DIMS:
            dims += [v] if wire == 0 else _packed_varints(buf, v, n)
        elif num == _TENSOR_LOCATION:
            location = v
        elif num in (_TENSOR_RAW, _TENSOR_FLOATS, _TENSOR_DOUBLES, _TENSOR_INT32S, _TENSOR_INT64S) and wire == 2:
            data = (num, v, n)
    count = int(np.prod(dims)) if dims else 1
    if location == 1 or dtype not in DTYPES or data is None or count * 8 > SMALL:
        return name, None
    return name, _decode(buf, data, DTYPES[dtype], count, dims)


def _packed_varints(buf: Buf, off: int, n: int) -> list[int]:
    out, pos = [], off
    while pos < off + n:
        v, pos = _varint(buf, pos)
        out.append(v)
    return out


def _decode(buf: Buf, data: tuple[int, int, int], dtype: str, count: int, dims: list[int]) -> np.ndarray | None:
    num, off, n = data
    if num == _TENSOR_RAW:
        arr = np.frombuffer(bytes(buf[off:off + n]), dtype=dtype)
    elif num == _TENSOR_FLOATS:
        arr = np.frombuffer(bytes(buf[off:off + n]), dtype="<f4")
    elif num == _TENSOR_DOUBLES:
        arr = np.frombuffer(bytes(buf[off:off + n]), dtype="<f8")
    else:   # int32_data (also float16's bit patterns) and int64_data: packed varints
        ints = np.array(_packed_varints(buf, off, n), dtype=np.uint64)
        arr = ints.astype(np.uint16).view("<f2") if dtype == "<f2" else ints.view(np.int64).astype(dtype)
    if arr.size != count:
        return None
    return arr.reshape(dims)


def _node(buf: Buf, start: int, end: int) -> Node:
    node = Node(op="")
    for num, _wire, v, n in _fields(buf, start, end):
        if num == _NODE_INPUT:
            node.inputs.append(_text(buf, v, n))
        elif num == _NODE_OUTPUT:
            node.outputs.append(_text(buf, v, n))
        elif num == _NODE_OP:
            node.op = _text(buf, v, n)
        elif num == _NODE_ATTRIBUTE and n <= SMALL * 4:
            _attribute(buf, v, n, node)
    return node


def _attribute(buf: Buf, start: int, length: int, node: Node) -> None:
    """A Constant node's `value` (a tensor) or `value_float`, kept as its value."""
    fields = _fields(buf, start, start + length)
    name = next((_text(buf, v, n) for num, _w, v, n in fields if num == _ATTR_NAME), "")
    for num, wire, v, n in fields:
        if name == "value" and num == _ATTR_T and wire == 2:
            node.value = _tensor(buf, v, v + n)[1]
        elif name == "value_float" and num == _ATTR_F and wire == 5:
            node.value = np.frombuffer(bytes(buf[v:v + 4]), dtype="<f4").reshape(())


def read_graph(path: Path) -> Graph:
    """The top-level graph of the ONNX file at `path` (OnnxFileError where it is not one)."""
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            buf = memoryview(mm)
            try:
                return _graph(buf)
            finally:
                buf.release()
    except (OSError, ValueError) as exc:    # OnnxFileError is a ValueError; mmap of an empty file too
        raise OnnxFileError(f"{path.name}: {exc}") from None


def read_graph_from(buf: Buf) -> Graph:
    """The top-level graph of an ONNX file held by `buf` (bytes, a memoryview or RangeBytes)."""
    return _graph(buf)


def _graph(buf: Buf) -> Graph:
    found = next(((v, n) for num, wire, v, n in _each_field(buf, 0, len(buf)) if num == _MODEL_GRAPH and wire == 2),
                 None)
    if found is None:
        raise OnnxFileError("no graph in the file")
    start, n = found
    nodes, constants = [], {}
    for num, wire, v, ln in _each_field(buf, start, start + n):
        if wire != 2:
            continue
        if num == _GRAPH_NODE:
            nodes.append(_node(buf, v, v + ln))
        elif num == _GRAPH_INITIALIZER:
            name, value = _tensor(buf, v, v + ln)
            if value is not None:
                constants[name] = value
    return Graph(nodes, constants)
