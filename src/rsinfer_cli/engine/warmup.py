"""A model entry's `warmup:` (Triton's model_warmup): forwards on every replica after the load and before the model
is ready, so that the first request finds ORT's memory arena grown to the shapes it will see and its threads
started. Engine-level, on feeds built from the signature: every family gets it, none has to write a request.

The shapes: a text model's (a 2-D token input: batch × sequence) are the ones its requests make - one short text,
a full batch of short texts, one text of `max_len` tokens; a tensor model's are its `inputs:` when given, else the
signature's (a dynamic batch dimension: 1 and `max_batch_size`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from ..config import ModelConfig, WarmupConfig
from ..errors import ModelLoadError
from .session import Feeds, GraphInfo, Session, sample_feeds


class Warmed(Protocol):
    """What the warm-up reads of a loaded model (engine/model.LoadedModel, which calls it once loaded)."""

    @property
    def graph(self) -> GraphInfo: ...
    @property
    def config(self) -> ModelConfig: ...
    @property
    def kind(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def max_len(self) -> int | None: ...
    @property
    def sessions(self) -> Sequence[Session]: ...
    @property
    def wide(self) -> Session | None: ...

SHORT_TOKENS = 16        # a typical query
BATCH_ROWS = 32          # a full batch of them (capped by batching.max_rows)


def text_feeds(graph: GraphInfo, rows: int, tokens: int) -> Feeds:
    """Feeds of `rows` × `tokens` for a text model: a dynamic first dimension is the batch, a dynamic second the
    sequence (masks all ones - every position attended -, ids and types zeros)."""
    feeds = sample_feeds(graph)
    for t in graph.inputs:
        shape = list(feeds[t.name].shape)
        for axis, size in ((0, rows), (1, tokens)):
            if axis < len(shape) and axis < len(t.shape) and not isinstance(t.shape[axis], int):
                shape[axis] = size
        fill = np.ones if "mask" in t.name.lower() else np.zeros
        feeds[t.name] = fill(shape, dtype=feeds[t.name].dtype) if t.dtype != "string" else \
            np.full(shape, "", dtype=object)
    return feeds


def tensor_feeds(graph: GraphInfo, cfg: WarmupConfig, max_batch: int) -> list[tuple[str, Feeds]]:
    """The warm-up requests of a tensor model: its configured inputs, or zeros of the signature at batch 1 and,
    with a batch dimension, at `max_batch_size`."""
    if cfg.inputs:
        rng = np.random.default_rng(0)
        feeds = sample_feeds(graph)
        by_name = {t.name: t for t in graph.inputs}
        for name, spec in cfg.inputs.items():
            info = by_name.get(name)
            if info is None:
                raise ModelLoadError(f"warmup.inputs.{name}: the model has no input '{name}' (inputs: "
                                     f"{', '.join(by_name)})")
            _check_dims(name, info.shape, tuple(spec.dims), cfg.max_elements)
            feeds[name] = _values(info.dtype, tuple(spec.dims), spec.data, rng)
        shown = ", ".join(f"{n}{list(s.dims)}" for n, s in cfg.inputs.items())
        return [(shown, feeds)]
    out = [("batch 1", sample_feeds(graph, _batch_dims(graph, 1)))]
    if max_batch > 1:
        out.append((f"batch {max_batch}", sample_feeds(graph, _batch_dims(graph, max_batch))))
    return out


def _check_dims(name: str, shape: tuple[Any, ...], dims: tuple[int, ...], max_elements: int) -> None:
    """A warm-up input's dims against the graph's shape (its rank, its fixed sizes) and `warmup.max_elements`,
    before anything is allocated (ModelLoadError naming the key)."""
    where = f"warmup.inputs.{name}.dims"
    if shape and len(dims) != len(shape):
        raise ModelLoadError(f"{where}: {list(dims)} has {len(dims)} dimensions; the input has {len(shape)} "
                             f"({list(shape)})")
    for i, (want, got) in enumerate(zip(shape, dims, strict=False)):
        if isinstance(want, int) and want >= 0 and want != got:
            raise ModelLoadError(f"{where}[{i}]: {got}, but the input's dimension {i} is fixed at {want} "
                                 f"({list(shape)})")
    elements = int(np.prod(dims, dtype=np.float64))
    if elements > max_elements:
        raise ModelLoadError(f"{where}: {list(dims)} is {elements:,} elements; at most {max_elements:,} "
                             "(warmup.max_elements)")


def _batch_dims(graph: GraphInfo, rows: int) -> dict[str, int]:
    return {t.shape[0]: rows for t in graph.inputs if t.shape and isinstance(t.shape[0], str)}


def _values(dtype: str, shape: tuple[int, ...], data: str, rng: np.random.Generator) -> np.ndarray:
    if dtype == "string":
        return np.full(shape, "" if data == "zero" else "warmup", dtype=object)
    np_type = np.dtype(dtype if dtype != "bfloat16" else "float32")
    if data == "zero":
        return np.zeros(shape, dtype=np_type)
    if np_type.kind == "f":
        return rng.random(shape).astype(np_type)
    if np_type.kind == "b":
        return rng.integers(0, 2, shape).astype(np_type)
    return rng.integers(0, 100, shape).astype(np_type)


def warm(model: Warmed, cfg: WarmupConfig) -> dict[str, Any]:
    """The warm-up forwards, `cfg.requests` times per shape on every session (the latency lane's too); what ran,
    for `inspect` and /v1/models. A forward that fails is a load error naming the shape."""
    graph = model.graph
    text = any(len(t.shape) == 2 and t.dtype.startswith("int") for t in graph.inputs) and model.kind != "tensor"
    if text:
        rows = max(1, min(BATCH_ROWS, model.config.batching.max_rows))
        longest = model.max_len or 512
        shapes = [(f"{r}x{n}", text_feeds(graph, r, n)) for r, n in
                  dict.fromkeys([(1, SHORT_TOKENS), (rows, SHORT_TOKENS), (1, longest)])]
    else:
        shapes = tensor_feeds(graph, cfg, model.config.max_batch_size)
    sessions = list({id(s): s for s in [*model.sessions, *([model.wide] if model.wide is not None else [])]}.values())
    t0 = time.perf_counter()
    for shown, feeds in shapes:
        for session in sessions:
            for _ in range(cfg.requests):
                try:
                    session.run([graph.outputs[0].name], feeds)
                except Exception as exc:  # noqa: BLE001 - ORT raises untyped errors
                    raise ModelLoadError(f"model '{model.name}': warm-up forward ({shown}) failed: {exc}",
                                         model=model.name) from exc
    return {"requests": cfg.requests, "shapes": [s for s, _ in shapes], "sessions": len(sessions),
            "forwards": cfg.requests * len(shapes) * len(sessions), "seconds": round(time.perf_counter() - t0, 3)}
