"""Compact dense vectors: int8, uint8, binary and ubinary, exactly as sentence-transformers' `quantize_embeddings`
makes them, with ranges that do not depend on the batch.

- binary / ubinary: one bit per dimension (v > 0), packed 8 to a byte, most significant first (`np.packbits`);
  binary is each byte - 128 as int8, ubinary the byte. A vector of d dimensions is ceil(d / 8) bytes.
- int8 / uint8: per dimension, `starts = ranges[0]`, `steps = (ranges[1] - ranges[0]) / 255` (1 where that is 0),
  in float32; uint8 = `floor((v - starts) / steps)` clipped to [0, 255], int8 = that - 128 (sentence-transformers
  6.3's rule: a value outside the ranges saturates at the bound). sentence-transformers
  takes the ranges from the batch itself when none are given, so a vector would change with its neighbours; rsinfer
  takes them from the model: [-1, 1] on every dimension (unit vectors lie there), or the per-dimension minimum and
  maximum of a calibration set (`quantization_calibration`: a .npy of the model's float vectors, as
  sentence-transformers' `calibration_embeddings`).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from .base import Array

TYPES = ("float", "int8", "uint8", "binary", "ubinary")
NUMPY = {"int8": np.int8, "uint8": np.uint8, "binary": np.int8, "ubinary": np.uint8}


@dataclass(frozen=True)
class Ranges:
    """Per dimension, the float that maps to the type's lowest integer and the width of one step (float32, as
    sentence-transformers computes them from float32 vectors)."""

    starts: Array
    steps: Array
    source: str

    @classmethod
    def of(cls, lo: Array, hi: Array, source: str) -> Ranges:
        lo, hi = lo.astype(np.float32), hi.astype(np.float32)
        steps = (hi - lo) / 255
        return cls(lo, np.where(steps == 0, np.float32(1), steps).astype(np.float32), source)

    @classmethod
    def unit(cls, dim: int) -> Ranges:
        return cls.of(np.full(dim, -1.0), np.full(dim, 1.0), "[-1, 1] on every dimension")

    @classmethod
    def calibrated(cls, vectors: Array, source: str) -> Ranges:
        return cls.of(vectors.min(axis=0), vectors.max(axis=0), source)

    @classmethod
    def load(cls, path: Path, dim: int | None) -> Ranges:
        """The ranges of a calibration file: a .npy of float vectors [n, dim] (ValueError saying what is wrong)."""
        try:
            vectors = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read {path} as a .npy of float vectors: {exc}") from None
        if vectors.ndim != 2 or not np.issubdtype(vectors.dtype, np.floating) or len(vectors) < 2:
            raise ValueError(f"{path}: expected float vectors [n >= 2, dim], got {vectors.dtype} {list(vectors.shape)}")
        if dim is not None and vectors.shape[1] != dim:
            raise ValueError(f"{path}: vectors of {vectors.shape[1]} dimensions; the model's are {dim}")
        return cls.calibrated(vectors.astype(np.float32), f"calibrated on {len(vectors)} vectors ({path.name})")


def quantize(vectors: Array, dtype: str, ranges: Ranges | None = None) -> Array:
    """float32 vectors [n, d] as `dtype` (TYPES): float unchanged, the rest as sentence-transformers'
    quantize_embeddings with these ranges (default: [-1, 1])."""
    if dtype == "float":
        out: Array = vectors.astype(np.float32, copy=False)
        return out
    if dtype in ("binary", "ubinary"):
        packed = np.packbits(vectors > 0, axis=-1)
        return (packed.astype(np.int16) - 128).astype(np.int8) if dtype == "binary" else packed
    if dtype not in ("int8", "uint8"):
        raise InputError(f"unknown embedding type '{dtype}' (one of {', '.join(TYPES)})", param="embedding_types")
    r = ranges if ranges is not None else Ranges.unit(vectors.shape[-1])
    if len(r.starts) != vectors.shape[-1]:
        raise InputError(f"the model's quantisation ranges are for {len(r.starts)} dimensions, not "
                         f"{vectors.shape[-1]}: ask for int8/uint8 at the full width", param="dimensions")
    q = np.clip(np.floor((vectors.astype(np.float32, copy=False) - r.starts) / r.steps), 0, 255)
    return (q - 128).astype(np.int8) if dtype == "int8" else q.astype(np.uint8)


def packed_base64(values: Array) -> list[str]:
    """Each row's bytes (int8/uint8 as they are; float as little-endian float32), base64."""
    rows = values.astype("<f4") if values.dtype.kind == "f" else values
    return [base64.b64encode(np.ascontiguousarray(row).tobytes()).decode("ascii") for row in rows]


def as_json(values: Array) -> Any:
    """A type's rows as JSON numbers: floats as float32 arrays (the encoder writes them), integers as Python ints."""
    return list(values) if values.dtype.kind == "f" else values.astype(np.int64).tolist()


def by_type(vectors: Array, types: Sequence[str], ranges: Ranges | None) -> dict[str, Any]:
    """Cohere's `embedding_types`: each asked type's rows; `base64` is the float32 bytes, as Cohere gives it."""
    out: dict[str, Any] = {}
    for t in types:
        out[t] = packed_base64(vectors) if t == "base64" else as_json(quantize(vectors, t, ranges))
    return out
