"""Reload and warm-up: the time from SIGHUP to serving an added all-MiniLM, and the first request's latency with
and without `warmup:`, each against its baseline from the same run.

    .venv/bin/python benchmarks/reload.py [--runs 3]      # its section of benchmarks/RESULTS.md

- **SIGHUP → serving**: a server (the defaults) serving a small tensor model gets all-MiniLM added to its file and a
  SIGHUP; the time until `/v1/embeddings` on it answers 200 (polled every 5 ms). Baselines: loading the same
  model in-process (`load_model` + its pipeline: the least a reload must do), and what a reload replaces - a
  restart, from `rsinfer serve` starting to listening with both models.
- **First request**: a fresh server on all-MiniLM (the defaults; then with `warmup: 1`), its first request once it
  listens - one query of nine words, or a full batch of 32 texts - against the median of the next 30 of the same.
  Baseline: the raw pipeline in-process (tokenizers → a new ORT session with the server's latency-lane threads →
  mean pooling), its first query against the median of the next 30.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from _serve import Serve, write_results
from batching import machine

ROOT = Path(__file__).resolve().parent
MODELS = Path(os.environ.get("RSINFER_SHARED_MODELS", ROOT.parent.parent / "shared" / "models"))
MINILM = MODELS / "all-minilm-l6-v2"
QUERY = "how do I change the models a server runs without a restart"
BATCH = [QUERY + " " + QUERY] * 32          # a full batch of 32 texts of 27 tokens
STEADY = 30


def tiny_tensor(folder: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 2])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 2])
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(helper.make_graph([helper.make_node("Identity", ["X"], ["Y"])], "id", [x], [y]),
                                opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(folder / "model.onnx"))
    return folder


def embed(client: httpx.Client, url: str, texts: str | list[str] = QUERY) -> float:
    t0 = time.perf_counter()
    r = client.post(url + "/v1/embeddings", json={"model": "minilm", "input": texts})
    elapsed = time.perf_counter() - t0
    if r.status_code != 200:
        raise RuntimeError(r.text)
    return elapsed * 1000


def sighup_to_serving(tmp: Path) -> float:
    tiny = tiny_tensor(tmp / "tiny")
    models = f"  - {{name: tiny, kind: tensor, path: '{tiny}'}}\n"
    with Serve(models, tmp, name="reload") as srv, httpx.Client(timeout=30) as c:
        cfg = tmp / "reload.yaml"
        cfg.write_text(cfg.read_text() + f"  - {{name: minilm, kind: embedding, path: '{MINILM}'}}\n")
        t0 = time.perf_counter()
        srv.proc.send_signal(signal.SIGHUP)
        deadline = t0 + 120
        while time.perf_counter() < deadline:
            r = c.post(srv.url + "/v1/embeddings", json={"model": "minilm", "input": QUERY})
            if r.status_code == 200:
                return time.perf_counter() - t0
            time.sleep(0.005)
    raise RuntimeError("the added model never answered")


def restart(tmp: Path) -> float:
    tiny = tiny_tensor(tmp / "tiny")
    models = (f"  - {{name: tiny, kind: tensor, path: '{tiny}'}}\n"
              f"  - {{name: minilm, kind: embedding, path: '{MINILM}'}}\n")
    t0 = time.perf_counter()
    with Serve(models, tmp, name="restart"):
        return time.perf_counter() - t0


def load_in_process() -> float:
    code = ("import time; t0 = time.perf_counter()\n"
            "from rsinfer_cli.config import parse_config\n"
            "from rsinfer_cli.engine.model import load_model\n"
            "from rsinfer_cli.pipelines import build_pipeline\n"
            f"cfg = parse_config({{'models': [{{'name': 'minilm', 'kind': 'embedding', 'path': '{MINILM}'}}]}})\n"
            "t1 = time.perf_counter(); build_pipeline(load_model(cfg.models[0]))\n"
            "print(time.perf_counter() - t1)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def first_request(tmp: Path, warmup: bool, texts: str | list[str]) -> tuple[float, float]:
    extra = ", warmup: 1" if warmup else ""
    with Serve(f"  - {{name: minilm, kind: embedding, path: '{MINILM}'{extra}}}\n", tmp, name="first") as srv, \
            httpx.Client(timeout=60) as c:
        c.get(srv.url + "/health")             # the connection is up: only the request is timed
        first = embed(c, srv.url, texts)
        steady = statistics.median(embed(c, srv.url, texts) for _ in range(STEADY))
    return first, steady


def raw_first() -> tuple[float, float]:
    """The raw pipeline in a fresh process: first session.run (and tokenize, pool) against the steady median."""
    code = f"""
import time, statistics, numpy as np, onnxruntime as ort
from tokenizers import Tokenizer
tok = Tokenizer.from_file('{MINILM}/tokenizer.json'); tok.no_padding()
opts = ort.SessionOptions(); opts.intra_op_num_threads = len(os.sched_getaffinity(0))
sess = ort.InferenceSession('{MINILM}/onnx/model.onnx', opts, providers=['CPUExecutionProvider'])
def one():
    t0 = time.perf_counter()
    e = tok.encode({QUERY!r})
    ids = np.array([e.ids], dtype=np.int64); mask = np.array([e.attention_mask], dtype=np.int64)
    out = sess.run(None, {{'input_ids': ids, 'attention_mask': mask, 'token_type_ids': np.zeros_like(ids)}})[0]
    v = (out * mask[..., None]).sum(1) / mask.sum(1, keepdims=True); v / np.linalg.norm(v, axis=1, keepdims=True)
    return (time.perf_counter() - t0) * 1000
first = one(); steady = statistics.median(one() for _ in range({STEADY}))
print(first, steady)
"""
    out = subprocess.run([sys.executable, "-c", "import os\n" + code], capture_output=True, text=True, timeout=300,
                         check=True)
    first, steady = out.stdout.split()
    return float(first), float(steady)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "RESULTS.md")
    args = ap.parse_args()
    med = statistics.median
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        hup = [sighup_to_serving(tmp) for _ in range(args.runs)]
        loads = [load_in_process() for _ in range(args.runs)]
        restarts = [restart(tmp) for _ in range(args.runs)]
        firsts = {(w, n): [first_request(tmp, w, QUERY if n == 1 else BATCH) for _ in range(args.runs)]
                  for w in (False, True) for n in (1, len(BATCH))}
    raw = [raw_first() for _ in range(args.runs)]
    lines = [
        "", "## Reload and warm-up (`reload.py`)", "",
        f"Machine: {machine()}. Reproduce: `.venv/bin/python "
        f"benchmarks/reload.py --runs {args.runs}` (medians of {args.runs} runs; the defaults, all-MiniLM-L6-v2 "
        "fp32 from ../shared/models).", "",
        "| SIGHUP → an added all-MiniLM answering | s | ratio to the in-process load |", "|---|---|---|",
        f"| in-process `load_model` + pipeline (baseline) | {med(loads):.2f} | 1.00 |",
        f"| SIGHUP → serving (the server keeps serving its other model) | {med(hup):.2f} | "
        f"{med(hup) / med(loads):.2f} |",
        f"| a restart instead: process start → listening with both models | {med(restarts):.2f} | "
        f"{med(restarts) / med(loads):.2f} |", "",
        f"| first request after start | first, ms | steady (median of the next {STEADY}), ms | first / steady |",
        "|---|---|---|---|",
        f"| raw pipeline in-process, a new session: one query (baseline) | {med(f for f, _ in raw):.1f} | "
        f"{med(s for _, s in raw):.2f} | {med(f / s for f, s in raw):.2f} |"]
    for (warmup, n), got in firsts.items():
        what = f"{'one query' if n == 1 else f'{n} texts'}, {'`warmup: 1`' if warmup else 'the defaults'}"
        lines.append(f"| rsinfer, {what} | {med(f for f, _ in got):.1f} | {med(s for _, s in got):.2f} | "
                     f"{med(f / s for f, s in got):.2f} |")
    lines.append("")
    return write_results(args.out, lines)


if __name__ == "__main__":
    raise SystemExit(main())
