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

from _serve import CHARTS, Serve, plan_of, pyplot, save_chart, write_results
from batching import ROOT, SHARED, Raw, ceiling, drive, machine, queries

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


def chart(path: Path, rows: list[dict], ceil: float, single: float) -> None:
    """Texts/s and p50/p95 latency against clients, with the raw pipeline's two baselines."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    xs = [r["clients"] for r in rows]
    left.plot(xs, [r["rps"] for r in rows], marker="o", label="rsinfer serve, the defaults")
    left.axhline(ceil, color="black", linestyle="dashed", label="raw pipeline, the best batch (ceiling)")
    left.axhline(single, color="gray", linestyle="dotted", label="raw pipeline, batch 1")
    left.set_ylabel("texts/s")
    right.plot(xs, [r["p50_ms"] for r in rows], marker="o", label="p50")
    right.plot(xs, [r["p95_ms"] for r in rows], marker="o", label="p95")
    right.set_ylabel("latency (ms)")
    right.set_yscale("log")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("concurrent clients, one short query each")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save_chart(fig, path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=10, help="of load per number of clients")
    ap.add_argument("--out", type=Path, default=ROOT / "RESULTS.md")
    ap.add_argument("--chart", type=Path, default=CHARTS / "clients.png")
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
    chart(args.chart, rows, ceil, single)
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
