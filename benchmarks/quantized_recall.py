"""What int8, uint8 and binary vectors cost in retrieval: recall@10 against float32 search on the shared corpus.

    .venv/bin/python benchmarks/quantized_recall.py        # its section of benchmarks/RESULTS.md

all-MiniLM-L6-v2 (../shared/models) embeds `../shared/gpu/corpus.jsonl` (2,000 sentences) through the Python API;
each of the first `--queries` sentences is a query against the other 1,999. The truth is float32 cosine's top 10;
each compact type searches with its own vectors only: int8 by integer dot product, int8 and uint8 by the dot
product of each code's bucket centre (what a vector store's scalar quantisation computes), binary by Hamming
distance of the ubinary bytes (the same bits), and binary with float rescoring (the top 40 by Hamming re-ranked by
the float query against the int8 documents, sentence-transformers' rescore recipe). Ranges: the model's default
[-1, 1], and calibrated on the corpus itself (quantization_calibration).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from _serve import write_results
from batching import ROOT, SHARED

MODEL = SHARED / "all-minilm-l6-v2"
CORPUS = SHARED.parent / "gpu" / "corpus.jsonl"
K = 10


def top(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of each row's k largest scores (ties: the lower index)."""
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(t)) / len(t) for f, t in zip(found, truth, strict=True)]))


def hamming(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    """[nq, nd] Hamming distances of packed bit rows."""
    bits = np.unpackbits(q[:, None, :] ^ d[None, :, :], axis=2)
    return bits.sum(axis=2).astype(np.int64)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--out", type=Path, default=ROOT / "RESULTS.md")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT.parent / "src"))
    import rsinfer_cli
    from rsinfer_cli.pipelines.outtypes import Ranges, quantize

    texts = [json.loads(line)["text"] for line in CORPUS.read_text(encoding="utf-8").splitlines()]
    with rsinfer_cli.load(MODEL) as model:
        floats = model.embed(texts)
    nq = args.queries
    mask = np.zeros((nq, len(texts)), dtype=bool)
    mask[np.arange(nq), np.arange(nq)] = True          # a query is not its own answer

    def search(scores: np.ndarray) -> np.ndarray:
        return top(np.where(mask, -np.inf, scores.astype(np.float64)), K)

    truth = search(floats[:nq] @ floats.T)
    rows = [("float32", 4 * floats.shape[1], 1.0)]
    codes = quantize(floats, "int8").astype(np.int64)
    rows.append(("int8, [-1, 1], integer dot product", floats.shape[1], recall(search(codes[:nq] @ codes.T), truth)))
    for label, ranges in (("[-1, 1]", Ranges.unit(floats.shape[1])),
                          ("calibrated on the corpus", Ranges.calibrated(floats, "corpus"))):
        for t in ("int8", "uint8"):
            q = quantize(floats, t, ranges).astype(np.float64) + (128 if t == "int8" else 0)
            approx = ranges.starts + (q + 0.5) * ranges.steps      # each code's bucket centre
            rows.append((f"{t}, {label}, dequantised dot product", floats.shape[1],
                         recall(search(approx[:nq] @ approx.T), truth)))
    bits = quantize(floats, "ubinary")
    dist = hamming(bits[:nq], bits)
    rows.append(("binary (Hamming)", bits.shape[1], recall(search(-dist), truth)))
    shortlist = np.argsort(np.where(mask, 1 << 30, dist), axis=1, kind="stable")[:, :4 * K]
    docs = quantize(floats, "int8").astype(np.float64)
    rescored = np.array([s[np.argsort(-(floats[i] @ docs[s].T), kind="stable")][:K]
                         for i, s in enumerate(shortlist)])
    rows.append(("binary, top 40 rescored by float query x int8 documents", bits.shape[1], recall(rescored, truth)))
    lines = ["", "## Compact vectors: recall@10 against float32 (`quantized_recall.py`)", "",
             "Command: `.venv/bin/python benchmarks/quantized_recall.py`. all-MiniLM-L6-v2 on "
             f"`shared/gpu/corpus.jsonl` ({len(texts)} sentences); the first {nq} are queries against the rest, "
             f"truth = float32 cosine's top {K}. Each type searches with its own vectors (integer or dequantised "
             "dot product; Hamming distance for binary). Recall does not depend on the machine.", "",
             "| vectors | bytes a vector | recall@10 |", "|---|---|---|"]
    lines += [f"| {name} | {size} | {value:.3f} |" for name, size, value in rows]
    lines.append("")
    return write_results(args.out, lines)


if __name__ == "__main__":
    sys.exit(main())
