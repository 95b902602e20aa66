"""Front-end worker processes (`server.workers`) against one process and the raw ORT ceiling, in one run.

    .venv/bin/python benchmarks/workers.py [--workers 1 2 4] [--max-seconds 20]   # its section of benchmarks/RESULTS.md

For each worker count: `rsinfer serve` with the batching benchmark's config (MiniLM, a reranker, a PII model; the
default thread plan, batching on) and every workload of benchmarks/batching.py, against the in-process ceiling of
the same texts (tokenizers -> session.run -> pooling in length-sorted batches of the best size, the best of two
sessions x one thread and one x two). Then the CPU a front end spends per single-short-query request outside the
forward (the front-end processes' user+sys CPU over the run / requests; the forward is in the engine process), the
engine's CPU per request beside its forwards, and a cProfile of a front end's event loop (in-process: the front end
of tests/serverutil.ServerThread in workers mode, its engine on another thread, not profiled).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import pstats
import re
import sys
import tempfile
import time
from pathlib import Path

from _serve import Serve, cpu_seconds, inference_sum, plan_of, write_results
from batching import ROOT, SHARED, ceilings, drive, machine, profiled, queries, workloads

sys.path.insert(0, str(ROOT.parent / "tests"))
from serverutil import ServerThread, worker_pids  # noqa: E402 - the tests' helpers, found through the path above

MODEL = SHARED / "all-minilm-l6-v2"
CHEAP = SHARED / "tiny-qwen-embed"   # a forward of ~0.4 ms here: the front end is the bottleneck, as on a GPU


def pids(srv: Serve) -> tuple[list[int], list[int]]:
    """(engine pids, front-end pids) from the server's `processes:` line; one process: ([], [its pid])."""
    output = "".join(srv.lines)
    if "processes:" not in output:
        return [], [srv.proc.pid]
    engines, fronts = worker_pids(output)
    return list(engines.values()), fronts


def server(workers: int, tmp: Path, model: Path = MODEL) -> Serve:
    common = "batching: {enabled: true}"   # the default thread plan
    models = (f"  - {{name: mini, kind: embedding, path: '{model}', {common}}}\n"
              f"  - {{name: rr, kind: rerank, path: '{SHARED / 'tiny-reranker-1'}', {common}}}\n"
              f"  - {{name: pii, kind: pii, path: '{SHARED / 'rampart-pii'}', {common}}}\n")
    return Serve(models, tmp, f"max_queue: 1024, workers: {workers}", name=f"workers-{workers}")


def cost(workers: int, bodies: list[dict], max_s: float, model: Path, clients: int = 8) -> dict:
    """Front-end and engine CPU per request (µs) outside the forward, one short query per request."""
    with tempfile.TemporaryDirectory() as tmp:
        srv = server(workers, Path(tmp), model)
        try:
            engines, fronts = pids(srv)
            asyncio.run(drive(srv.url, "/v1/embeddings", bodies[:200], 8, 30))  # warm
            f0, e0, i0 = (sum(map(cpu_seconds, fronts)), sum(map(cpu_seconds, engines)), inference_sum(srv.url))
            r = asyncio.run(drive(srv.url, "/v1/embeddings", bodies, clients, max_s))
            f1, e1, i1 = (sum(map(cpu_seconds, fronts)), sum(map(cpu_seconds, engines)), inference_sum(srv.url))
        finally:
            srv.stop()
    n = max(r["requests"], 1)
    forwards = i1 - i0
    if engines:
        return {"front_us": (f1 - f0) / n * 1e6, "engine_us": ((e1 - e0) - forwards) / n * 1e6, "rps": r["rps"]}
    return {"front_us": ((f1 - f0) - forwards) / n * 1e6, "engine_us": 0.0, "rps": r["rps"]}


def profile(bodies: list[dict], model: Path) -> pstats.Stats:
    from rsinfer_cli.config import parse_config

    cfg = parse_config({"server": {"max_queue": 1024}, "models": [
        {"name": "mini", "kind": "embedding", "path": str(model)}]})
    with ServerThread(cfg, mode="workers") as srv:   # CPU clock of the loop thread: waits and preemption do not count
        prof = profiled(srv, "/v1/embeddings", bodies, 8, time.thread_time)
    stats = pstats.Stats(prof, stream=io.StringIO()).strip_dirs()
    return stats


# where a front end's loop time goes: (label, functions whose cumulative time counts, by file:function)
STAGES = [
    ("HTTP request parsing (aiohttp)", [("web_protocol.py", "data_received")]),
    ("request body decode + checks (msgspec, begin)", [("common.py", "begin")]),
    ("tokenize (plan)", [("embedding.py", "plan")]),
    ("rows to the engine and back (ipc send + receive)", [("ipc.py", "send"), ("ipc.py", "data_received")]),
    ("post-processing (finish: pool, normalise)", [("embedding.py", "finish")]),
    ("response write (aiohttp)", [("web_protocol.py", "finish_response")]),
    ("metrics (prometheus multiprocess values)", [("values.py", "inc")]),
]


def breakdown(stats: pstats.Stats) -> tuple[float, list[tuple[str, float]]]:
    """(the loop's total profiled time, each stage's share of it)."""
    raw = stats.stats  # type: ignore[attr-defined]
    total = sum(ct for (_f, _l, fn), (_cc, _nc, _tt, ct, _c) in raw.items() if fn == "_run_once")
    shares = []
    for label, funcs in STAGES:
        t = sum(ct for (f, _l, fn), (_cc, _nc, _tt, ct, _c) in raw.items() if (f, fn) in funcs)
        shares.append((label, t / total if total else 0.0))
    return total, shares


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--max-seconds", type=float, default=20, help="per workload and worker count")
    ap.add_argument("--out", type=Path, default=ROOT / "RESULTS.md")
    args = ap.parse_args()
    loads = workloads()
    ceil_short, b_short, ceil_mixed, b_mixed = ceilings(loads)
    results: dict[int, dict[str, dict]] = {}
    plan = ""
    with tempfile.TemporaryDirectory() as tmp:
        for w in args.workers:
            srv = server(w, Path(tmp))
            try:
                plan = plan_of(srv.url)
                for name, (route, bodies, clients, _) in loads.items():
                    results.setdefault(w, {})[name] = asyncio.run(drive(srv.url, route, bodies, clients,
                                                                        args.max_seconds))
            finally:
                srv.stop()
    base = args.workers[0]
    head = " | ".join(f"workers {w}" for w in args.workers)
    lines = ["", f"## Worker processes (server.workers): {', '.join(map(str, args.workers))} on this machine "
             "(`workers.py`)", "",
             f"Machine: {machine()}. Reproduce: `.venv/bin/python benchmarks/workers.py` (one run; every cell of a "
             f"row from the same run). Ceiling: in-process tokenize + session.run + pooling in length-sorted "
             f"batches, the best of 2 x 1 and 1 x 2 sessions: {ceil_short:.0f} texts/s short queries (batch "
             f"{b_short}), {ceil_mixed:.0f} texts/s mixed (batch {b_mixed}). The engine's thread plan for MiniLM: "
             f"{plan}. Cells: texts/s (ratio to workers {base}; "
             "to the ceiling where one applies), p50 ms.", "",
             f"| workload | {head} |", "|---|" + "---|" * len(args.workers)]
    for name, (_, _, _, per) in loads.items():
        ceil = ceil_short if "short" in name or "latency" in name else ceil_mixed if "mixed" in name else None
        cells = []
        for w in args.workers:
            r = results[w][name]
            ratio = r["rps"] / results[base][name]["rps"] if results[base][name]["rps"] else 0.0
            vs = f", {r['rps'] * per / ceil:.2f} of ceiling" if ceil else ""
            err = f", {r['errors']} errors" if r["errors"] else ""
            cells.append(f"{r['rps'] * per:.0f} ({ratio:.2f}x{vs}), p50 {r['p50_ms']:.1f}{err}")
        lines.append(f"| {name} | {' | '.join(cells)} |")
    bodies = [{"model": "mini", "input": q} for q in queries(3000, 3)]
    short = loads["64 clients x 1 short query"]
    cheap: dict[int, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for w in args.workers:
            srv = server(w, Path(tmp), CHEAP)
            try:
                cheap[w] = asyncio.run(drive(srv.url, short[0], short[1], short[2], args.max_seconds))
            finally:
                srv.stop()
    lines += ["", f"Front-end bound (the GPU case on this machine): a model whose forward takes about 0.4 ms here "
              f"({CHEAP.name}, random weights), 64 clients x one short query: "
              + "; ".join(f"workers {w}: {r['rps']:.0f} requests/s ({r['rps'] / cheap[base]['rps']:.2f}x), p50 "
                          f"{r['p50_ms']:.1f} ms" for w, r in cheap.items()) + "."]
    two = next((w for w in args.workers if w > 1), 2)
    lines += ["", f"CPU per request outside the forward, one short query per request, workers {two} (a front end does "
              "no forward: all its CPU counts; the engine's CPU minus its forwards' wall time):", ""]
    for model in (CHEAP, MODEL):
        for clients in (1, 8):
            c = cost(two, bodies, args.max_seconds, model, clients)
            lines.append(f"- {model.name}, {clients} client(s): front ends {c['front_us']:.0f} µs, engine "
                         f"{c['engine_us']:.0f} µs beside its forwards, at {c['rps']:.0f} requests/s")
    stats = profile(bodies, CHEAP)
    _, shares = breakdown(stats)
    cheap8 = cost(two, bodies, args.max_seconds, CHEAP, 8)["front_us"]
    lines += ["", "Where a front end's CPU goes, 8 clients x one short query to the cheap model: each stage's share of "
              "the event loop's CPU (cProfile on the loop thread's CPU clock, in-process front end of "
              f"tests/serverutil.ServerThread in workers mode) applied to the {cheap8:.0f} µs measured per request "
              "(shares overlap nowhere; the rest is asyncio, aiohttp's dispatch and middleware, route code):", "",
              "| stage | share | ≈ µs per request |", "|---|---|---|"]
    lines += [f"| {label} | {share:.0%} | {share * cheap8:.0f} |" for label, share in shares]
    out = io.StringIO()
    stats.stream = out  # type: ignore[attr-defined]
    stats.sort_stats("tottime").print_stats(12)
    rows = [line for line in out.getvalue().splitlines() if re.match(r"\s+\d", line)][:12]
    lines += ["", "Top functions by own time (ncalls tottime percall cumtime percall function):", "", "```",
              *[r.rstrip() for r in rows], "```", ""]
    return write_results(args.out, lines)


if __name__ == "__main__":
    sys.exit(main())
