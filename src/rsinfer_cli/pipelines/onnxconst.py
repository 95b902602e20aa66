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
from dataclasses import dataclass, field
from pathlib import Path

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


def _varint(buf: memoryview | bytes, pos: int) -> tuple[int, int]:
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


def _fields(buf: memoryview, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """(field number, wire type, value or offset, length) of each field of the message at buf[start:end]; a
    length-delimited field's value is its offset, a varint's its value."""
    out = []
    pos = start
    while pos < end:
        tag, pos = _varint(buf, pos)
        num, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            out.append((num, wire, value, 0))
        elif wire == 2:
            n, pos = _varint(buf, pos)
            if pos + n > end:
                raise OnnxFileError(f"field {num} at byte {pos} runs past its message")
            out.append((num, wire, pos, n))
            pos += n
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
            out.append((num, wire, pos, n))
            pos += n
        else:
            raise OnnxFileError(f"wire type {wire} at byte {pos} is not ONNX's")
    if pos != end:
        raise OnnxFileError(f"a message ends at byte {pos}, past its length")
    return out


def _text(buf: memoryview, off: int, n: int) -> str:
    return bytes(buf[off:off + n]).decode("utf-8", "replace")


def _tensor(buf: memoryview, start: int, end: int) -> tuple[str, np.ndarray | None]:
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


def _packed_varints(buf: memoryview, off: int, n: int) -> list[int]:
    out, pos = [], off
    while pos < off + n:
        v, pos = _varint(buf, pos)
        out.append(v)
    return out


def _decode(buf: memoryview, data: tuple[int, int, int], dtype: str, count: int, dims: list[int]) -> np.ndarray | None:
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


def _node(buf: memoryview, start: int, end: int) -> Node:
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


def _attribute(buf: memoryview, start: int, length: int, node: Node) -> None:
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


def _graph(buf: memoryview) -> Graph:
    graphs = [(v, n) for num, wire, v, n in _fields(buf, 0, len(buf)) if num == _MODEL_GRAPH and wire == 2]
    if not graphs:
        raise OnnxFileError("no graph in the file")
    start, n = graphs[0]
    nodes, constants = [], {}
    for num, wire, v, ln in _fields(buf, start, start + n):
        if wire != 2:
            continue
        if num == _GRAPH_NODE:
            nodes.append(_node(buf, v, v + ln))
        elif num == _GRAPH_INITIALIZER:
            name, value = _tensor(buf, v, v + ln)
            if value is not None:
                constants[name] = value
    return Graph(nodes, constants)
