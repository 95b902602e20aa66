"""Per-request cost of reading a request body: the hand-written reader rsinfer had (orjson + typed field access,
reproduced here), pydantic v2 (`model_validate_json`, models defined here) and msgspec as the server now decodes
(`routes.common.decode` into the Structs of `server/schemas.py`), on the same bodies, in one run.

    .venv/bin/python benchmarks/parsing.py        # its section of benchmarks/RESULTS.md (needs pydantic)
"""

from __future__ import annotations

import json
import sys
import timeit
from pathlib import Path
from typing import Any, Literal

from _serve import write_results
from batching import ROOT, machine
from pydantic import BaseModel, Field

from rsinfer_cli.jsonio import loads
from rsinfer_cli.server.request import text_or_token_input
from rsinfer_cli.server.routes.common import decode
from rsinfer_cli.server.schemas import EmbeddingsRequest, RerankRequest


class PydEmbeddings(BaseModel):
    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: int | None = Field(None, ge=1)
    truncate: bool | None = None


class PydRerank(BaseModel):
    query: str
    documents: list[str | dict[str, Any]] | None = None
    model: str | None = None
    top_n: int | None = Field(None, ge=0)
    return_documents: bool | None = None


def _field(data: dict[str, Any], key: str, kind: type) -> Any:
    value = data.get(key)
    if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
        raise ValueError(key)
    return value


def hand_embeddings(raw: bytes) -> object:
    data = loads(raw)
    text_or_token_input(data.get("input"), "input")
    return (_field(data, "model", str), _field(data, "encoding_format", str), _field(data, "dimensions", int),
            _field(data, "truncate", bool))


def hand_rerank(raw: bytes) -> object:
    data = loads(raw)
    docs = data.get("documents")
    assert isinstance(docs, list) and all(isinstance(d, (str, dict)) for d in docs)
    return (_field(data, "query", str), _field(data, "model", str), _field(data, "top_n", int),
            _field(data, "return_documents", bool))


def per_call_us(fn, raw: bytes, n: int) -> float:
    fn(raw)
    return min(timeit.repeat(lambda: fn(raw), number=n, repeat=5)) / n * 1e6


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "RESULTS.md"
    bodies = {
        "embeddings, 1 short text": (json.dumps({"model": "mini", "input": "where is my parcel"}).encode(),
                                     hand_embeddings, PydEmbeddings, EmbeddingsRequest),
        "embeddings, 16 texts": (json.dumps({"model": "mini", "input": ["a sentence about parcels"] * 16,
                                             "encoding_format": "float"}).encode(),
                                 hand_embeddings, PydEmbeddings, EmbeddingsRequest),
        "rerank, 1 query x 20 docs": (json.dumps({"model": "rr", "query": "where is my parcel",
                                                  "documents": ["it shipped on monday"] * 20, "top_n": 5}).encode(),
                                      hand_rerank, PydRerank, RerankRequest),
    }
    lines = ["", "## Request parsing: hand-written vs pydantic vs msgspec (`parsing.py`)", "",
             f"Machine: {machine()}. Reproduce: `.venv/bin/python benchmarks/parsing.py`. Best of 5 x 20,000 "
             "parses; µs per request body (lower is better).", "",
             "| body | hand-written (orjson + field checks) | pydantic v2 | msgspec (the server's decode) |",
             "|---|---|---|---|"]
    for name, (raw, hand, model, struct) in bodies.items():
        h = per_call_us(hand, raw, 20_000)
        p = per_call_us(model.model_validate_json, raw, 20_000)
        if struct is EmbeddingsRequest:  # the server also checks the untagged `input` items by hand
            m = per_call_us(lambda r, s=struct: text_or_token_input(decode(r, s).input, "input"), raw, 20_000)
        else:
            m = per_call_us(lambda r, s=struct: decode(r, s), raw, 20_000)
        lines.append(f"| {name} | {h:.2f} | {p:.2f} ({p / h:.2f}x) | {m:.2f} ({m / h:.2f}x) |")
    return write_results(out, [*lines, ""])


if __name__ == "__main__":
    sys.exit(main())
