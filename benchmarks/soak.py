"""Soak: 16 clients mix every family's requests with bad ones for a while; the server's whole process tree's RSS is
sampled every 10 s.

    .venv/bin/python benchmarks/soak.py --minutes 30          # its section of benchmarks/RESULTS.md

`rsinfer serve` with its defaults (logging at info, an access line per request) on the shared models: an
embedding model, a reranker, an NLI model, the PII model, a classifier and a KServe tensor model. Each client sends
the next request when its answer is in, picked at random: a good request to one of the six (random texts, so the
forwards vary), or a bad one - broken JSON, an unknown model, a body over `server.max_body_mb` (1 MiB here), a tensor
of the wrong shape, a field of the wrong type. It passes when no answer is a 5xx or a broken connection, every good
request gets 200 and every bad one a 4xx, and the tree's RSS at the end is within 2 % of its RSS at minute
`--settle` (the first minutes fill the allocator's pools and ORT's arenas). Loopback only; every loop is bounded in
time and in count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from _serve import Serve, tree_cpu_seconds, write_results
from batching import ROOT, SHARED, machine

CLIENTS = 16
WORDS = ("the printing press changed how ideas spread across europe while merchants scholars and priests argued "
         "about cost speed accuracy and the value of copying my parcel never came please call alex rivera at "
         "alex.rivera@example.com or +1 415 555 0100").split()


def text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 60)))


def tensor(shape: list[int]) -> dict[str, object]:
    return {"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32", "data": [0.5] * (shape[0] * shape[1])}]}


def request(rng: random.Random) -> tuple[str, bytes, bool]:
    """(route, body, whether it is a good request)."""
    pick = rng.random()
    if pick < 0.8:
        route, body = rng.choice([
            ("/v1/embeddings", lambda: {"model": "mini", "input": [text(rng) for _ in range(rng.randint(1, 4))]}),
            ("/v1/rerank", lambda: {"model": "rr", "query": text(rng), "documents": [text(rng) for _ in range(5)]}),
            ("/classify/zero-shot", lambda: {"model": "nli", "input": text(rng),
                                             "candidate_labels": ["shipping", "billing", "other"]}),
            ("/pii/redact", lambda: {"model": "pii", "text": text(rng)}),
            ("/classify", lambda: {"model": "cls", "input": [text(rng)]}),
            ("/v2/models/add/infer", lambda: tensor([rng.randint(1, 4), 4])),
        ])
        return route, json.dumps(body()).encode(), True
    bad = rng.choice([
        ("/v1/embeddings", b'{"model": "mini", "input": ["unterminated'),          # broken JSON
        ("/v1/embeddings", json.dumps({"model": "nope", "input": ["x"]}).encode()),  # unknown model
        ("/v1/embeddings", json.dumps({"model": "mini", "input": ["x" * (3 << 19)]}).encode()),  # over 1 MiB
        ("/v2/models/add/infer", json.dumps(tensor([1, 3])).encode()),             # wrong shape
        ("/v1/rerank", json.dumps({"model": "rr", "query": 7, "documents": "a"}).encode()),   # wrong types
    ])
    return bad[0], bad[1], False


def tree_rss_bytes(pid: int) -> int:
    total = 0
    for p in tree_cpu_seconds(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                total += next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            continue
    return total


async def soak(url: str, pid: int, seconds: float, max_requests: int) -> dict[str, object]:
    import aiohttp

    counts = {"ok": 0, "4xx": 0, "5xx": 0, "unexpected": 0, "broken": 0}
    samples: list[tuple[float, int, int]] = []        # (seconds in, requests so far, tree RSS)
    examples: list[str] = []
    t0 = time.monotonic()
    end = t0 + seconds
    done = 0

    async def client(seed: int, session: aiohttp.ClientSession) -> None:
        nonlocal done
        rng = random.Random(seed)
        while time.monotonic() < end and done < max_requests:
            route, body, good = request(rng)
            try:
                async with session.post(url + route, data=body,
                                        headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    status = r.status
            except aiohttp.ClientError as exc:
                counts["broken"] += 1
                if len(examples) < 5:
                    examples.append(f"{route}: {type(exc).__name__}")
                continue
            done += 1
            if status >= 500:
                counts["5xx"] += 1
            elif status >= 400:
                counts["4xx"] += 1
            else:
                counts["ok"] += 1
            if (status == 200) != good:
                counts["unexpected"] += 1
                if len(examples) < 5:
                    examples.append(f"{route} {'good' if good else 'bad'} → {status}")

    async def sampler() -> None:
        while time.monotonic() < end:
            samples.append((time.monotonic() - t0, done, tree_rss_bytes(pid)))
            await asyncio.sleep(min(10.0, max(0.0, end - time.monotonic())))
        samples.append((time.monotonic() - t0, done, tree_rss_bytes(pid)))

    connector = aiohttp.TCPConnector(limit=CLIENTS)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(sampler(), *(client(i, session) for i in range(CLIENTS)))
    return {"counts": counts, "samples": samples, "examples": examples, "seconds": time.monotonic() - t0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--settle", type=float, default=5, help="the minute whose RSS the end is held to")
    ap.add_argument("--max-requests", type=int, default=10_000_000)
    ap.add_argument("--out", type=Path, default=ROOT / "RESULTS.md")
    ap.add_argument("--src", type=Path, help="serve another checkout's src/ (a before side, run beside this one)")
    ap.add_argument("--label", default="", help="what the section calls the server (e.g. a commit)")
    args = ap.parse_args()
    models = "\n".join([
        f"  - {{name: mini, kind: embedding, path: '{SHARED / 'all-minilm-l6-v2'}'}}",
        f"  - {{name: rr, kind: rerank, path: '{SHARED / 'tiny-reranker-1'}'}}",
        f"  - {{name: nli, kind: zeroshot, path: '{SHARED / 'tiny-nli'}'}}",
        f"  - {{name: pii, kind: pii, path: '{SHARED / 'rampart-pii'}'}}",
        f"  - {{name: cls, kind: classifier, path: '{SHARED / 'tiny-textcls'}'}}",
        f"  - {{name: add, kind: tensor, path: '{SHARED / 'tensor-models' / 'add_one'}', max_batch_size: 8}}",
    ])
    with tempfile.TemporaryDirectory() as tmp, \
            Serve(models, Path(tmp), server_yaml="max_body_mb: 1", log_level="info", src=args.src) as srv:
        res = asyncio.run(soak(srv.url, srv.proc.pid, args.minutes * 60, args.max_requests))
    counts: dict[str, int] = res["counts"]  # type: ignore[assignment]
    samples: list[tuple[float, int, int]] = res["samples"]  # type: ignore[assignment]
    settle = next((s for s in samples if s[0] >= args.settle * 60), samples[0])
    last = samples[-1]
    growth = (last[2] - settle[2]) / settle[2]
    passed = counts["5xx"] == 0 and counts["broken"] == 0 and counts["unexpected"] == 0 and abs(growth) <= 0.02
    requests = sum(counts[k] for k in ("ok", "4xx", "5xx"))
    every = max(1, len(samples) // 12)
    label = f" ({args.label})" if args.label else ""
    lines = ["", "", f"## Soak: every family's requests mixed with bad ones{label} (`soak.py`)", "",
             f"Machine: {machine()}. Reproduce: `.venv/bin/python "
             f"benchmarks/soak.py --minutes {args.minutes:g} --settle {args.settle:g}` ({CLIENTS} clients on "
             "127.0.0.1, the defaults, logging at info; the whole process tree's RSS every 10 s).", "",
             f"{requests} requests in {res['seconds'] / 60:.1f} min ({requests / res['seconds']:.0f}/s): "
             f"{counts['ok']} answered 200, {counts['4xx']} refused with a 4xx (the bad ones), {counts['5xx']} 5xx, "
             f"{counts['broken']} broken connections, {counts['unexpected']} answers not what the request called "
             f"for. RSS {settle[2] / 2**20:.0f} MiB at minute {settle[0] / 60:.1f}, {last[2] / 2**20:.0f} MiB at "
             f"the end: {growth * 100:+.2f} % (limit ±2 %). {'PASS' if passed else 'FAIL'}.", "",
             "| minute | requests so far | tree RSS (MiB) |", "|---|---|---|"]
    shown = samples[::every] + ([last] if (len(samples) - 1) % every else [])
    lines += [f"| {s[0] / 60:.1f} | {s[1]} | {s[2] / 2**20:.1f} |" for s in shown]
    if res["examples"]:
        lines += ["", "Examples: " + "; ".join(res["examples"])]  # type: ignore[arg-type]
    write_results(args.out, lines + [""])
    return 0 if passed else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
