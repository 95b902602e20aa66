"""`kind: tensor`: any ONNX graph, no tokenizer; named tensors in, named tensors out.

Requests are checked against the graph's signature before any work: known input names, every input present,
datatype equal, rank and fixed dimensions equal (each failure an InputError naming the input and what was
expected). With `max_batch_size > 0` dimension 0 of every input is the batch: a request of `[n, ...]` with
`n <= max_batch_size` is split into `n` rows that the scheduler may batch with other requests' rows (rows are
concatenated along dimension 0 when their other dimensions agree), and a request that leaves out the batch
dimension is run as `[1, ...]` and answered without it. With `max_batch_size: 0` a request runs as it is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import opt
from ..engine.model import LoadedModel
from ..engine.session import Session, TensorInfo, sample_feeds
from ..errors import InferenceError, InputError, ModelLoadError
from ..wire import UNSUPPORTED, datatype_of
from .base import Array, RowPipeline, Timing, Work

TensorRow = dict[str, Array]


def minmax_rows(arr: Array, batched: bool) -> Array:
    """Each row rescaled to [0, 1] (a constant row becomes zeros), in the input's own float dtype."""
    x = arr.astype(np.float64)
    flat = x.reshape(x.shape[0], -1) if batched and x.ndim > 1 else x.reshape(1, -1)
    lo, hi = flat.min(axis=1, keepdims=True), flat.max(axis=1, keepdims=True)
    span = np.where(hi > lo, hi - lo, 1.0)
    out: Array = ((flat - lo) / span).reshape(arr.shape).astype(arr.dtype)
    return out


def kserve_shape(t: TensorInfo) -> list[int]:
    return [d if isinstance(d, int) and d >= 0 else -1 for d in t.shape]


def platform(model: LoadedModel) -> str:
    """KServe's `platform` of a model: Triton's name for an ONNX graph, else the script backend."""
    return "onnxruntime_onnx" if model.backend == "onnx" else model.backend


def tensor_metadata(tensors: Sequence[TensorInfo]) -> list[dict[str, Any]]:
    """KServe's tensor metadata: name, datatype, shape (-1 for a variable dimension)."""
    return [{"name": t.name, "datatype": datatype_of(t.dtype), "shape": kserve_shape(t)} for t in tensors]


@dataclass
class TensorResult:
    outputs: dict[str, Array]   # by output name, in the graph's order
    timing: Timing


@dataclass(frozen=True)
class TensorOptions:
    """The tensor family's input rules (inferstack-rs's MIN/MAX_INPUT_SIZE, NORMALIZE_INPUT): elements per row of
    every input (the batch dimension left out when max_batch_size > 0); minmax rescales each row of a float input
    to [0, 1] (`normalize_input`: `normalize` is the embedding family's L2 switch)."""

    # fewest elements an input may have (the batch dimension left out); fewer → 400
    min_elements: int | None = opt(None, ge=0)
    # most elements an input may have; more → 400
    max_elements: int | None = opt(None, gt=0)
    # minmax: each row of a float input rescaled to [0, 1] before the forward
    normalize_input: str = opt("none", choices=("none", "minmax"))


class TensorPipeline(RowPipeline):
    kind = "tensor"

    def __init__(self, model: LoadedModel) -> None:
        super().__init__(model)
        self.max_batch_size = model.config.max_batch_size
        self.inputs = {t.name: t for t in model.graph.inputs}
        self._shapes = {t.name: kserve_shape(t) for t in model.graph.inputs}   # checked against on every request
        self._fixed = {name: [(k, d) for k, d in enumerate(want) if d >= 0] for name, want in self._shapes.items()}
        self.outputs = [t.name for t in model.graph.outputs]
        self._check_batch_dimension(model)
        opts = model.config.own(TensorOptions)
        self.min_elements, self.max_elements, self.normalize = (opts.min_elements, opts.max_elements,
                                                                opts.normalize_input)
        self._bounded = self.min_elements is not None or self.max_elements is not None
        self._check_rules(model)
        # rows per forward: up to max_batch_size requests' rows; a row costs 1 (no token budget here)
        self.max_rows = max(self.max_batch_size, 1)
        self.max_tokens = 1 << 30
        self.max_padding = None

    def _check_batch_dimension(self, model: LoadedModel) -> None:
        """With max_batch_size > 0 every input needs a variable dimension 0 (ModelLoadError)."""
        if self.max_batch_size <= 0:
            return
        for t in model.graph.inputs:
            if not t.shape or (isinstance(t.shape[0], int) and t.shape[0] > 0):
                raise ModelLoadError(
                    f"model '{model.name}': max_batch_size is {self.max_batch_size} but input '{t.name}' has "
                    f"shape {list(t.shape)}, without a variable batch dimension 0; set max_batch_size: 0",
                    model=model.name)

    def _check_rules(self, model: LoadedModel) -> None:
        """min_elements <= max_elements, and minmax normalization only over float inputs (ModelLoadError)."""
        if self.min_elements is not None and self.max_elements is not None and self.min_elements > self.max_elements:
            raise ModelLoadError(f"model '{model.name}': min_elements ({self.min_elements}) is above max_elements "
                                 f"({self.max_elements})", model=model.name)
        if self.normalize == "minmax":
            odd = [t.name for t in model.graph.inputs if t.dtype not in ("float16", "float32", "float64")]
            if odd:
                raise ModelLoadError(f"model '{model.name}': normalize_input: minmax needs float inputs; "
                                     f"{', '.join(odd)} {'is' if len(odd) == 1 else 'are'} not", model=model.name)

    @property
    def batching(self) -> bool:
        """Dynamic batching along dimension 0 needs a batch dimension (`max_batch_size > 0`)."""
        return self.model.config.batching.enabled and self.max_batch_size > 0

    def describe(self) -> dict[str, Any]:
        g = self.model.graph
        rules = {k: v for k, v in (("min_elements", self.min_elements), ("max_elements", self.max_elements),
                                   ("normalize_input", self.normalize)) if v not in (None, "none")}
        return {"kind": "tensor", "max_batch_size": self.max_batch_size, "inputs": tensor_metadata(g.inputs),
                "outputs": tensor_metadata(g.outputs), **rules}

    # ------------------------------------------------------------ validation

    def signature(self) -> str:
        return ", ".join(f"{t.name} ({datatype_of(t.dtype)} {kserve_shape(t)})" for t in self.model.graph.inputs)

    def check_datatype(self, name: str, datatype: str) -> TensorInfo:
        """The graph input `name`, after checking the request's datatype for it."""
        info = self.inputs.get(name)
        if info is None:
            raise InputError(f"unknown input '{name}'; the model's inputs are {self.signature()}", param=name)
        want = datatype_of(info.dtype)
        if datatype != want:
            raise InputError(f"input '{name}' has datatype {datatype} but the model expects {want}", param=name)
        if datatype in UNSUPPORTED:
            raise InputError(f"input '{name}': {datatype} is not supported: {UNSUPPORTED[datatype]}", param=name)
        return info

    def check(self, tensors: Mapping[str, Array]) -> tuple[dict[str, Array], int | None]:
        """Inputs checked against the graph → (inputs with their batch dimension, the request's batch size or
        None when the request left the batch dimension out)."""
        if not self.inputs.keys() <= tensors.keys():
            missing = [n for n in self.inputs if n not in tensors]
            raise InputError(f"missing input(s) {', '.join(missing)}; the model's inputs are {self.signature()}",
                             param=missing[0])
        out: dict[str, Array] = {}
        batch: int | None = None
        unbatched = False
        for name, arr in tensors.items():
            if name not in self.inputs:
                raise InputError(f"unknown input '{name}'; the model's inputs are {self.signature()}", param=name)
            want = self._shapes[name]
            shape = arr.shape
            if self.max_batch_size > 0 and len(shape) == len(want) - 1:  # batch dimension left out: [1, ...]
                arr, unbatched = arr[None, ...], True
                shape = arr.shape
            if len(shape) != len(want):
                raise InputError(f"input '{name}' has shape {list(arr.shape)} (rank {len(arr.shape)}) but the model "
                                 f"expects rank {len(want)}: {want}", param=name)
            for k, exp in self._fixed[name]:
                if shape[k] != exp:
                    raise InputError(f"input '{name}' has shape {list(shape)} but dimension {k} must be {exp} "
                                     f"(the model expects {want})", param=name)
            if self.max_batch_size > 0:
                n = shape[0]
                if n > self.max_batch_size:
                    raise InputError(f"input '{name}' has batch size {n}; at most {self.max_batch_size} "
                                     "(max_batch_size)", param=name)
                if batch is not None and n != batch:
                    raise InputError(f"input '{name}' has batch size {n} but another input has {batch}; all inputs "
                                     "must agree on dimension 0", param=name)
                batch = n
            if self._bounded:
                self._check_elements(name, arr)
            out[name] = arr
        if unbatched and batch is not None and batch != 1:
            raise InputError("some inputs leave out the batch dimension and others do not", param=None)
        return out, (None if unbatched else batch)

    def _check_elements(self, name: str, arr: Array) -> None:
        """min_elements/max_elements: the elements of one row of the input (of the whole tensor without a batch)."""
        if self.min_elements is None and self.max_elements is None:
            return
        per_row = math.prod(arr.shape[1:]) if self.max_batch_size > 0 else arr.size
        lo, hi = self.min_elements, self.max_elements
        if (lo is not None and per_row < lo) or (hi is not None and per_row > hi):
            bounds = f"{lo if lo is not None else 0}..{hi if hi is not None else 'any'}"
            raise InputError(f"input '{name}' has {per_row} elements per row; this model takes {bounds} "
                             "(min_elements..max_elements)", param=name)

    # ------------------------------------------------------------ rows

    def plan(self, tensors: Mapping[str, Array], outputs: Sequence[str] | None = None) -> Work[TensorResult]:
        """Checked inputs → rows (one per batch entry, or the whole request), and how their outputs become the
        answer: the requested outputs (all by default), without the batch dimension if the request had none."""
        wanted = self.outputs
        if outputs:
            wanted = list(outputs)
            for name in wanted:
                if name not in self.outputs:
                    raise InputError(f"unknown output '{name}'; the model's outputs are {', '.join(self.outputs)}",
                                     param=name)
        feeds, batch = self.check(tensors)
        if self.normalize == "minmax":      # before the rows exist: the forward and the row cache see the same values
            feeds = {k: minmax_rows(v, self.max_batch_size > 0) for k, v in feeds.items()}
        timing = Timing()
        n = next(iter(feeds.values())).shape[0] if self.max_batch_size > 0 and feeds else 1
        if n > 1:
            rows: list[TensorRow] = [{k: v[i:i + 1] for k, v in feeds.items()} for i in range(n)]
        else:
            rows = [feeds]              # the whole request, or its one row

        def finish(per_row: list[Any]) -> TensorResult:
            if len(per_row) == 1 and wanted is self.outputs:     # one row, every output: its forward's own dict
                joined = per_row[0]
            else:
                joined = {k: (np.concatenate([r[k] for r in per_row], axis=0) if len(per_row) > 1 else per_row[0][k])
                          for k in wanted}
            if self.max_batch_size > 0 and batch is None:
                joined = {k: v[0] for k, v in joined.items()}  # answered without the batch dimension it lacked
            return TensorResult(joined, timing)

        return Work(rows, [1] * len(rows), finish, timing)

    def forward(self, session: Session, rows: Sequence[TensorRow]) -> list[Any]:
        """Rows whose non-batch dimensions agree run as one forward (concatenated along dimension 0); each row
        gets its slice of every output back."""
        if len(rows) == 1:          # one row (every direct request of a model without batching): one forward
            return [self.model.run(session, rows[0])]
        out: list[Any] = [None] * len(rows)
        groups: dict[Any, list[int]] = {}
        for i, row in enumerate(rows):
            key = tuple((k, v.shape[1:]) for k, v in row.items()) if self.max_batch_size > 0 else i
            groups.setdefault(key, []).append(i)
        for members in groups.values():
            if len(members) == 1:
                result = self.model.run(session, rows[members[0]])
                out[members[0]] = result
                continue
            feeds = {k: np.concatenate([rows[i][k] for i in members], axis=0) for k in rows[members[0]]}
            result = self.model.run(session, feeds)
            sizes = [next(iter(rows[i].values())).shape[0] for i in members]
            total = sum(sizes)
            for name, value in result.items():
                if value.ndim == 0 or value.shape[0] != total:
                    raise InferenceError(f"model '{self.model.name}': output '{name}' has shape {list(value.shape)}, "
                                         f"not batch-major for {total} rows; set max_batch_size: 0",
                                         model=self.model.name)
            start = 0
            for i, size in zip(members, sizes, strict=True):
                out[i] = {name: value[start:start + size] for name, value in result.items()}
                start += size
        return out

    def row_bytes(self, row: TensorRow) -> bytes:
        parts: list[bytes] = []
        for name in sorted(row):
            arr = row[name]
            head = f"{name}\0{arr.dtype.str}\0{arr.shape}\0".encode()
            if arr.dtype == object:
                body = b"".join(len(b).to_bytes(4, "little") + b for b in (str(x).encode() for x in arr.reshape(-1)))
            else:
                body = np.ascontiguousarray(arr).tobytes()
            parts += [len(head).to_bytes(4, "little"), head, len(body).to_bytes(8, "little"), body]
        return b"".join(parts)

    def sample_rows(self, batch: int, length: int,
                    shapes: dict[str, list[int]] | None = None) -> tuple[list[Any], list[int]]:
        """Random rows from the signature: an input's shape from `shapes` if given, else its variable
        dimensions other than the batch get `length`."""
        shapes = shapes or {}
        unknown = sorted(set(shapes) - set(self.inputs))
        if unknown:
            raise InputError(f"--shape: no input {', '.join(unknown)}; the model's inputs are {self.signature()}")
        dims = {str(d): length for t in self.model.graph.inputs for d in t.shape[1:] if isinstance(d, str)}
        base = sample_feeds(self.model.graph, dims)
        for name, shape in shapes.items():
            want = kserve_shape(self.inputs[name])
            given = [1, *shape[1:]] if self.max_batch_size > 0 else list(shape)
            if len(given) != len(want) or any(w >= 0 and g != w for g, w in zip(given, want, strict=True)):
                raise InputError(f"--shape {name}={','.join(map(str, shape))} does not fit the input's shape {want}")
            base[name] = np.zeros(given, dtype=base[name].dtype)
        rng = np.random.default_rng(0)
        row: TensorRow = {}
        for name, arr in base.items():
            if arr.dtype == object:
                row[name] = arr
            elif arr.dtype == np.bool_:
                row[name] = rng.integers(0, 2, arr.shape).astype(bool)
            else:
                row[name] = rng.random(arr.shape).astype(arr.dtype) if arr.dtype.kind == "f" else \
                    rng.integers(0, 8, arr.shape).astype(arr.dtype)
        if self.max_batch_size > 0:
            return [row] * batch, [1] * batch
        return [row], [1]


def quality(a: TensorPipeline, b: TensorPipeline, texts: Sequence[str]) -> dict[str, float]:
    """What b loses against a (the quality gate), on random inputs of the graph's signature (the texts are not
    used): the largest absolute and relative difference of any output element."""
    rows, costs = a.sample_rows(16, 16)
    abs_err = rel_err = 0.0
    for x, y in zip(a.forwards(rows, costs), b.forwards(rows, costs), strict=True):
        for name, value in x.items():
            va, vb = np.asarray(value, dtype=np.float64), np.asarray(y[name], dtype=np.float64)
            diff = np.abs(va - vb)
            abs_err = max(abs_err, float(diff.max(initial=0.0)))
            rel_err = max(rel_err, float((diff / np.maximum(np.abs(va), 1e-6)).max(initial=0.0)))
    return {"max_abs_error": abs_err, "max_rel_error": rel_err}
