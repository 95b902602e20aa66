"""Which graph and which execution provider: fp32, int8 (one scale per tensor), int8 per channel (rsinfer quantize's
default) and the fp32 graph with onnxruntime's transformer fusions (--optimize), each on the CPU provider and on
OpenVINO, through `rsinfer serve`, with what each loses beside it - in one run.

    .venv/bin/python benchmarks/faster.py        # needs `make openvino-venv`; its section of benchmarks/RESULTS.md

Models: all-MiniLM-L6-v2 (embedding) and tiny-reranker-1 (rerank), their graphs made here by `rsinfer quantize` in a
scratch copy of each folder. For each graph x provider: one server with both models and the defaults (no thread
settings), texts/s at 1 client x 1 text, 64 clients x 1 short text and 8 clients x 16 mixed texts (rerank: one
query x that many documents per request); two rounds, the second in reverse order, the mean of the two. Quality
against fp32 on the CPU provider, by the quality gate (`rsinfer bench --compare`): embedding mean / min cosine,
rerank mean Spearman rho and top-1 agreement. Every loop is bounded in count and time; 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from _serve import Serve, write_results
from batching import ROOT, SHARED, drive, machine, mixed, queries

OV_PYTHON = ROOT.parent / ".venv-openvino" / "bin" / "python"
MODELS = {"mini": ("embedding", "all-minilm-l6-v2"), "rr": ("rerank", "tiny-reranker-1")}
GRAPHS = {   # variant → (file, the quantize arguments that write it)
    "fp32": ("onnx/model.onnx", None),
    "int8 per tensor": ("onnx/model_int8_per_tensor.onnx", ["--dtype", "int8", "--per-tensor",
                                                           "--out", "onnx/model_int8_per_tensor.onnx"]),
    "int8 per channel": ("onnx/model_quantized.onnx", ["--dtype", "int8"]),
    "fp32 optimized": ("onnx/model_optimized.onnx", ["--dtype", "fp32", "--optimize"]),
}
EPS = ("cpu", "openvino")


def scratch(root: Path) -> dict[str, Path]:
    """Each model's folder as links, with the variants written into it by rsinfer quantize."""
    out = {}
    for name, (_, folder) in MODELS.items():
        src, dst = SHARED / folder, root / folder
        for f in src.rglob("*"):
            if f.is_file() and f.name != "model_quantized.onnx":
                (dst / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
                (dst / f.relative_to(src)).symlink_to(f)
        for _, args in GRAPHS.values():
            if args is not None:
                fixed = [str(dst / a) if a.startswith("onnx/") else a for a in args]
                subprocess.run([sys.executable, "-m", "rsinfer_cli", "quantize", str(dst), *fixed, "--no-check"],
                               check=True, capture_output=True, timeout=600)
        out[name] = dst
    return out


def quality(folders: dict[str, Path], file: str, ep: str) -> dict[str, float]:
    """The gate's measures of (file, ep) against fp32 on the CPU provider, per model."""
    python = str(OV_PYTHON) if ep == "openvino" else sys.executable
    out = {}
    for name, folder in folders.items():
        proc = subprocess.run([python, "-m", "rsinfer_cli", "bench", "--path", str(folder), "--compare",
                               "onnx/model.onnx@cpu", f"{file}@{ep}", "--speed-seconds", "0", "--json"],
                              capture_output=True, text=True, timeout=900)
        check = json.loads(proc.stdout)["check"]
        if name == "mini":
            out["cos"], out["min cos"] = check["mean_cosine"], check["min_cosine"]
        else:
            out["rho"], out["top1"] = check["mean_spearman"], check["top1_agreement"]
    return out


def workloads(short: list[str], long: list[str]) -> dict[str, tuple[str, str, list[dict], int, int]]:
    """name → (route, model, bodies, clients, texts per request)."""
    q = "where is my refund"
    return {
        "mini 1x1": ("/v1/embeddings", "mini", [{"model": "mini", "input": t} for t in short[:400]], 1, 1),
        "mini 64x1": ("/v1/embeddings", "mini", [{"model": "mini", "input": t} for t in short], 64, 1),
        "mini 8x16": ("/v1/embeddings", "mini", [{"model": "mini", "input": long[k:k + 16]}
                                                 for k in range(0, len(long), 16)], 8, 16),
        "rr 1x1": ("/v1/rerank", "rr", [{"model": "rr", "query": q, "documents": [t]} for t in short[:400]], 1, 1),
        "rr 64x1": ("/v1/rerank", "rr", [{"model": "rr", "query": q, "documents": [t]} for t in short], 64, 1),
        "rr 8x16": ("/v1/rerank", "rr", [{"model": "rr", "query": q, "documents": long[k:k + 16]}
                                         for k in range(0, len(long), 16)], 8, 16),
    }


def measure(folders: dict[str, Path], file: str, ep: str, tmp: Path, max_s: float, loads: dict) -> dict[str, float]:
    models = "".join(f"  - {{name: {n}, kind: {k}, path: '{folders[n]}', file: '{file}', eps: [{ep}]}}\n"
                     for n, (k, _) in MODELS.items())
    python = str(OV_PYTHON) if ep == "openvino" else None
    rates = {}
    with Serve(models, tmp, "max_queue: 1024", name=f"faster-{ep}", python=python) as srv:
        for name, (route, _, bodies, clients, per) in loads.items():
            asyncio.run(drive(srv.url, route, bodies[-50:], min(clients, 8), 3))         # warm
            res = asyncio.run(drive(srv.url, route, bodies, clients, max_s))
            rates[name] = res["rps"] * per if not res["errors"] else float("nan")
    return rates


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-seconds", type=float, default=5, help="per workload, server and round")
    ap.add_argument("--out", type=Path, default=ROOT / "RESULTS.md")
    args = ap.parse_args()
    if not OV_PYTHON.exists():
        print(f"no {OV_PYTHON}: run `make openvino-venv` first", file=sys.stderr)
        return 2
    short = [f"{t} {i}" for i, t in enumerate(queries(20000, 1))]
    long = [f"{t} {i}" for i, t in enumerate(mixed(3200, 2))]
    loads = workloads(short, long)
    cells = [(v, ep) for v in GRAPHS for ep in EPS]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        folders = scratch(tmp)
        runs: dict[tuple[str, str], list[dict[str, float]]] = {c: [] for c in cells}
        for order in (cells, cells[::-1]):          # two rounds, the second in reverse
            for v, ep in order:
                runs[(v, ep)].append(measure(folders, GRAPHS[v][0], ep, tmp, args.max_seconds, loads))
        quals = {(v, ep): quality(folders, GRAPHS[v][0], ep) for v, ep in cells}
    base = {k: sum(r[k] for r in runs[("fp32", "cpu")]) / 2 for k in loads}
    rows = []
    for v, ep in cells:
        mean = {k: sum(r[k] for r in runs[(v, ep)]) / 2 for k in loads}
        q = quals[(v, ep)]
        rows.append(f"| {v} | {ep} | " + " | ".join(f"{mean[k]:.1f} ({mean[k] / base[k]:.2f}x)" for k in loads)
                    + f" | {q['cos']:.4f} / {q['min cos']:.4f} | {q['rho']:.3f} / {q['top1']:.2f} |")
    lines = ["", "## Which graph and which provider: fp32, int8, int8 per channel, optimized on CPU and OpenVINO "
             "(`faster.py`)", "",
             f"Machine: {machine()}; OpenVINO: onnxruntime-openvino in `make openvino-venv`. Reproduce: "
             "`make openvino-venv && .venv/bin/python benchmarks/faster.py`. "
             "Graphs written by `rsinfer quantize` (per tensor: `--per-tensor`; optimized: `--dtype fp32 "
             "--optimize`). One server per graph x provider with both models and the defaults; texts/s (rerank: "
             "documents/s), the mean of two rounds (the second in reverse order), and in brackets the ratio to fp32 "
             "on the CPU provider in the same run. Quality against fp32 on CPU by the quality gate "
             "(`rsinfer bench --compare`, 300 texts / 24 queries): all-MiniLM mean / min cosine, tiny-reranker-1 "
             "mean Spearman rho / top-1 agreement (random weights: its scores sit close together, so rank measures "
             "move more than a trained reranker's would).", "",
             "| graph | provider | " + " | ".join(f"{k} texts/s" for k in loads) + " | cosine mean / min | "
             "rho / top-1 |", "|---|---|" + "---|" * len(loads) + "---|---|", *rows, ""]
    return write_results(args.out, lines)


if __name__ == "__main__":
    sys.exit(main())
