"""The KServe v2 tensor wire vocabulary every floor may speak: datatypes and their numpy dtypes, element counts.
The tensor family's pipeline checks requests in it; the REST and gRPC codecs encode and decode in it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

# KServe v2 datatype ↔ the numpy dtype onnxruntime feeds and returns (BYTES = ORT string tensors)
DATATYPES: dict[str, str] = {
    "BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
    "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64",
    "FP16": "float16", "FP32": "float32", "FP64": "float64", "BYTES": "string", "BF16": "bfloat16",
}
BY_DTYPE = {v: k for k, v in DATATYPES.items()}
UNSUPPORTED = {"BF16": "onnxruntime's Python API has no bfloat16 arrays; export the graph with FP16 or FP32 inputs"}


def datatype_of(dtype: str) -> str:
    """The KServe datatype of a graph dtype (numpy-style name, `string` for ORT strings)."""
    return BY_DTYPE.get(dtype, dtype.upper())


def numpy_dtype(datatype: str) -> np.dtype[Any]:
    dtype = _NUMPY.get(datatype)
    return dtype if dtype is not None else np.dtype(DATATYPES[datatype])   # BF16: numpy's own TypeError


# each KServe datatype's numpy dtype, made once (not an np.dtype(name) per tensor of every request); not BF16
_NUMPY: dict[str, np.dtype[Any]] = {k: np.dtype(object) if k == "BYTES" else np.dtype(v) for k, v in DATATYPES.items()
                                    if k not in UNSUPPORTED}


def element_count(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1
