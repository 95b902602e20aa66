"""Embedding: forward → (pooling) → model `dimensions` → L2 normalise → request `dimensions`."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import ServerConfig, opt
from ..engine.model import LoadedModel
from ..errors import InputError, ModelLoadError
from .base import Array, Timed, Timing, Work, last_token_index, stack
from .text import Encoded, TextPipeline

OUTPUT_ORDER = ("sentence_embedding", "_pooler_output", "pooler_output", "last_hidden_state",
                "token_embeddings", "output0")


def pooling_from_config(pooling_cfg: dict[str, Any]) -> tuple[str, str]:
    """(mode, why) from sentence-transformers' 1_Pooling/config.json."""
    if not pooling_cfg:
        return "mean", "no 1_Pooling/config.json: masked mean"
    if pooling_cfg.get("pooling_mode_cls_token"):
        return "cls", "1_Pooling/config.json pooling_mode_cls_token"
    if pooling_cfg.get("pooling_mode_lasttoken"):
        return "last", "1_Pooling/config.json pooling_mode_lasttoken"
    for flag in ("pooling_mode_mean_tokens", "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_max_tokens"):
        if pooling_cfg.get(flag):
            return "mean", f"1_Pooling/config.json {flag}" + ("" if flag.endswith("mean_tokens") else
                                                               " (approximated by mean)")
    return "mean", "1_Pooling/config.json sets no mode: masked mean"


def pool(hidden: Array, mask: Array, mode: str) -> Array:
    """[B,T,D] → [B,D] by cls, masked mean, or each row's last real token (right padding)."""
    if mode == "cls":
        out: Array = hidden[:, 0]
    elif mode == "last":
        out = hidden[np.arange(hidden.shape[0]), last_token_index(mask)]
    else:
        m = mask[:, :, None].astype(hidden.dtype)
        out = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1.0)
    return out


def l2_normalize(v: Array) -> Array:
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    out: Array = v / np.where(norms == 0, 1.0, norms)
    return out


@dataclass
class EmbedResult(Timed):
    vectors: Array           # [n, d] float32, in input order
    timing: Timing           # tokens (usage), truncated rows, stage times


@dataclass(frozen=True)
class EmbeddingOptions:
    """The embedding family's model keys."""

    # auto: from 1_Pooling/config.json (else mean); cls, mean or last token
    pooling: str = opt("auto", choices=("auto", "cls", "mean", "last"))
    # unit-length vectors (a request's `normalize` overrides)
    normalize: bool = True
    # keep the first N dimensions (Matryoshka), then normalize; a request's `dimensions` overrides
    dimensions: int | None = opt(None, gt=0)
    # whether the graph pools is seen from its output ([B, D] is pooled); when given, it is checked against that and
    # a model whose output says otherwise fails to load
    pooling_in_graph: bool | None = None


class EmbeddingPipeline(TextPipeline):
    kind = "embedding"

    def __init__(self, model: LoadedModel, server: ServerConfig | None = None) -> None:
        super().__init__(model, server)
        cfg = model.config
        opts: EmbeddingOptions = cfg.options
        names = [o.name for o in model.graph.outputs]
        self.output = next((n for n in OUTPUT_ORDER if n in names), names[0])
        info = model.graph.output(self.output)
        assert info is not None
        self.pooled_in_graph = len(info.shape) == 2
        if len(info.shape) not in (2, 3):
            raise ModelLoadError(f"model '{cfg.name}': embedding output '{self.output}' has shape "
                                 f"{list(info.shape)}; expected [batch, dim] or [batch, seq, dim]", model=cfg.name)
        if opts.pooling_in_graph is not None and opts.pooling_in_graph != self.pooled_in_graph:
            raise ModelLoadError(
                f"model '{cfg.name}': pooling_in_graph is {str(opts.pooling_in_graph).lower()} but the graph's output "
                f"'{self.output}' has shape {list(info.shape)}, "
                f"{'[batch, dim]: already pooled' if self.pooled_in_graph else '[batch, seq, dim]: not pooled'}; "
                "remove the key (rsinfer sees from the output whether the graph pools) or fix the model",
                model=cfg.name)
        if opts.pooling != "auto":
            self.pooling, self.pooling_reason = opts.pooling, "pooling in config"
        else:
            self.pooling, self.pooling_reason = pooling_from_config(model.aux.get("1_Pooling/config.json", {}))
        if self.pooled_in_graph:
            self.pooling_reason = f"output '{self.output}' is already pooled"
        d = info.shape[-1]
        self.native_dim = d if isinstance(d, int) else None
        self.dim: int | None = min(opts.dimensions, d) if opts.dimensions and isinstance(d, int) else (
            opts.dimensions or self.native_dim)
        self.normalize = opts.normalize
        self.vocab_size: int = self.encoder.tokenizer.get_vocab_size(with_added_tokens=True)

    def describe(self) -> dict[str, Any]:
        return {"kind": "embedding", "output": self.output,
                "pooling": None if self.pooled_in_graph else self.pooling, "pooling_reason": self.pooling_reason,
                "dimensions": self.dim, "normalize": self.normalize}

    # ------------------------------------------------------------ rows

    def encode(self, texts: Sequence[str], truncate: bool | None = None, direction: str = "right",
               param: str = "input") -> Encoded:
        return self.encoder.encode(texts, truncate=truncate, direction=direction, param=param)

    def encode_ids(self, rows: Sequence[Sequence[int]], truncate: bool | None = None,
                   param: str = "input") -> Encoded:
        """Token-id input: ids used verbatim, checked against the vocabulary, held to max_len."""
        max_len = self.model.max_len
        allow_cut = self.model.config.truncate if truncate is None else truncate
        out: list[list[int]] = []
        cut = 0
        for i, row in enumerate(rows):
            bad = next((t for t in row if not 0 <= t < self.vocab_size), None)
            if bad is not None:
                raise InputError(f"{param}[{i}] has token id {bad} outside the vocabulary (0..{self.vocab_size - 1})",
                                 param=f"{param}[{i}]")
            if not row:
                raise InputError(f"{param}[{i}] is an empty token list", param=f"{param}[{i}]")
            if max_len and len(row) > max_len:
                if not allow_cut:
                    raise InputError(f"{param}[{i}] has {len(row)} tokens but max_len is {max_len}; shorten it "
                                     "or allow truncation", param=f"{param}[{i}]")
                row, cut = row[:max_len], cut + 1
            out.append(list(row))
        return Encoded(ids=out, type_ids=[[0] * len(r) for r in out], truncated=cut)

    def reduce(self, out: Array, mask: Array) -> Array:
        """One forward's output → pooled [n, D] float32 (before normalisation)."""
        out = np.asarray(out, dtype=np.float32)
        return out if self.pooled_in_graph else pool(out, mask, self.pooling)

    def check_dimensions(self, dimensions: int | None) -> None:
        """A request's `dimensions` must be 1..the model's output size (checked before any work)."""
        if dimensions is not None and not 0 < dimensions <= (self.dim or 1 << 30):
            raise InputError(f"`dimensions` must be between 1 and {self.dim} for model '{self.model.name}', "
                             f"got {dimensions}", param="dimensions")

    def postprocess(self, vectors: Array, dimensions: int | None = None, normalize: bool | None = None) -> Array:
        """Model `dimensions` → L2 normalise (model setting unless the request says) → request `dimensions`."""
        cfg_dim = self.model.config.options.dimensions
        if cfg_dim and cfg_dim < vectors.shape[1]:
            vectors = vectors[:, :cfg_dim]
        if self.normalize if normalize is None else normalize:
            vectors = l2_normalize(vectors)
        if dimensions is not None:
            if dimensions <= 0 or dimensions > vectors.shape[1]:
                raise InputError(f"`dimensions` must be between 1 and {vectors.shape[1]} for model "
                                 f"'{self.model.name}', got {dimensions}", param="dimensions")
            if dimensions < vectors.shape[1]:
                vectors = l2_normalize(vectors[:, :dimensions])
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def plan(self, texts: Sequence[str] | None = None, ids: Sequence[Sequence[int]] | None = None, *,
             dimensions: int | None = None, normalize: bool | None = None, truncate: bool | None = None,
             direction: str = "right", param: str = "input") -> Work[EmbedResult]:
        """Texts (or token-id rows) → rows, and how pooled rows become vectors in input order."""
        self.check_dimensions(dimensions)
        timing = Timing()
        t0 = time.perf_counter()
        if texts is not None:
            enc = self.encode(texts, truncate=truncate, direction=direction, param=param)
        else:
            enc = self.encode_ids(ids or [], truncate=truncate, param=param)
        timing.tokenize_s = time.perf_counter() - t0
        width = self.native_dim or 0

        def finish(pooled: list[Any]) -> EmbedResult:
            return EmbedResult(self.postprocess(stack(pooled, width).astype(np.float32), dimensions, normalize),
                               timing)

        return self.work(enc, finish, timing)

    def embed(self, texts: Sequence[str] | None = None, ids: Sequence[Sequence[int]] | None = None, *,
              dimensions: int | None = None, normalize: bool | None = None, truncate: bool | None = None,
              direction: str = "right", param: str = "input") -> EmbedResult:
        """Texts (or token-id rows) → vectors in input order, with usage and timing."""
        return self.run(self.plan(texts, ids, dimensions=dimensions, normalize=normalize, truncate=truncate,
                                  direction=direction, param=param))


EMBEDDING_TYPES = ("float", "int8", "uint8", "binary", "ubinary", "base64")


def embedding_types(vectors: Array, types: Sequence[str]) -> dict[str, Any]:
    """Cohere's `embedding_types` of unit vectors: float lists; int8 = round(127·v); uint8 = round(127.5·(v + 1));
    binary / ubinary = one bit per dimension (v > 0), packed 8 to a byte as signed / unsigned integers; base64 =
    little-endian float32 bytes."""
    import base64

    out: dict[str, Any] = {}
    for t in types:
        if t == "float":
            out[t] = vectors.astype(np.float32).tolist()
        elif t == "int8":
            out[t] = np.clip(np.rint(vectors * 127), -128, 127).astype(np.int64).tolist()
        elif t == "uint8":
            out[t] = np.clip(np.rint((vectors + 1) * 127.5), 0, 255).astype(np.int64).tolist()
        elif t in ("binary", "ubinary"):
            packed = np.packbits(vectors > 0, axis=1).astype(np.int64)
            out[t] = (packed - 128 if t == "binary" else packed).tolist()
        elif t == "base64":
            le = vectors.astype("<f4")
            out[t] = [base64.b64encode(row.tobytes()).decode("ascii") for row in le]
        else:
            raise InputError(f"unknown embedding type '{t}' (one of {', '.join(EMBEDDING_TYPES)})",
                             param="embedding_types")
    return out
