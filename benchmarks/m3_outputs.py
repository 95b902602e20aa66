"""What BGE-M3's three outputs cost over its dense vector alone: the same texts asked for dense only and for dense,
lexical weights and ColBERT vectors at once, on `rsinfer serve` and in-process, beside the raw pipeline.

    .venv/bin/python benchmarks/m3_outputs.py        # its section of benchmarks/RESULTS.md

The model is `tiny-bge-m3` (../shared/models, random weights, XLM-R hidden 32, 2 layers). Requests of 8 texts (the
texts of its reference, sentences of 3-60 tokens), one client, one request at a time, the two kinds alternating
request by request so that the machine's slower spells fall on both; medians of `--rounds` rounds. The server's
forward counter (rsinfer_batch_rows) shows that an all-outputs request runs each text's row once. Baseline: the
raw dense pipeline in-process - tokenizers → session.run → CLS normalised - on the same 8 texts, one at a time.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _serve import Serve, write_results
from batching import ROOT, SHARED, machine

MODEL = SHARED / "tiny-bge-m3"
ALL = {"return_dense": True, "return_sparse": True, "return_colbert_vecs": True}


def texts() -> list[str]:
    ref = json.loads((MODEL / "reference.json").read_text(encoding="utf-8"))
    items = [c["text"] for g in ("texts", "queries", "passages") for c in ref[g] if c["text"].strip()]
    return items[:8]


def raw(items: list[str], seconds: float) -> float:
    """Requests/s of the raw dense pipeline over the 8 texts, batch 1 (ONNX Runtime's default threads)."""
    import numpy as np
    import onnxruntime as ort
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(128)
    sess = ort.InferenceSession(str(MODEL / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])

    def once() -> None:            # one text at a time (batch 1): one client's baseline
        for text in items:
            ids = np.array([tok.encode(text).ids], dtype=np.int64)
            h = sess.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0][:, 0]
            _ = h / np.linalg.norm(h, axis=1, keepdims=True)

    for _ in range(20):
        once()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        once()
        n += 1
    return n / (time.perf_counter() - t0)


def served(url: str, items: list[str], count: int) -> dict[str, list[float]]:
    """Latency (ms) of dense-only and all-output requests, alternating, `count` of each."""
    import httpx

    got: dict[str, list[float]] = {"dense": [], "all": []}
    with httpx.Client(base_url=url, timeout=60) as c:
        for k in range(count + 20):
            for kind, extra in (("dense", {}), ("all", ALL)):
                t0 = time.perf_counter()
                r = c.post("/v1/embeddings/m3", json={"input": items, **extra})
                elapsed = (time.perf_counter() - t0) * 1000
                r.raise_for_status()
                if k >= 20:
                    got[kind].append(elapsed)
    return got


def in_process(items: list[str], count: int) -> dict[str, list[float]]:
    sys.path.insert(0, str(ROOT.parent / "src"))
    import rsinfer_cli

    got: dict[str, list[float]] = {"dense": [], "all": []}
    with rsinfer_cli.load(MODEL) as model:
        for k in range(count + 20):
            for kind, kw in (("dense", {}), ("all", {"sparse": True, "colbert": True})):
                t0 = time.perf_counter()
                model.m3(items, **kw)
                if k >= 20:
                    got[kind].append((time.perf_counter() - t0) * 1000)
    return got


def rows(url: str) -> float:
    import httpx

    found = re.search(r'rsinfer_batch_rows_sum\{model="m3",version=""\} (\S+)', httpx.get(url + "/metrics").text)
    return float(found.group(1)) if found else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=400, help="of each kind, per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "RESULTS.md")
    args = ap.parse_args()
    items = texts()
    ratios: dict[str, list[float]] = {"served": [], "api": []}
    p50: dict[str, list[float]] = {"served dense": [], "served all": [], "api dense": [], "api all": [], "raw": []}
    models = f"  - {{name: m3, kind: m3, path: '{MODEL}'}}\n"
    with tempfile.TemporaryDirectory() as tmp, Serve(models, Path(tmp), name="m3") as srv:
        before = rows(srv.url)
        served(srv.url, items, 0)            # the warm-up requests only
        per_request = (rows(srv.url) - before) / 40
        for _ in range(args.rounds):
            s = served(srv.url, items, args.requests)
            a = in_process(items, args.requests // 2)
            rate = raw(items, 3)
            for where, got in (("served", s), ("api", a)):
                d, x = statistics.median(got["dense"]), statistics.median(got["all"])
                ratios[where].append(x / d)
                p50[f"{where} dense"].append(d)
                p50[f"{where} all"].append(x)
            p50["raw"].append(1000 / rate)
    m = {k: statistics.median(v) for k, v in p50.items()}
    lines = ["", "## BGE-M3: three outputs against the dense vector alone (`m3_outputs.py`)", "",
             f"Machine: {machine()}. Command: `.venv/bin/python benchmarks/m3_outputs.py`. tiny-bge-m3 (random "
             "weights, XLM-R hidden 32), requests of 8 texts of 3-60 tokens, one client, dense-only and all-output "
             f"requests alternating; medians of {args.rounds} rounds of {args.requests} requests of each kind. "
             f"Rows run per all-output or dense-only request, from rsinfer_batch_rows: {per_request:.1f} "
             "(one forward row per text, whatever is asked).", "",
             "| where | dense only p50 ms | dense + lexical + ColBERT p50 ms | all / dense | raw dense pipeline p50 ms "
             "|",
             "|---|---|---|---|---|",
             f"| `rsinfer serve`, /v1/embeddings/m3 | {m['served dense']:.2f} | {m['served all']:.2f} | "
             f"**{statistics.median(ratios['served']):.2f}x** | {m['raw']:.2f} |",
             f"| in-process, `Model.m3` | {m['api dense']:.2f} | {m['api all']:.2f} | "
             f"**{statistics.median(ratios['api']):.2f}x** | {m['raw']:.2f} |", ""]
    return write_results(args.out, lines)


if __name__ == "__main__":
    sys.exit(main())
