"""Per-request cost of reading a request body: the hand-written reader (orjson + typed field access), pydantic v2
(`model_validate_json`) and msgspec (`msgspec.json.decode` into a Struct), on the same bodies, in one run.

    .venv/bin/python benchmarks/parsing.py        # appends a section to benchmarks/RESULTS.md (needs msgspec)
"""

from __future__ import annotations

import json
import sys
import timeit
from pathlib import Path

import msgspec
from _serve import append_results
from batching import ROOT, machine

from rsinfer_cli.jsonio import loads
from rsinfer_cli.server.request import Body, text_or_token_input
from rsinfer_cli.server.schemas import EmbeddingsRequest, RerankRequest


class EmbeddingsStruct(msgspec.Struct, forbid_unknown_fields=False):
    # msgspec refuses a union of several list types (OpenAI's untagged `input`): the closest it takes, and the
    # rest would still be checked by hand
    input: str | list[str | int | list[int]]
    model: str | None = None
    encoding_format: str = "float"
    dimensions: int | None = None
    truncate: bool | None = None


class RerankStruct(msgspec.Struct, forbid_unknown_fields=False):
    query: str
    documents: list[str | dict]
    model: str | None = None
    top_n: int | None = None
    return_documents: bool = True


def hand_embeddings(raw: bytes) -> object:
    body = Body(loads(raw))
    text_or_token_input(body.data.get("input"), "input")
    return (body.str("model", None), body.str("encoding_format", "float"), body.int("dimensions", None),
            body.bool("truncate", None))


def hand_rerank(raw: bytes) -> object:
    body = Body(loads(raw))
    docs = body.data.get("documents")
    assert isinstance(docs, list) and all(isinstance(d, (str, dict)) for d in docs)
    return body.str("query"), body.str("model", None), body.int("top_n", None), body.bool("return_documents", True)


def per_call_us(fn, raw: bytes, n: int) -> float:
    fn(raw)
    return min(timeit.repeat(lambda: fn(raw), number=n, repeat=5)) / n * 1e6


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "RESULTS.md"
    bodies = {
        "embeddings, 1 short text": (json.dumps({"model": "mini", "input": "where is my parcel"}).encode(),
                                     hand_embeddings, EmbeddingsRequest, EmbeddingsStruct),
        "embeddings, 16 texts": (json.dumps({"model": "mini", "input": ["a sentence about parcels"] * 16,
                                             "encoding_format": "float"}).encode(),
                                 hand_embeddings, EmbeddingsRequest, EmbeddingsStruct),
        "rerank, 1 query x 20 docs": (json.dumps({"model": "rr", "query": "where is my parcel",
                                                  "documents": ["it shipped on monday"] * 20, "top_n": 5}).encode(),
                                      hand_rerank, RerankRequest, RerankStruct),
    }
    lines = ["", "## Request parsing: hand-written vs pydantic vs msgspec (per request, in-process)", "",
             f"Machine: {machine()}. Reproduce: `.venv/bin/python benchmarks/parsing.py`. Best of 5 x 20,000 "
             "parses; µs per request body (lower is better).", "",
             "| body | hand-written (orjson + Body) | pydantic v2 | msgspec |", "|---|---|---|---|"]
    for name, (raw, hand, model, struct) in bodies.items():
        decoder = msgspec.json.Decoder(struct)
        h = per_call_us(hand, raw, 20_000)
        p = per_call_us(model.model_validate_json, raw, 20_000)
        m = per_call_us(decoder.decode, raw, 20_000)
        lines.append(f"| {name} | {h:.2f} | {p:.2f} ({p / h:.2f}x) | {m:.2f} ({m / h:.2f}x) |")
    return append_results(out, [*lines, ""])


if __name__ == "__main__":
    sys.exit(main())
