"""The CPU of a PII request against the number of spans its text holds: linear, not quadratic.

    .venv/bin/python benchmarks/pii_linear.py [--ks 5000,10000,20000,40000] [--rounds 3]

One `rsinfer serve` (the default config, rampart-pii) in its own process, its CPU read from /proc (every thread,
user + system). For each k, the same text of k one-letter words goes to Presidio's `/analyze` twice: with an ad-hoc
deny list of that letter (k matches: k spans to resolve and answer) and with a deny value the text does not hold
(the baseline: the same tokenizing and forwards, no span). Printed: the server's CPU per request (the best of
--rounds), the ratio to the baseline, the spans' own share (with - without), and each per doubling of k: linear
work grows 2x, the quadratic loops it replaced grew 4x. The forwards dominate the server's CPU, so the spans' share
is also measured alone, in this process: the CPU of the request's post-processing (its `finish`: span decoding,
the deny list, the recognizers, the address merge) after the same forwards, with and without the matches."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")      # utime + stime, all threads


def measure(url: str, pid: int, ks: list[int], rounds: int) -> list[tuple[int, int, float, float]]:
    """(k, spans answered, CPU with the matches, CPU without) for each k."""
    client = httpx.Client(timeout=600)

    def spent(text: str, deny: str) -> tuple[float, int]:
        best, found = float("inf"), 0
        for _ in range(rounds):
            c0 = cpu(pid)
            r = client.post(url + "/analyze", json={"text": text, "language": "en", "ad_hoc_recognizers": [
                {"supported_entity": "LETTER", "deny_list": [deny]}], "entities": ["LETTER"]})
            time.sleep(0.3)                      # the server's threads settle before the second reading
            best = min(best, cpu(pid) - c0)
            assert r.status_code == 200, r.text[:200]
            found = len(r.json())
        return best, found

    spent("warm up " * 100, "q")                # the first requests' lazy imports and arenas
    rows = []
    for k in ks:
        text = " ".join(["q"] * k)
        with_spans, n = spent(text, "q")
        without, _ = spent(text, "zzz")
        rows.append((k, n, with_spans, without))
    return rows


def post_processing(model_dir: Path, ks: list[int], rounds: int) -> list[tuple[int, float, float]]:
    """(k, the finish's thread CPU with the matches, without) for each k, the best of `rounds`."""
    from rsinfer_cli.config import ModelConfig
    from rsinfer_cli.engine.model import load_model
    from rsinfer_cli.pipelines.pii import PiiPipeline
    from rsinfer_cli.pipelines.pii_rules import request_rules

    pipe = PiiPipeline(load_model(ModelConfig(name="pii", kind="pii", path=str(model_dir), replicas=1)))
    rows = []
    for k in ks:
        text = " ".join(["q"] * k)
        took = []
        for deny in ("q", "zzz"):
            work = pipe.plan_detect([text], rules=request_rules(None, None, "exact", {"LETTER": [deny]}))
            outs = pipe.forwards(work.rows, work.costs)
            best = float("inf")
            for _ in range(rounds):
                c0 = time.thread_time()
                work.finish(outs)
                best = min(best, time.thread_time() - c0)
            took.append(best)
        rows.append((k, took[0], took[1]))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    shared = Path(os.environ.get("RSINFER_SHARED_MODELS") or Path(__file__).resolve().parents[2] / "shared/models")
    ap.add_argument("--model-dir", type=Path, default=shared / "rampart-pii")
    ap.add_argument("--ks", default="5000,10000,20000,40000")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    from serverutil import ServeProcess, free_port

    config = Path(tempfile.mkdtemp(prefix="pii-linear-")) / "rsinfer.yaml"
    config.write_text(yaml.safe_dump({"models": [{"name": "pii", "kind": "pii", "path": str(args.model_dir)}]}))
    srv = ServeProcess(config, free_port())
    try:
        srv.wait_ready(180)
        rows = measure(srv.url, srv.proc.pid, [int(x) for x in args.ks.split(",")], args.rounds)
    finally:
        srv.stop()
    print(f"{'k':>7} {'spans':>7} {'CPU with (s)':>13} {'CPU without (s)':>16} {'ratio':>6} {'x/doubling':>11} "
          f"{'spans alone (s)':>16} {'x/doubling':>11}")
    for i, (k, n, a, b) in enumerate(rows):
        growth = f"{a / rows[i - 1][2]:.2f}" if i else "-"
        extra, before = a - b, (rows[i - 1][2] - rows[i - 1][3]) if i else 0.0
        grew = f"{extra / before:.2f}" if i and before > 0 else "-"
        print(f"{k:>7} {n:>7} {a:>13.3f} {b:>16.3f} {a / b:>6.2f} {growth:>11} {extra:>16.3f} {grew:>11}")
    post = post_processing(args.model_dir, [int(x) for x in args.ks.split(",")], args.rounds)
    print(f"\n{'k':>7} {'finish with (s)':>16} {'finish without (s)':>19} {'spans alone (s)':>16} {'x/doubling':>11}")
    for i, (k, a, b) in enumerate(post):
        grew = f"{(a - b) / (post[i - 1][1] - post[i - 1][2]):.2f}" if i else "-"
        print(f"{k:>7} {a:>16.3f} {b:>19.3f} {a - b:>16.3f} {grew:>11}")
    print(f"date {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
