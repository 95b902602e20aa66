"""What every pipeline shares. A request becomes `Work`: rows (whatever the family makes of it), a cost per row
(padded tokens it adds to a forward), and a `finish` that turns the rows' outputs into the answer. The rows run
either through the model's scheduler (the server) or here on one replica in length-sorted forwards (the CLI);
either way the family's `forward` collates rows into feeds, runs them and splits the outputs back."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from ..engine.cache import decode_value, encode_value, model_identity, row_key
from ..engine.model import LoadedModel
from ..engine.scheduler import Runner, run_rows
from ..engine.session import Session
from ..errors import ModelLoadError

T = TypeVar("T")
Array = npt.NDArray[Any]

LOGIT_OUTPUTS = ("logits", "output0", "output", "scores")


class Timing:
    """One request's usage and tokenize time; the server turns it into metrics and headers. A plain class whose
    fields are class attributes (zero): making one (every request's plan does) is no Python call."""

    tokenize_s: float = 0.0
    tokens: int = 0
    truncated: int = 0


@dataclass
class Work(Generic[T]):
    """One request's rows and how their outputs (one per row, in row order) become its answer."""

    rows: Sequence[Any]
    costs: Sequence[int]
    finish: Callable[[list[Any]], T]
    timing: Timing = field(default_factory=Timing)


class Timed:
    """Usage numbers of a result, read from its timing record (`timing` is a field of each result)."""

    timing: Timing

    @property
    def tokens(self) -> int:
        return self.timing.tokens

    @property
    def truncated(self) -> int:
        return self.timing.truncated


class RowPipeline:
    """A family's pipeline over one loaded model: requests decompose into independent rows."""

    kind = ""

    def __init__(self, model: LoadedModel) -> None:
        self.model = model
        self.max_rows = model.config.batching.max_rows
        self.max_tokens = model.max_tokens
        self.max_padding = model.max_padding

    @property
    def batching(self) -> bool:
        """Whether rows of concurrent requests may share forwards (`batching.enabled`)."""
        return self.model.config.batching.enabled

    def forward(self, session: Session, rows: Sequence[Any]) -> list[Any]:
        """Rows (possibly of several requests) → one output per row, on `session` (a worker thread)."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def output_shape(self, name: str) -> tuple[int | str | None, ...]:
        info = self.model.graph.output(name)
        assert info is not None, name
        return info.shape

    def sample_rows(self, batch: int, length: int,
                    shapes: dict[str, list[int]] | None = None) -> tuple[list[Any], list[int]]:
        """`batch` rows of `length` (tokens, or the family's unit) for `rsinfer bench`; `shapes`: input shapes
        where the family's inputs are tensors."""
        raise NotImplementedError

    def runner(self) -> Runner:
        """Forwards on the first replica, unobserved: the CLI's one-shot path."""
        return Runner(self.model.sessions[0], self.forward)

    def run(self, work: Work[T], runner: Runner | None = None) -> T:
        """The direct path: the work's rows on one replica (`runner`; else the first, unobserved), then its answer.
        No cache: requests with one come through the inference core (runtime/core.py)."""
        return work.finish(self.forwards(work.rows, work.costs, runner))

    def forwards(self, rows: Sequence[Any], costs: Sequence[int], runner: Runner | None = None) -> list[Any]:
        """Rows on one replica in length-sorted forwards of this model's batch limits; one output per row."""
        return run_rows(runner or self.runner(), rows, costs, max_rows=self.max_rows, max_tokens=self.max_tokens,
                        max_padding=self.max_padding)

    # ------------------------------------------------------------ the row cache

    _identity: bytes | None = None

    def row_bytes(self, row: Any) -> bytes:
        """What the model sees of a row, as bytes (for its cache key)."""
        raise NotImplementedError

    def identity(self) -> bytes:
        """The model and what this pipeline does to its outputs: the first half of every row key."""
        if self._identity is None:
            import json

            self._identity = model_identity(self.model.name, self.model.version, graph_digest(self.model),
                                            json.dumps(self.describe(), sort_keys=True, default=str))
        return self._identity

    def row_keys(self, work: Work[Any]) -> list[bytes]:
        ident = self.identity()
        return [row_key(ident, self.row_bytes(r)) for r in work.rows]


def graph_digest(model: LoadedModel) -> str:
    """BLAKE2b of the graph file (and its external data), computed once per loaded model."""
    digest = model.stats.get("graph_digest")
    if digest is None:
        h = hashlib.blake2b(digest_size=16)
        path = model.resolved.graph_path
        for p in [path, *(path.parent / Path(rel).name for rel in model.resolved.external_data)]:
            with open(p, "rb") as f:
                while block := f.read(1 << 20):
                    h.update(block)
        digest = model.stats["graph_digest"] = h.hexdigest()
    return str(digest)


class Cached:
    """A work's rows split by the cache: the missing ones to run (a row repeated within the request runs once),
    and how to put the answer back together."""

    def __init__(self, work: Work[Any], found: Sequence[bytes | None], keys: Sequence[bytes]) -> None:
        self.outputs: list[Any] = []
        for raw in found:
            try:
                self.outputs.append(decode_value(raw) if raw is not None else None)
            except (ValueError, struct.error):
                self.outputs.append(None)  # an unreadable entry is a miss
        first: dict[bytes, int] = {}
        self.copies: dict[int, list[int]] = {}   # a row to run → the other positions with the same key
        self.misses = 0
        for i, out in enumerate(self.outputs):
            if out is None:
                self.misses += 1
                if keys[i] in first:
                    self.copies.setdefault(first[keys[i]], []).append(i)
                else:
                    first[keys[i]] = i
        self.missing = list(first.values())
        self.rows = [work.rows[i] for i in self.missing]
        self.costs = [work.costs[i] for i in self.missing]

    @property
    def status(self) -> str:
        return "miss" if self.misses == len(self.outputs) else "partial" if self.misses else "hit"

    def merge(self, outs: Sequence[Any]) -> list[Any]:
        merged = list(self.outputs)
        for i, out in zip(self.missing, outs, strict=True):
            merged[i] = out
            for j in self.copies.get(i, ()):
                merged[j] = out
        return merged

    def entries(self, keys: Sequence[bytes], outs: Sequence[Any]) -> list[tuple[bytes, bytes]]:
        """(key, value) of each computed row that can be cached."""
        items = []
        for i, out in zip(self.missing, outs, strict=True):
            value = encode_value(out)
            if value is not None:
                items.append((keys[i], value))
        return items


# ---------------------------------------------------------------- shared numerics and config readers


def softmax(x: Array, axis: int = -1) -> Array:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    out: Array = e / e.sum(axis=axis, keepdims=True)
    return out


def sigmoid(x: Array) -> Array:
    out: Array = 1.0 / (1.0 + np.exp(-x))
    return out


def last_token_index(mask: Array) -> Array:
    """Each row's last real token under right padding."""
    out: Array = np.maximum(mask.sum(axis=1) - 1, 0)
    return out


def stack(outputs: list[Any], width: int) -> Array:
    """Per-row outputs as one [n, width] array (an empty request gives [0, width])."""
    return np.stack(outputs) if outputs else np.empty((0, width))


def pick_output(model: LoadedModel, preferred: Sequence[str]) -> str:
    names = [o.name for o in model.graph.outputs]
    return next((n for n in preferred if n in names), names[0])


def id2label(model: LoadedModel) -> list[str]:
    """config.json `id2label` as a list by index; ModelLoadError when missing, not integer-keyed or gapped."""
    raw: Mapping[Any, Any] | None = model.hf_config.get("id2label")
    name = model.name
    if not isinstance(raw, dict) or not raw:
        raise ModelLoadError(f"model '{name}': config.json must contain id2label for a {model.kind} model",
                             model=name)
    try:
        keyed = {int(k): str(v) for k, v in raw.items()}
    except (TypeError, ValueError):
        raise ModelLoadError(f"model '{name}': config.json id2label keys must be integers, got "
                             f"{sorted(map(str, raw))}", model=name) from None
    if sorted(keyed) != list(range(len(keyed))):
        raise ModelLoadError(f"model '{name}': config.json id2label keys must be 0..{len(keyed) - 1}, got "
                             f"{sorted(keyed)}", model=name)
    return [keyed[i] for i in range(len(keyed))]
