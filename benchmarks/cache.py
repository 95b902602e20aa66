"""The row cache under a Zipf-distributed query stream: no cache, the memory backend, a real Redis; one run.

    .venv/bin/python benchmarks/cache.py          # its section of benchmarks/RESULTS.md (needs redis-server)

10,000 distinct short queries drawn with Zipf s = 1.1 (a few queries very often, most rarely: retrieval traffic),
64 clients, one query per request to /v1/embeddings; all-MiniLM-L6-v2 fp32, the default thread plan,
batching on. The same request sequence for each mode; each server starts cold. Every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _serve import Serve, free_port, plan_of, write_results
from batching import ROOT, SHARED, drive, machine

WORDS = ("where is my parcel refund invoice password reset account billing address shipping late order cancel "
         "change card delivery tracking number support hours store open weekend warranty return label").split()


def zipf_stream(n: int, distinct: int, s: float, seed: int) -> list[str]:
    rng = random.Random(seed)
    queries = list(dict.fromkeys(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))
                                 for _ in range(distinct * 3)))[:distinct]
    weights = 1.0 / np.arange(1, len(queries) + 1) ** s
    picks = np.random.default_rng(seed).choice(len(queries), size=n, p=weights / weights.sum())
    return [queries[i] for i in picks]


def start_redis(tmp: Path) -> tuple[subprocess.Popen, str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("redis-server did not start")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-seconds", type=float, default=30)
    ap.add_argument("--requests", type=int, default=30_000)
    ap.add_argument("--out", type=Path, default=ROOT / "RESULTS.md")
    args = ap.parse_args()
    stream = zipf_stream(args.requests, 10_000, 1.1, 5)
    bodies = [{"model": "mini", "input": q} for q in stream]
    model = f"  - {{name: mini, kind: embedding, path: '{SHARED / 'all-minilm-l6-v2'}'}}\n"
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        redis_proc, url = start_redis(Path(tmp))
        try:
            for label, server in (("no cache", "max_queue: 1024"),
                                  ("memory", "max_queue: 1024, cache: {backend: memory}"),
                                  ("redis", f"max_queue: 1024, cache: {{backend: redis, url: '{url}'}}")):
                srv = Serve(model, Path(tmp), server, name=label.replace(" ", "-"))
                try:
                    plan = plan_of(srv.url)
                    results[label] = asyncio.run(drive(srv.url, "/v1/embeddings", bodies, 64, args.max_seconds))
                finally:
                    srv.stop()
        finally:
            redis_proc.kill()
    distinct_share = len(set(stream[:results["no cache"]["requests"]])) / max(results["no cache"]["requests"], 1)
    base = results["no cache"]["rps"]
    lines = ["", "## Row cache: Zipf query stream, s = 1.1 over 10,000 queries, 64 clients (`cache.py`)", "",
             f"Machine: {machine()}. Reproduce: `.venv/bin/python benchmarks/cache.py` (one run, "
             f"{args.max_seconds:.0f} s per mode, each server cold at its start, the same request sequence each "
             f"time). all-MiniLM-L6-v2 fp32, the default thread plan ({plan}), batching on. In the requests the "
             "no-cache "
             "run got through, "
             f"{distinct_share:.0%} were distinct queries.", "",
             "| mode | requests/s | vs no cache | p50 (ms) | p99 (ms) | errors |", "|---|---|---|---|---|---|"]
    for label, r in results.items():
        lines.append(f"| {label} | {r['rps']:.1f} | {r['rps'] / base:.2f}x | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} "
                     f"| {r['errors']} |")
    return write_results(args.out, [*lines, ""])


if __name__ == "__main__":
    sys.exit(main())
