"""`rsinfer redact` records/s on one-paragraph JSONL records vs the raw model forward, measured in one run.

    .venv/bin/python benchmarks/redact.py [--records 10000]

The baseline is the model alone: the same paragraphs tokenized once, then length-sorted batches of 32 through
onnxruntime (no decoding, no JSON, no I/O) - the ceiling for any redactor on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

NAMES = ["Alex Rivera", "Maria Lopez", "John Smith", "Priya Patel", "Chen Wei"]
SENTENCES = ["The order was delayed because of the weather.", "We reviewed the invoice and found an error.",
             "Please confirm the new delivery date.", "The support team escalated the ticket yesterday.",
             "Our records show two payments this month."]


def paragraph(rng: random.Random, i: int) -> str:
    name = rng.choice(NAMES)
    user = name.lower().replace(" ", ".")
    body = " ".join(rng.choice(SENTENCES) for _ in range(rng.randint(3, 6)))
    return f"Hi, this is {name}. {body} You can reach me at {user}{i}@example.com or call (415) 555-{i % 10000:04d}."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    shared = Path(os.environ.get("RSINFER_SHARED_MODELS") or Path(__file__).resolve().parents[2] / "shared/models")
    ap.add_argument("--model-dir", type=Path, default=shared / "rampart-pii")
    ap.add_argument("--records", type=int, default=10_000)
    args = ap.parse_args()
    rng = random.Random(11)
    texts = [paragraph(rng, i) for i in range(args.records)]

    import onnxruntime as ort
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(args.model_dir / "tokenizer.json"))
    sess = ort.InferenceSession(str(args.model_dir / "onnx/model_q4.onnx"), providers=["CPUExecutionProvider"])
    ids = [e.ids for e in tok.encode_batch(texts)]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    t = time.perf_counter()
    for k in range(0, len(order), 32):
        rows = [ids[i] for i in order[k:k + 32]]
        width = max(map(len, rows))
        x = np.zeros((len(rows), width), dtype=np.int64)
        m = np.zeros_like(x)
        for j, r in enumerate(rows):
            x[j, :len(r)] = r
            m[j, :len(r)] = 1
        sess.run(["logits"], {"input_ids": x, "attention_mask": m, "token_type_ids": np.zeros_like(x)})
    raw = len(texts) / (time.perf_counter() - t)

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "records.jsonl"
        src.write_text("".join(json.dumps({"id": i, "text": x, "keep": i % 7}) + "\n" for i, x in enumerate(texts)))
        t = time.perf_counter()
        with open(src, "rb") as stdin:
            proc = subprocess.run([sys.executable, "-m", "rsinfer_cli", "redact", "--path", str(args.model_dir),
                                   "--field", "text", "--batch-lines", "256"], stdin=stdin, capture_output=True,
                                  timeout=3600)
        elapsed = time.perf_counter() - t
    assert proc.returncode == 0, proc.stderr.decode()
    out = [json.loads(x) for x in proc.stdout.splitlines()]
    assert [o["id"] for o in out] == list(range(len(texts)))
    leaked = sum("@example.com" in o["text"] for o in out)
    cli = len(texts) / elapsed
    print(json.dumps({"records": len(texts), "raw_forward_records_s": round(raw, 1), "redact_cli_records_s":
                      round(cli, 1), "cli_over_raw": round(cli / raw, 3), "emails_left": leaked,
                      "cpus": os.cpu_count()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
