"""The CPU thread plan (engine/threads.py) against the raw ONNX Runtime pipeline and hand-written plans, in one run.

    .venv/bin/python benchmarks/threads.py          # its section of benchmarks/RESULTS.md

all-minilm-l6-v2 from ../shared/models on this machine, one model per server, batching on (the default):
  - the baselines, in this process on the same texts: the sorted-batch ceiling (tokenize + session.run + mean
    pooling over length-sorted batches of the best size, the best of 2 sessions x 1 thread and 1 session x 2
    threads), and the raw single forward (one text, tokenize + run + pool, p50) with 1 and with 2 threads;
  - `rsinfer serve` with the default config (no `replicas`, no `intra_threads`: the plan), then the plans a user
    might write by hand (2 x 2 = the old default of "all cores per replica", 2 x 1, 1 x 2), the default with
    `server.workers: 2`, and the default pinned to one CPU (`taskset -c 0`, against the one-thread ceiling).
Per server: 64 clients x 1 short query, 8 clients x 16 mixed texts, one client x one short query (p50), the mean
forward inside the server (from /metrics, over the one-client run) and the server's peak RSS. Every loop is bounded
in count and time; the load generator is in this process, on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

from _serve import Serve, forward_mean_ms, peak_rss_bytes, plan_of, write_results
from batching import SHARED, Raw, drive, machine, mixed, queries

ROOT = Path(__file__).resolve().parent
MODEL = SHARED / "all-minilm-l6-v2"


# ---------------------------------------------------------------- the server


def model_yaml(extra: str = "") -> str:
    return f"  - {{name: mini, kind: embedding, path: '{MODEL}'{', ' + extra if extra else ''}}}\n"


def measure(srv: Serve, loads: dict, max_s: float, only: tuple[str, ...] | None = None) -> dict:
    out: dict = {}
    out["plan"] = plan_of(srv.url)
    for name, (bodies, clients) in loads.items():
        if only and name not in only:
            continue
        out[name] = asyncio.run(drive(srv.url, "/v1/embeddings", bodies, clients, max_s))
        if name == "latency":
            out["forward_ms"] = forward_mean_ms(srv.url)
    out["rss_gb"] = sum(peak_rss_bytes(pid) for pid in tree(srv.proc.pid)) / 1e9
    return out


def interleaved_one_client(servers: list[tuple[str, str, str, str | None]], bodies: list[dict], tmp: Path,
                           blocks: int) -> dict[str, float]:
    """One client's p50 per server, the servers up at once and measured in turn in 3 s blocks, the order reversed
    every block (the mean of the blocks' p50s): the rounds above are minutes apart, and this machine's speed drifts
    by more than a millisecond in that time."""
    started: list[tuple[str, Serve]] = []
    p50s: dict[str, list[float]] = {}
    try:
        for k, (label, extra, server_yaml, _) in enumerate(servers):
            started.append((label, Serve(model_yaml(extra), tmp, server_yaml, name=f"one{k}")))
        for _, srv in started:
            asyncio.run(drive(srv.url, "/v1/embeddings", bodies[:50], 1, 3))       # warm-up
        for b in range(blocks):
            for label, srv in (started if b % 2 == 0 else started[::-1]):
                r = asyncio.run(drive(srv.url, "/v1/embeddings", bodies, 1, 3))
                p50s.setdefault(label, []).append(r["p50_ms"])
    finally:
        for _, srv in started:
            srv.stop()
    return {label: sum(v) / len(v) for label, v in p50s.items()}


def tree(pid: int) -> list[int]:
    """A process and its descendants (worker processes: the supervisor, the engine, the front ends)."""
    out = [pid]
    for p in out:
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                out += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-seconds", type=float, default=20, help="per workload and server")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds over every server (noise shows)")
    ap.add_argument("--out", type=Path, default=ROOT / "RESULTS.md")
    ap.add_argument("--servers", help="only the server rows whose label contains one of these (comma-separated)")
    ap.add_argument("--blocks", type=int, default=10, help="interleaved 3 s blocks of one client per server")
    args = ap.parse_args()
    short = queries(3000, 1)
    mixed_texts = mixed(1600, 2)
    loads = {  # run in this order: the one-client run first, so the forward mean is its own
        "latency": ([{"model": "mini", "input": q} for q in short[:400]], 1),
        "short": ([{"model": "mini", "input": q} for q in short], 64),
        "mixed": ([{"model": "mini", "input": mixed_texts[k:k + 16]} for k in range(0, 1600, 16)], 8),
    }
    raw = Raw(MODEL)
    c_short = max(raw.ceiling(short[:1000], [1, 8, 16, 32, 64], s, t) for s, t in ((2, 1), (1, 2)))
    c_mixed = max(raw.ceiling(mixed_texts, [1, 4, 8, 16], s, t) for s, t in ((2, 1), (1, 2)))
    single = {t: raw.single_p50_ms(short[:300], t) for t in (1, 2)}
    best_single = min(single.values())
    affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(affinity)})          # the one-CPU ceiling: this thread on one CPU
    try:
        c_one = raw.ceiling(short[:1000], [1, 8, 16, 32, 64], 1, 1)
    finally:
        os.sched_setaffinity(0, affinity)

    servers = [
        ("default (no thread settings)", "", "", None),
        ("2 x 2 threads (the old default: every core per replica)", "replicas: 2, intra_threads: 2", "", None),
        ("2 x 1 thread", "replicas: 2, intra_threads: 1", "", None),
        ("1 x 2 threads", "replicas: 1, intra_threads: 2", "", None),
        ("default, server.workers: 2", "", "workers: 2", None),
        ("default, taskset -c 0 (one CPU)", "", "", str(min(affinity))),
    ]
    if args.servers:
        servers = [s for s in servers if any(w in s[0] for w in args.servers.split(","))]
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for k, (label, extra, server_yaml, cpus) in enumerate(servers):
                with Serve(model_yaml(extra), Path(tmp), server_yaml, name=f"threads{k}", cpus=cpus) as srv:
                    results.setdefault(label, []).append(
                        measure(srv, loads, args.max_seconds, ("short",) if cpus else None))
        one_client = interleaved_one_client([s for s in servers if s[3] is None], loads["latency"][0], Path(tmp),
                                            args.blocks)

    def span(values: list[float], fmt: str) -> str:
        """The rounds' range: `a` when they agree to the format, else `lo-hi`."""
        lo, hi = format(min(values), fmt), format(max(values), fmt)
        return lo if lo == hi else f"{lo}-{hi}"

    def rate(rounds: list[dict], name: str, ceil: float) -> str:
        if name not in rounds[0]:
            return "-"
        got = [r[name]["rps"] * (16 if name == "mixed" else 1) for r in rounds]
        return f"{span(got, '.0f')} ({span([g / ceil for g in got], '.2f')})"

    lines = ["", "## Threads and CPUs: the default plan against the raw pipeline (`threads.py`)", "",
             f"Machine: {machine()}; CPUs this process may use: {len(affinity)}. Reproduce: "
             f"`.venv/bin/python benchmarks/threads.py`. all-MiniLM-L6-v2 fp32, batching on, {args.rounds} interleaved "
             "rounds (a cell gives the range over them); then one client again, every server but the pinned one up at "
             f"once and measured in turn, {args.blocks} blocks of 3 s each (the mean of the blocks' p50s).", "",
             f"Baselines (in-process, same texts): sorted-batch ceiling {c_short[0]:.0f} short texts/s (batch "
             f"{c_short[1]}), {c_mixed[0]:.0f} mixed texts/s (batch {c_mixed[1]}), best of 2 x 1 and 1 x 2; "
             f"one-thread ceiling {c_one[0]:.0f} short texts/s; raw single forward (tokenize + run + pool) p50 "
             f"{single[1]:.2f} ms on 1 thread, {single[2]:.2f} ms on 2.", "",
             "| server config | resolved plan | 64 x 1 short (texts/s, / ceiling) | 8 x 16 mixed (texts/s, / ceiling) "
             "| 1 client p50 (ms, - best raw) | 1 client p50, interleaved (ms) | forward in server (ms) "
             "| peak RSS (GB, every process) | errors |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label, rounds in results.items():
        first = rounds[0]
        ceil = c_one[0] if "taskset" in label else c_short[0]
        lat, fwd = "-", "-"
        if "latency" in first:
            p50 = [r["latency"]["p50_ms"] for r in rounds]
            lat = f"{span(p50, '.2f')} ({span([p - best_single for p in p50], '+.2f')})"
            fwd = span([r["forward_ms"] for r in rounds], ".2f")
        errors = sum(r[n]["errors"] for r in rounds for n in ("short", "mixed", "latency") if n in r)
        inter = f"{one_client[label]:.2f}" if label in one_client else "-"
        lines.append(f"| {label} | {first['plan']} | {rate(rounds, 'short', ceil)} | "
                     f"{rate(rounds, 'mixed', c_mixed[0])} | {lat} | {inter} | {fwd} | "
                     f"{span([r['rss_gb'] for r in rounds], '.2f')} | {errors} |")
    lines.append("")
    return write_results(args.out, lines)


if __name__ == "__main__":
    sys.exit(main())
