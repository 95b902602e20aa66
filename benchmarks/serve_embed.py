"""Embedding latency and throughput of `rsinfer serve` against raw ONNX Runtime, measured in one run.

    .venv/bin/python benchmarks/serve_embed.py [--model-dir ../shared/models/all-minilm-l6-v2]

Reports (as ratios against baselines measured in the same run, because the machine is shared and noisy):
  - single-text p50 over HTTP vs the raw session.run time (and tokenize + run + pool) for the same text;
  - texts/s at concurrency 16 (one text per request, mixed lengths) vs the in-process ceiling
    (two sessions x one thread at batch 1 on the same texts);
  - the cost of JSON-encoding a response with the stdlib vs orjson.
Every loop is bounded in count and time; the server listens on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from _serve import Serve

WORDS = tuple("the printing press changed how ideas spread across europe in the fifteenth century while "
              "merchants scholars and priests argued about cost speed accuracy and the value of copying".split(" "))


def corpus(n: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 120))) for _ in range(n)]


def pct(xs: list[float], p: float) -> float:
    return float(np.percentile(np.array(xs), p))


def raw_baselines(model_dir: Path, query: str, texts: list[str], reps: int) -> dict:
    import onnxruntime as ort
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(256)

    def session(threads: int):
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        return ort.InferenceSession(str(model_dir / "onnx/model.onnx"), so, providers=["CPUExecutionProvider"])

    def feeds(text: str) -> dict:
        e = tok.encode(text)
        ids = np.array([e.ids], dtype=np.int64)
        return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}

    def embed(sess, text: str) -> np.ndarray:
        f = feeds(text)
        (h,) = sess.run(["last_hidden_state"], f)
        v = h.mean(axis=1)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    s0 = session(0)
    f = feeds(query)
    for _ in range(20):
        s0.run(["last_hidden_state"], f)
    run_t, full_t = [], []
    for _ in range(reps):
        t = time.perf_counter()
        s0.run(["last_hidden_state"], f)
        run_t.append(time.perf_counter() - t)
        t = time.perf_counter()
        embed(s0, query)
        full_t.append(time.perf_counter() - t)
    # ceiling: two sessions x one intra-op thread, each working through half of the texts at batch 1
    sessions = [session(1), session(1)]
    for s in sessions:
        embed(s, texts[0])
    halves = [texts[0::2], texts[1::2]]
    t = time.perf_counter()
    threads = [threading.Thread(target=lambda s=s, h=h: [embed(s, x) for x in h])
               for s, h in zip(sessions, halves, strict=True)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    ceiling = len(texts) / (time.perf_counter() - t)
    return {"run_p50_ms": pct(run_t, 50) * 1000, "embed_p50_ms": pct(full_t, 50) * 1000, "ceiling_tps": ceiling}


async def http_bench(url: str, query: str, texts: list[str], reps: int, concurrency: int, max_s: float) -> dict:
    import aiohttp

    async with aiohttp.ClientSession() as http:
        async def post(text: str) -> float:
            t = time.perf_counter()
            async with http.post(url + "/v1/embeddings", json={"input": text}) as r:
                await r.read()
                assert r.status == 200, r.status
            return time.perf_counter() - t

        for _ in range(20):
            await post(query)
        lat = [await post(query) for _ in range(reps)]
        queue = list(texts)
        done = 0
        deadline = time.perf_counter() + max_s

        async def worker() -> None:
            nonlocal done
            while queue and time.perf_counter() < deadline:
                await post(queue.pop())
                done += 1

        t = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        tps = done / (time.perf_counter() - t)
    return {"http_p50_ms": pct(lat, 50) * 1000, "http_p95_ms": pct(lat, 95) * 1000, "c16_tps": tps, "c16_done": done}


def json_cost(rows: int = 16, dim: int = 384, reps: int = 200) -> dict:
    import orjson

    vecs = np.random.default_rng(0).standard_normal((rows, dim)).astype(np.float32)
    body = {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": v.tolist()}
                                       for i, v in enumerate(vecs)]}
    t = time.perf_counter()
    for _ in range(reps):
        json.dumps(body)
    std = (time.perf_counter() - t) / reps
    fast_body = {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": v}
                                            for i, v in enumerate(vecs)]}
    t = time.perf_counter()
    for _ in range(reps):
        orjson.dumps(fast_body, option=orjson.OPT_SERIALIZE_NUMPY)
    return {"stdlib_ms": std * 1000, "orjson_ms": (time.perf_counter() - t) / reps * 1000}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    shared = Path(os.environ.get("RSINFER_SHARED_MODELS") or Path(__file__).resolve().parents[2] / "shared/models")
    ap.add_argument("--model-dir", type=Path, default=shared / "all-minilm-l6-v2")
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--texts", type=int, default=600)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-seconds", type=float, default=60)
    ap.add_argument("--intra-threads", type=int, default=0, help="0: the default thread plan")
    ap.add_argument("--batching", choices=["on", "off"], default="on")
    args = ap.parse_args()
    query = "what is the capital of france"
    texts = corpus(args.texts)
    raw = raw_baselines(args.model_dir, query, texts, args.reps)
    threads = f"replicas: 2, intra_threads: {args.intra_threads}, " if args.intra_threads else ""
    model = (f"  - {{name: mini, kind: embedding, path: '{args.model_dir}', {threads}"
             f"batching: {{enabled: {args.batching == 'on'}}}}}\n")
    with tempfile.TemporaryDirectory() as tmp, Serve(model, Path(tmp)) as srv:
        http = asyncio.run(http_bench(srv.url, query, texts, args.reps, args.concurrency, args.max_seconds))
    js = json_cost()
    res = {**raw, **http, **{f"json_{k}": v for k, v in js.items()}, "cpus": os.cpu_count(),
           "intra_threads": args.intra_threads}
    print(json.dumps(res, indent=2))
    print(f"\nsingle text p50: HTTP {http['http_p50_ms']:.2f} ms vs session.run {raw['run_p50_ms']:.2f} ms "
          f"({http['http_p50_ms'] / raw['run_p50_ms']:.2f}x), tokenize+run+pool {raw['embed_p50_ms']:.2f} ms")
    print(f"concurrency {args.concurrency}: {http['c16_tps']:.1f} texts/s = "
          f"{http['c16_tps'] / raw['ceiling_tps']:.2f}x the in-process ceiling ({raw['ceiling_tps']:.1f} texts/s)")
    print(f"JSON of 16x384 floats: stdlib {js['stdlib_ms']:.2f} ms, orjson {js['orjson_ms']:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
