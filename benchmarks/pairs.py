"""Pair throughput of a cross-encoder family, in-process vs over HTTP, measured in one run.

    .venv/bin/python benchmarks/pairs.py rerank      # 1 query x 50 documents on tiny-reranker-1
    .venv/bin/python benchmarks/pairs.py zeroshot    # 100 texts x 8 labels on tiny-nli

In-process runs the pipeline directly (tokenize + forwards + scoring); HTTP drives `rsinfer serve` on
127.0.0.1 with the same request, one at a time. Loops are bounded by --reps.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from _serve import Serve

WORDS = "the order shipped late and the invoice was wrong so please refund my card before friday".split(" ")


def texts(n: int, lo: int, hi: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))) for _ in range(n)]


def workload(family: str) -> tuple[str, str, dict, int]:
    if family == "rerank":
        body = {"model": "m", "query": "where is my refund", "documents": texts(50, 20, 80, 1)}
        return "rerank", "/v1/rerank", body, 50
    labels = ["billing", "shipping", "refund", "account", "fraud", "praise", "complaint", "other"]
    body = {"model": "m", "input": texts(100, 10, 60, 2), "candidate_labels": labels}
    return "zeroshot", "/classify/zero-shot", body, 100 * len(labels)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("family", choices=["rerank", "zeroshot"])
    shared = Path(os.environ.get("RSINFER_SHARED_MODELS") or Path(__file__).resolve().parents[2] / "shared/models")
    ap.add_argument("--model-dir", type=Path)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--replicas", type=int, default=0, help="0: the default thread plan")
    args = ap.parse_args()
    kind, route, body, pairs = workload(args.family)
    model_dir = args.model_dir or shared / ("tiny-reranker-1" if kind == "rerank" else "tiny-nli")

    from rsinfer_cli.config import ModelConfig
    from rsinfer_cli.engine.model import load_model
    from rsinfer_cli.pipelines import build_pipeline

    pipe = build_pipeline(load_model(ModelConfig(name="m", kind=kind, path=str(model_dir), replicas=1)))

    def in_process() -> None:
        if kind == "rerank":
            pipe.rerank(body["query"], body["documents"])
        else:
            pipe.classify(body["input"], body["candidate_labels"])

    in_process()
    t = time.perf_counter()
    for _ in range(args.reps):
        in_process()
    local = pairs * args.reps / (time.perf_counter() - t)

    import httpx

    replicas = f", replicas: {args.replicas}" if args.replicas else ""
    model = f"  - {{name: m, kind: {kind}, path: '{model_dir}'{replicas}}}\n"
    with tempfile.TemporaryDirectory() as tmp, Serve(model, Path(tmp)) as srv, \
            httpx.Client(base_url=srv.url, timeout=120) as c:
        assert c.post(route, json=body).status_code == 200
        t = time.perf_counter()
        for _ in range(args.reps):
            r = c.post(route, json=body)
            assert r.status_code == 200, r.text
        remote = pairs * args.reps / (time.perf_counter() - t)
    print(json.dumps({"family": args.family, "pairs_per_request": pairs, "in_process_pairs_s": round(local, 1),
                      "http_pairs_s": round(remote, 1), "http_over_in_process": round(remote / local, 3),
                      "cpus": os.cpu_count()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
