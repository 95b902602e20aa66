"""Throughput and latency against the number of clients: `rsinfer serve` with the defaults on all-MiniLM-L6-v2,
short queries to `/v1/embeddings`, beside the raw pipeline in-process.

    .venv/bin/python benchmarks/clients.py     # its section of benchmarks/RESULTS.md, docs/charts/clients.png

Each client sends one query and its next when the answer is in (keep-alive HTTP/1.1 on 127.0.0.1, the bare asyncio
client of batching.py), for 1, 2, 4, ... 128 clients in turn, `--seconds` each; one server for all of them. The
baselines, from the same run and the same texts: the raw pipeline (tokenizers → session.run → mean pooling) at
batch 1 with two threads - what one client could get with no server at all - and its ceiling, length-sorted batches
of the best size (the best of two sessions x one thread and one x two), what any number of clients could get.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

from _serve import Serve, plan_of, write_results
from batching import ROOT, SHARED, Raw, ceiling, drive, machine, queries
from charts import draw

MODEL = SHARED / "all-minilm-l6-v2"
CLIENTS = (1, 2, 4, 8, 16, 32, 64, 128)


def batch_one(raw: Raw, texts: list[str], seconds: float) -> float:
    """Texts/s of the raw pipeline one text at a time on one session of two threads."""
    sess = raw.session(2)
    for t in texts[:20]:
        raw.embed(sess, [t])
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds and n < len(texts):
        raw.embed(sess, [texts[n]])
        n += 1
    return n / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=10, help="of load per number of clients")
    ap.add_argument("--out", type=Path, default=ROOT / "RESULTS.md")
    args = ap.parse_args()
    texts = queries(20_000, 1)
    ceil, best = ceiling(MODEL, texts[:1000], [1, 8, 16, 32, 64])
    raw = Raw(MODEL)
    single = batch_one(raw, texts, min(args.seconds, 5))
    single_p50 = raw.single_p50_ms(texts[:300], 2)
    bodies = [{"model": "mini", "input": q} for q in texts]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        models = f"  - {{name: mini, kind: embedding, path: '{MODEL}'}}\n"
        with Serve(models, Path(tmp), name="clients") as srv:
            plan = plan_of(srv.url)
            asyncio.run(drive(srv.url, "/v1/embeddings", bodies[:200], 4, 3))     # warm-up
            for n in CLIENTS:
                r = asyncio.run(drive(srv.url, "/v1/embeddings", bodies, n, args.seconds))
                if r["errors"]:
                    raise SystemExit(f"{r['errors']} requests failed at {n} clients")
                rows.append({"clients": n, **r})
    draw("clients", {"title": "Throughput and latency against concurrent clients",
                     "note": f"benchmarks/clients.py, all-MiniLM-L6-v2, short queries to /v1/embeddings, the "
                             f"defaults, on {machine()}",
                     "rows": [{k: r[k] for k in ("clients", "rps", "p50_ms", "p95_ms")} for r in rows],
                     "ceiling": ceil, "batch1": single})
    lines = ["", "## Throughput and latency against clients (`clients.py`)", "",
             f"Machine: {machine()}. Reproduce: `.venv/bin/python benchmarks/clients.py` (all-MiniLM-L6-v2, short "
             f"queries to `/v1/embeddings`, {args.seconds:g} s per number of clients, one server with the defaults: "
             f"{plan}). Baselines, same run and texts: the raw pipeline in-process at batch 1 with two threads, "
             f"{single:.1f} texts/s, p50 {single_p50:.2f} ms; its ceiling, length-sorted batches of {best}, "
             f"{ceil:.1f} texts/s. Drawn in "
             "`docs/charts/clients.png` (on the docs' performance page).", "",
             "| clients | texts/s | / ceiling | / batch 1 | p50 (ms) | p95 (ms) | p99 (ms) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['clients']} | {r['rps']:.1f} | {r['rps'] / ceil:.2f} | {r['rps'] / single:.2f} | "
                     f"{r['p50_ms']:.2f} | {r['p95_ms']:.2f} | {r['p99_ms']:.2f} |")
    lines.append("")
    return write_results(args.out, lines)


if __name__ == "__main__":
    sys.exit(main())
