"""The engine before and after a change, against the raw ONNX Runtime pipeline, in one run.

    .venv/bin/python benchmarks/engine.py --before-src <old checkout>/src   # its section of benchmarks/RESULTS.md

Same machine, same run, same texts; all-MiniLM-L6-v2 fp32, two replicas x one intra-op thread, batching on (set
by hand on both servers: an older checkout's defaults may differ, and this compares engines), and each side again
with the defaults (no thread settings), what a user runs.
  - latency: one client, one short query at a time: p50 over HTTP vs the raw pipeline in-process (tokenizers ->
    session.run -> mean pooling -> normalise) at batch 1 with one thread; the difference is what HTTP adds;
  - throughput: 64 clients x 1 short query and 8 clients x 16 mixed texts, as a ratio to the ceiling: the same
    texts in-process in length-sorted batches of the best size (the best of two sessions x one thread and one x two);
  - fairness: 128 and 256 clients x 1 short query, p95 / p50.
The load generator is a bare asyncio HTTP/1.1 client on 127.0.0.1 in this process; every loop is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _serve import Serve, write_results
from batching import ROOT, SHARED, ceiling, drive, machine, mixed, queries

MODEL = SHARED / "all-minilm-l6-v2"


def raw_latency(texts: list[str], reps: int) -> float:
    """p50 (ms) of the in-process pipeline at batch 1, one session with one thread."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(256)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(MODEL / "onnx/model.onnx"), so, providers=["CPUExecutionProvider"])

    def embed(text: str) -> np.ndarray:
        e = tok.encode(text)
        ids = np.array([e.ids], dtype=np.int64)
        (h,) = sess.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": np.ones_like(ids),
                                                "token_type_ids": np.zeros_like(ids)})
        v = h.mean(axis=1)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    for t in texts[:20]:
        embed(t)
    times = []
    for i in range(reps):
        t0 = time.perf_counter()
        embed(texts[i % len(texts)])
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def server(tmp: Path, src: Path | None, name: str, defaults: bool = False) -> Serve:
    """2 x 1 by hand (both sides alike), or `defaults`: the config a user writes, no thread settings."""
    threads = "" if defaults else "replicas: 2, intra_threads: 1, "
    models = f"  - {{name: mini, kind: embedding, path: '{MODEL}', {threads}batching: {{enabled: true}}}}\n"
    return Serve(models, tmp, "max_queue: 1024", name=name, src=src)


def measure(url: str, short: list[str], mixed_texts: list[str], max_s: float) -> dict[str, dict]:
    one = [{"model": "mini", "input": q} for q in short]
    groups = [{"model": "mini", "input": mixed_texts[k:k + 16]} for k in range(0, len(mixed_texts), 16)]
    return {
        "latency": asyncio.run(drive(url, "/v1/embeddings", one[:400], 1, max_s)),
        "64x1": asyncio.run(drive(url, "/v1/embeddings", one, 64, max_s)),
        "8x16": asyncio.run(drive(url, "/v1/embeddings", groups, 8, max_s)),
        "128x1": asyncio.run(drive(url, "/v1/embeddings", one, 128, max_s)),
        "256x1": asyncio.run(drive(url, "/v1/embeddings", one, 256, max_s)),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before-src", type=Path, help="src/ of the checkout to compare against (the 'before')")
    ap.add_argument("--max-seconds", type=float, default=15, help="per workload and server")
    ap.add_argument("--rounds", type=int, default=2, help="before/after pairs, interleaved (drift shows)")
    ap.add_argument("--out", type=Path, default=ROOT / "RESULTS.md")
    args = ap.parse_args()
    short = queries(4000, 1)
    mixed_texts = mixed(1600, 2)
    raw_p50 = raw_latency(short[:300], 300)
    ceil_short, b_short = ceiling(MODEL, short[:1000], [1, 8, 16, 32, 64])
    ceil_mixed, b_mixed = ceiling(MODEL, mixed_texts, [1, 4, 8, 16])
    runs: dict[str, dict[str, dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        # both sides also as users run them: no thread settings (an older checkout's defaults may differ: that is
        # then the difference the defaults make)
        versions = ([("before", args.before_src), ("before, the defaults", args.before_src)] if args.before_src
                    else []) + [("after", None), ("after, the defaults", None)]
        for k in range(1, max(args.rounds, 1) + 1):
            # interleaved, the order reversed every other round (ABBA): a machine that drifts during the run then
            # penalises neither side
            for label, src in (versions if k % 2 else versions[::-1]):
                srv = server(Path(tmp), src, label, defaults="defaults" in label)
                try:
                    runs[f"{label} #{k}"] = measure(srv.url, short, mixed_texts, args.max_seconds)
                finally:
                    srv.stop()
    lines = ["", "## Engine against the raw pipeline, before and after a change (`engine.py`)", "",
             f"Machine: {machine()}. Reproduce: `.venv/bin/python benchmarks/engine.py --before-src "
             f"<old checkout>/src` (one run, {args.rounds} interleaved rounds of {args.max_seconds:.0f} s per "
             "workload; all-MiniLM-L6-v2 fp32, batching on; before and after with two replicas x one thread set by "
             "hand, `..., the defaults` with no thread settings: the plan). Raw in-process pipeline at batch 1, "
             "one thread: "
             f"p50 {raw_p50:.2f} ms. Ceiling (same texts, length-sorted batches of the best size, the best of "
             f"2 sessions x 1 thread and 1 x 2): {ceil_short:.1f} texts/s short queries (batch {b_short}), "
             f"{ceil_mixed:.1f} texts/s mixed (batch {b_mixed}).", "",
             "| server | 1 client p50 (ms) | HTTP adds (ms) | 64x1 texts/s | / ceiling | 8x16 texts/s | / ceiling "
             "| 128x1 texts/s | 128x1 p50 / p95 (ms) | p95 / p50 | 256x1 p95 / p50 | errors |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, r in runs.items():
        lat, a, b, c, d = r["latency"], r["64x1"], r["8x16"], r["128x1"], r["256x1"]
        errors = sum(x["errors"] for x in r.values())
        lines.append(f"| {label} | {lat['p50_ms']:.2f} | {lat['p50_ms'] - raw_p50:+.2f} | {a['rps']:.1f} | "
                     f"{a['rps'] / ceil_short:.2f} | {b['rps'] * 16:.1f} | {b['rps'] * 16 / ceil_mixed:.2f} | "
                     f"{c['rps']:.1f} | {c['p50_ms']:.1f} / {c['p95_ms']:.1f} | "
                     f"{c['p95_ms'] / max(c['p50_ms'], 1e-9):.2f} | {d['p95_ms'] / max(d['p50_ms'], 1e-9):.2f} | "
                     f"{errors} |")
    return write_results(args.out, [*lines, ""])


if __name__ == "__main__":
    sys.exit(main())
