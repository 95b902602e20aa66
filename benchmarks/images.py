"""Image throughput: `rsinfer serve` embedding images for 8 concurrent clients, against the raw pipeline in-process
(Pillow preprocessing exactly as the processor does it + the vision graph at the best batch size), in one run.

    .venv/bin/python benchmarks/images.py        # its section of benchmarks/RESULTS.md

The model is `tiny-clip` (../shared/models: random weights, a ViT of hidden 32 at 224 x 224): its forward costs
little, so the comparison is mostly of what surrounds it - decoding, resizing and normalising each image, and for
the server the base64 body, HTTP and batching. The images are the 10 shared ones (PNG, JPEG, WebP, GIF; 1 x 1 to
640 x 480), sent one per request by each client (infinity's `modality: image` on /v1/embeddings) as it gets its
last answer. Every measurement once a round, medians of `--rounds` rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _serve import Serve, write_results
from batching import ROOT, SHARED, drive, machine

MODEL = SHARED / "tiny-clip"
CLIENTS = 8
SIZES = (1, 8, 32)


def files() -> list[bytes]:
    ref = json.loads((MODEL / "reference.json").read_text(encoding="utf-8"))
    return [(MODEL / im["file"]).read_bytes() for im in ref["images"]]


class Raw:
    """Pillow preprocessing (pipelines/imageprep.py) and the vision graph on one session, ONNX Runtime's defaults."""

    def __init__(self) -> None:
        import onnxruntime as ort

        sys.path.insert(0, str(ROOT.parent / "src"))
        from rsinfer_cli.pipelines import imageprep

        self.ip = imageprep
        self.cfg = imageprep.ImageConfig.of(json.loads((MODEL / "preprocessor_config.json").read_text()))
        self.sess = ort.InferenceSession(str(MODEL / "onnx" / "vision_model.onnx"), providers=["CPUExecutionProvider"])

    def rate(self, images: list[bytes], size: int, seconds: float) -> float:
        import numpy as np

        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            batch = [images[(n + k) % len(images)] for k in range(size)]
            px = np.stack([self.ip.preprocess(b, self.cfg) for b in batch])
            self.sess.run(["image_embeds"], {"pixel_values": px})
            n += size
        return n / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=5, help="per measurement")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "RESULTS.md")
    args = ap.parse_args()
    images = files()
    raw = Raw()
    for size in SIZES:
        raw.rate(images, size, 0.5)                       # warm-up
    bodies = [{"model": "clip", "modality": "image", "input": [base64.b64encode(b).decode("ascii")]}
              for b in images] * 2000
    got: dict[str, list[float]] = {"server": [], "raw": [], "p50": []}
    best_sizes: list[int] = []
    models = f"  - {{name: clip, kind: image_text, path: '{MODEL}'}}\n"
    with tempfile.TemporaryDirectory() as tmp, Serve(models, Path(tmp), name="images") as srv:
        asyncio.run(drive(srv.url, "/v1/embeddings", bodies[:200], 4, 3))         # warm-up
        for _ in range(args.rounds):
            rates = {size: raw.rate(images, size, args.seconds) for size in SIZES}
            size = max(rates, key=lambda s: rates[s])
            best_sizes.append(size)
            r = asyncio.run(drive(srv.url, "/v1/embeddings", bodies, CLIENTS, args.seconds))
            got["server"].append(r["rps"])
            got["raw"].append(rates[size])
            got["p50"].append(r["p50_ms"])
    ratio = statistics.median([s / r for s, r in zip(got["server"], got["raw"], strict=True)])
    lines = ["", "## Images: CLIP served against the raw pipeline (`images.py`)", "",
             f"Machine: {machine()}. Command: `.venv/bin/python benchmarks/images.py`. tiny-clip (random weights, a "
             "ViT of hidden 32: the forward costs little, so this measures what surrounds it); the 10 shared images "
             f"(1 x 1 to 640 x 480; PNG, JPEG, WebP, GIF), one per request, {CLIENTS} clients, /v1/embeddings with "
             "`modality: image`; rsinfer with its defaults. Baseline, same run and images: Pillow preprocessing "
             "exactly as the processor + the vision graph, in-process, at the best of batch sizes "
             f"{', '.join(map(str, SIZES))}. Medians of {args.rounds} rounds of {args.seconds:g} s.", "",
             "| what | images/s | vs the raw pipeline | p50 ms |", "|---|---|---|---|",
             f"| raw pipeline, batch {statistics.mode(best_sizes)} | {statistics.median(got['raw']):.0f} | 1.00x | - |",
             f"| **rsinfer**, {CLIENTS} clients | {statistics.median(got['server']):.0f} | **{ratio:.2f}x** | "
             f"{statistics.median(got['p50']):.2f} |", ""]
    return write_results(args.out, lines)


if __name__ == "__main__":
    sys.exit(main())
