"""`rsinfer redact --policy` on nested records vs `rsinfer redact --field` on the same paragraphs, one run.

    .venv/bin/python benchmarks/records.py [--records 2000] [--rounds 3]

Both commands run the defaults on rampart-pii over the same paragraphs: flat (`{"id", "text"}`, `--field text`) and
nested (`messages[*].content` beside an e-mail, a phone stored as a number, nulls, Unicode and notes to drop, under a
policy with every action). Rounds alternate (flat, nested, flat, ...); the ratio is of the medians (records/s).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from redact import paragraph  # noqa: E402

POLICY = """default: keep
fields:
  id: keep
  user.email: {action: redact, type: EMAIL}
  customer.phone: {action: redact, type: PHONE}
  "messages[*].content": scan
  internal_notes: drop
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    shared = Path(os.environ.get("RSINFER_SHARED_MODELS") or Path(__file__).resolve().parents[2] / "shared/models")
    ap.add_argument("--model-dir", type=Path, default=shared / "rampart-pii")
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rng = random.Random(0)
    texts = [paragraph(rng, i) for i in range(args.records)]
    with tempfile.TemporaryDirectory() as d:
        flat, nested, policy = Path(d) / "flat.jsonl", Path(d) / "nested.jsonl", Path(d) / "policy.yaml"
        flat.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
        nested.write_text("".join(json.dumps({
            "id": i, "user": {"email": f"user{i}@example.com", "name": None}, "customer": {"phone": 4155550100 + i},
            "messages": [{"role": "user", "content": t}, {"role": "agent", "content": None}], "ünïcode": "é☃",
            "internal_notes": "VIP"}, ensure_ascii=False) + "\n" for i, t in enumerate(texts)))
        policy.write_text(POLICY)
        base = [sys.executable, "-m", "rsinfer_cli", "redact", "--path", str(args.model_dir)]
        runs = {"--field": (base + ["--field", "text"], flat), "--policy": (base + ["--policy", str(policy)], nested)}
        times: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(args.rounds):
            for name, (cmd, data) in runs.items():
                t0 = time.perf_counter()
                with data.open("rb") as stdin:
                    subprocess.run(cmd, stdin=stdin, stdout=subprocess.DEVNULL, check=True)
                times[name].append(time.perf_counter() - t0)
    rate = {k: args.records / statistics.median(v) for k, v in times.items()}
    for k, v in rate.items():
        print(f"{k:9s} {v:8.1f} records/s  (runs: {', '.join(f'{t:.2f}' for t in times[k])} s)")
    print(f"ratio --policy / --field: {rate['--policy'] / rate['--field']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
