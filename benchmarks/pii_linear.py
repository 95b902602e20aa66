"""The CPU of a PII request against the number of spans its text holds: linear, not quadratic.

    .venv/bin/python benchmarks/pii_linear.py [--ks 5000,10000,20000,40000]

One server (the default config, rampart-pii) in this process; for each k, the same text of k one-letter words is
sent to Presidio's `/analyze` twice: with an ad-hoc deny list of that letter (k matches, k spans to resolve and
answer) and with a deny list of a word the text does not hold (the baseline: the same tokenizing and forwards, no
span). The process's CPU (user + system) per request, and per doubling of k: linear resolution grows by 2x, the
quadratic loops it replaced by 4x."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def cpu() -> float:
    t = os.times()
    return t.user + t.system


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    shared = Path(os.environ.get("RSINFER_SHARED_MODELS") or Path(__file__).resolve().parents[2] / "shared/models")
    ap.add_argument("--model-dir", type=Path, default=shared / "rampart-pii")
    ap.add_argument("--ks", default="5000,10000,20000,40000")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()

    from rsinfer_cli.config import parse_config

    from serverutil import ServerThread

    cfg = parse_config({"models": [{"name": "pii", "kind": "pii", "path": str(args.model_dir)}]})
    rows = []
    with ServerThread(cfg) as srv, httpx.Client(timeout=600) as client:
        def spent(text: str, deny: str) -> tuple[float, int]:
            best, found = float("inf"), 0
            for _ in range(args.rounds):
                c0 = cpu()
                r = client.post(srv.url + "/analyze", json={"text": text, "language": "en", "ad_hoc_recognizers": [
                    {"supported_entity": "LETTER", "deny_list": [deny]}], "entities": ["LETTER"]})
                best = min(best, cpu() - c0)
                assert r.status_code == 200, r.text[:200]
                found = len(r.json())
            return best, found

        spent("warm up " * 100, "q")
        for k in (int(x) for x in args.ks.split(",")):
            text = " ".join(["q"] * k)
            with_spans, n = spent(text, "q")
            without, _ = spent(text, "zzz")
            rows.append((k, n, with_spans, without))
    print(f"{'k':>7} {'spans':>7} {'CPU with (s)':>13} {'CPU without (s)':>16} {'ratio':>6} {'x per doubling':>15}")
    for i, (k, n, a, b) in enumerate(rows):
        growth = f"{a / rows[i - 1][2]:.2f}" if i else "-"
        print(f"{k:>7} {n:>7} {a:>13.3f} {b:>16.3f} {a / b:>6.2f} {growth:>15}")
    print(f"date {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
