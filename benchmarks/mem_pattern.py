"""ONNX Runtime's memory pattern (`SessionOptions.enable_mem_pattern`, on by default) on the shapes a server sees:
its memory growth over forwards of varied (rows, tokens) shapes, each setting in a process of its own; and the time
of a forward with it on and off, the two sessions interleaved call by call on the same feeds (drift cancels),
varied shapes and fixed ones.

    .venv/bin/python benchmarks/mem_pattern.py [--forwards 3000] [--out FILE]   # its section of benchmarks/RESULTS.md

Bare ORT sessions with one intra-op thread, not a server: the option is what is measured, and one thread is what the
default thread plan's batching lanes run with on this project's 2-core machines (the server with its defaults is
measured by soak.py, whose memory this option decided).
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _serve import write_results
from batching import ROOT, SHARED, machine

MINI = SHARED / "all-minilm-l6-v2" / "onnx" / "model.onnx"
ADD = SHARED / "tensor-models" / "add_one" / "model.onnx"


def session(path: Path, on: bool):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.enable_mem_pattern = on
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def feeds(sess, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    return {i.name: np.ones(shape, dtype=np.int64 if "int64" in i.type else np.float32) for i in sess.get_inputs()}


def shapes(n: int, rows: int, tokens: int, seed: int = 0) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [(rng.randint(1, rows), rng.randint(4, tokens)) for _ in range(n)]


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def growth(on: bool, n: int) -> list[float]:
    """In this process: RSS growth (MiB) after each quarter of `n` forwards of varied shapes, after a warm-up."""
    s = session(MINI, on)
    for sh in shapes(50, 8, 80, seed=1):
        s.run(None, feeds(s, sh))
    r0, marks = rss_mib(), []
    for i, sh in enumerate(shapes(n, 8, 80)):
        s.run(None, feeds(s, sh))
        if (i + 1) % (n // 4) == 0:
            marks.append(rss_mib() - r0)
    return marks


def interleaved(path: Path, seq: list[tuple[int, ...]]) -> tuple[float, float]:
    """Seconds of the forwards with the pattern on and off, the two sessions taking turns going first."""
    on, off = session(path, True), session(path, False)
    for s in (on, off):
        for sh in seq[:20]:
            s.run(None, feeds(s, sh))
    t_on = t_off = 0.0
    for i, sh in enumerate(seq):
        f = feeds(on, sh)
        order = (on, off) if i % 2 == 0 else (off, on)
        for s in order:
            t0 = time.perf_counter()
            s.run(None, f)
            dt = time.perf_counter() - t0
            if s is on:
                t_on += dt
            else:
                t_off += dt
    return t_on, t_off


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--forwards", type=int, default=3000)
    ap.add_argument("--out", type=Path, default=ROOT / "RESULTS.md")
    ap.add_argument("--growth", choices=("on", "off"), help=argparse.SUPPRESS)   # the child process's part
    args = ap.parse_args()
    if args.growth:
        print(" ".join(f"{x:.1f}" for x in growth(args.growth == "on", args.forwards)))
        return 0
    grown = {}
    for mode in ("on", "off"):
        out = subprocess.run([sys.executable, __file__, "--growth", mode, "--forwards", str(args.forwards)],
                             capture_output=True, text=True, check=True, timeout=3600)
        grown[mode] = out.stdout.split()
    times = {"all-MiniLM-L6-v2, varied shapes (1-16 rows x 4-64 tokens), 1,500 forwards":
             interleaved(MINI, shapes(1500, 16, 64, seed=2)),
             "all-MiniLM-L6-v2, fixed 4 x 32, 400 forwards": interleaved(MINI, [(4, 32)] * 400),
             "add_one [1, 4], 100,000 forwards": interleaved(ADD, [(1, 4)] * 100_000)}
    lines = ["", "## ONNX Runtime's memory pattern on a server's shapes (`mem_pattern.py`)", "",
             f"Machine: {machine()}. Reproduce: `.venv/bin/python "
             f"benchmarks/mem_pattern.py --forwards {args.forwards}` (one intra-op thread; CPU EP).", "",
             f"Memory: RSS growth of one all-MiniLM-L6-v2 session over {args.forwards:,} forwards of random shapes "
             "(1-8 rows x 4-80 tokens), after 50 warm-up forwards, at each quarter (MiB):", "",
             "| memory pattern | after 1/4 | 1/2 | 3/4 | all |", "|---|---|---|---|---|",
             *[f"| {mode} | {' | '.join(grown[mode])} |" for mode in ("on", "off")], "",
             "Time: the two sessions on the same feeds, taking turns going first:", "",
             "| forwards | on (s) | off (s) | off / on |", "|---|---|---|---|",
             *[f"| {name} | {a:.2f} | {b:.2f} | {b / a:.3f} |" for name, (a, b) in times.items()], "",
             "rsinfer turns it off on every session (engine/session.py): the pattern keeps one plan per distinct "
             "input shape for the session's life, so batched text - a new (rows, tokens) shape every few forwards - "
             "grows each replica for as long as new shapes come, and the forwards are no faster with it.", ""]
    return write_results(args.out, lines)


if __name__ == "__main__":
    sys.exit(main())
