"""How much CPU one request costs the server outside the forward, and where it goes (groundwork for worker
processes): a real `rsinfer serve`, one short query per request to /v1/embeddings, 8 clients.

    .venv/bin/python benchmarks/frontend_cost.py      # its section of benchmarks/RESULTS.md

front-end CPU per request = (the process's user+sys CPU over the run - the forwards' time from
rsinfer_inference_seconds_sum, each forward on one intra-op thread) / requests. This undercounts: the forwards'
wall time exceeds their CPU time when they are preempted on shared cores. benchmarks/workers.py measures a
front-end process, which runs no forward, instead. The profile is cProfile of the
event-loop thread of an in-process server under the same load (the forward threads are not profiled).
"""

from __future__ import annotations

import asyncio
import io
import pstats
import re
import sys
import tempfile
from pathlib import Path

from _serve import Serve, cpu_seconds, inference_sum, write_results
from batching import ROOT, SHARED, drive, machine, profiled, queries

MODEL = SHARED / "all-minilm-l6-v2"
REQUESTS = 3000


def measured(bodies: list[dict]) -> tuple[float, float, float]:
    """(front-end CPU µs per request, forward ms per request, requests/s) on a real serve."""
    with tempfile.TemporaryDirectory() as tmp:
        srv = Serve(f"  - {{name: mini, kind: embedding, path: '{MODEL}'}}\n",
                    Path(tmp), "max_queue: 1024", name="cost")
        try:
            asyncio.run(drive(srv.url, "/v1/embeddings", bodies[:200], 8, 30))  # warm
            c0, f0 = cpu_seconds(srv.proc.pid), inference_sum(srv.url)
            r = asyncio.run(drive(srv.url, "/v1/embeddings", bodies, 8, 60))
            c1, f1 = cpu_seconds(srv.proc.pid), inference_sum(srv.url)
        finally:
            srv.stop()
    n = max(r["requests"], 1)
    return ((c1 - c0) - (f1 - f0)) / n * 1e6, (f1 - f0) / n * 1e3, r["rps"]


def profile(bodies: list[dict]) -> str:
    sys.path.insert(0, str(ROOT.parent / "tests"))
    from rsinfer_cli.config import parse_config

    from serverutil import ServerThread

    cfg = parse_config({"server": {"max_queue": 1024}, "models": [
        {"name": "mini", "kind": "embedding", "path": str(MODEL)}]})
    with ServerThread(cfg) as srv:
        prof = profiled(srv, "/v1/embeddings", bodies, 8)
    out = io.StringIO()
    pstats.Stats(prof, stream=out).strip_dirs().sort_stats("tottime").print_stats(12)
    return out.getvalue()


def main() -> int:
    bodies = [{"model": "mini", "input": q} for q in queries(REQUESTS, 3)]
    per_request_us, forward_ms, rps = measured(bodies)
    text = profile(bodies)
    rows = [line for line in text.splitlines() if re.match(r"\s+\d", line)][:12]
    lines = ["", "## Front-end cost per request (`frontend_cost.py`)", "",
             f"Machine: {machine()}. Reproduce: `.venv/bin/python benchmarks/frontend_cost.py` (one run). A real "
             f"`rsinfer serve` (all-MiniLM-L6-v2, the default thread plan), {REQUESTS} requests of one short query "
             f"from 8 clients: {rps:.0f} requests/s, forward {forward_ms:.2f} ms per request, and "
             f"**{per_request_us:.0f} µs of CPU per request outside the forward** (the process's CPU minus the "
             "forwards'; the target for a front end is 150 µs).", "",
             "Where the event-loop thread spends it (cProfile, tottime, top 12; ncalls tottime percall cumtime "
             "percall function):", "", "```", *[r.rstrip() for r in rows], "```", ""]
    return write_results(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "RESULTS.md", lines)


if __name__ == "__main__":
    sys.exit(main())
