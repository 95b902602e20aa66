"""Per-request cost of writing a response body: a dict through orjson (how the routes answered before), the
response Struct through msgspec with numpy arrays spliced in as orjson's JSON of them (`jsonio.encode`, how they
answer now), and the same Struct through msgspec alone (arrays as Python float lists), on the same bodies, in one
run. Sizes are in bytes: a float32 vector written through Python floats carries float64 digits.

    .venv/bin/python benchmarks/encoding.py [--out FILE]      # its section of benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import sys
import timeit
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from _serve import write_results
from batching import ROOT, machine

from rsinfer_cli.jsonio import dumps, encode
from rsinfer_cli.server.routes.common import usage
from rsinfer_cli.server.routes.embedding import EmbeddingItem, EmbeddingsResponse
from rsinfer_cli.server.routes.pii import DetectResponse, DetectResult, Entity
from rsinfer_cli.server.routes.rerank import RerankResponse, RerankResult
from rsinfer_cli.server.schemas import Usage

_PLAIN = msgspec.json.Encoder(enc_hook=lambda o: o.tolist())   # arrays as Python lists: the alternative


def _embeddings(n: int) -> tuple[Any, Any]:
    vecs = np.random.default_rng(0).standard_normal((n, 384)).astype(np.float32)
    old = {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vecs)],
           "model": "minilm", "usage": {"prompt_tokens": 7 * n, "total_tokens": 7 * n}}
    new = EmbeddingsResponse(object="list", model="minilm", usage=usage(7 * n),
                             data=[EmbeddingItem(object="embedding", index=i, embedding=v) for i, v in enumerate(vecs)])
    return old, new


def _rerank(n: int) -> tuple[Any, Any]:
    scores = np.random.default_rng(1).random(n)
    old = {"id": "x", "model": "rr", "usage": {"prompt_tokens": 9 * n, "total_tokens": 9 * n},
           "results": [{"index": i, "relevance_score": float(s)} for i, s in enumerate(scores)]}
    new = RerankResponse(id="x", model="rr", usage=Usage(prompt_tokens=9 * n, total_tokens=9 * n),
                         results=[RerankResult(index=i, relevance_score=float(s)) for i, s in enumerate(scores)])
    return old, new


def _pii(n: int) -> tuple[Any, Any]:
    ents = [("EMAIL", "a@b.example", 0.99, 10, 21), ("PHONE", "+1 415 555 0100", 1.0, 30, 45)]
    old = {"object": "pii.detection", "model": "pii", "usage": {"prompt_tokens": 40, "total_tokens": 40},
           "results": [{"entities": [{"entity_type": t, "text": x, "score": s, "start": a, "end": b}
                                     for t, x, s, a, b in ents]} for _ in range(n)]}
    new = DetectResponse(object="pii.detection", model="pii", usage=Usage(prompt_tokens=40, total_tokens=40),
                         results=[DetectResult(entities=[Entity(entity_type=t, text=x, score=s, start=a, end=b)
                                                         for t, x, s, a, b in ents]) for _ in range(n)])
    return old, new


def per_call_us(fn: Any, n: int) -> float:
    fn()
    return min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "RESULTS.md")
    args = ap.parse_args()
    bodies = {"/v1/embeddings, 1 x 384": _embeddings(1), "/v1/embeddings, 32 x 384": _embeddings(32),
              "/v1/rerank, 100 results": _rerank(100), "/pii/detect, 16 texts x 2 spans": _pii(16)}
    lines = ["", "## Response encoding: dict + orjson vs Struct + msgspec (`encoding.py`)", "",
             f"Machine: {machine()}. Reproduce: `.venv/bin/python benchmarks/encoding.py`. Best of 5 x 2,000 "
             "encodes; µs per body (lower is better), its size in bytes. The server answers with the second column.",
             "", "| body | dict, orjson (before) | Struct, msgspec + orjson arrays (`jsonio.encode`) | "
             "Struct, msgspec alone |", "|---|---|---|---|"]
    for name, (old, new) in bodies.items():
        assert msgspec.json.decode(encode(new)) == msgspec.json.decode(dumps(old)), name   # the same JSON
        o = per_call_us(lambda old=old: dumps(old), 2000)
        e = per_call_us(lambda new=new: encode(new), 2000)
        p = per_call_us(lambda new=new: _PLAIN.encode(new), 2000)
        lines.append(f"| {name} | {o:.1f} µs, {len(dumps(old)):,} B | {e:.1f} µs ({e / o:.2f}x), "
                     f"{len(encode(new)):,} B | {p:.1f} µs ({p / o:.2f}x), {len(_PLAIN.encode(new)):,} B |")
    return write_results(args.out, [*lines, ""])


if __name__ == "__main__":
    sys.exit(main())
