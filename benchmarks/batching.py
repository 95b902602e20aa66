"""Cross-request batching against the raw ONNX Runtime ceiling and against batching off, in one run.

    .venv/bin/python benchmarks/batching.py            # its section of benchmarks/RESULTS.md

Measured on the same machine in the same run, reported as ratios (the machines are shared and noisy):
  (a) the ceiling: the best in-process tokenize + session.run + pooling throughput over batch sizes, on the same
      texts, the best of two sessions x one intra-op thread and one session x two;
  (b) `rsinfer serve` with batching on, (c) with batching off - both with the default thread plan (no replicas or
      intra_threads; the plan each resolved is printed beside the table);
for 64 concurrent one-text clients (short queries), 8 clients x 16 mixed-length texts, one client with one
text (latency), rerank (1 query x 20 documents) and PII (one paragraph per request). The load generator is an
asyncio client in this process on 127.0.0.1; every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from _serve import Serve, plan_of, write_results

ROOT = Path(__file__).resolve().parent
SHARED = Path(os.environ.get("RSINFER_SHARED_MODELS") or ROOT.parents[1] / "shared" / "models")
WORDS = ("the printing press changed how ideas spread across europe in the fifteenth century while merchants "
         "scholars and priests argued about cost speed accuracy and the value of copying by hand").split()
QUERY_WORDS = "what is the capital of france how do i reset my password where is my parcel".split()


def mixed(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 120))) for _ in range(n)]


def queries(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(QUERY_WORDS) for _ in range(rng.randint(3, 8))) for _ in range(n)]


# ---------------------------------------------------------------- (a) the in-process ceiling


class Raw:
    """The raw pipeline in this process: tokenizers -> session.run -> mean pooling, the baseline of a server."""

    def __init__(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer

        self.model_dir = model_dir
        self.tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tok.no_padding()
        self.tok.enable_truncation(256)

    def session(self, threads: int):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        return ort.InferenceSession(str(self.model_dir / "onnx/model.onnx"), so, providers=["CPUExecutionProvider"])

    def embed(self, sess, texts: list[str]) -> np.ndarray:
        encs = self.tok.encode_batch(texts)
        width = max(len(e.ids) for e in encs)
        ids = np.zeros((len(encs), width), dtype=np.int64)
        mask = np.zeros_like(ids)
        for i, e in enumerate(encs):
            ids[i, :len(e.ids)] = e.ids
            mask[i, :len(e.ids)] = 1
        (h,) = sess.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": mask,
                                                "token_type_ids": np.zeros_like(ids)})
        v = (h * mask[:, :, None]).sum(1) / mask.sum(1, keepdims=True)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    def ceiling(self, texts: list[str], batch_sizes: list[int], sessions: int, threads: int) -> tuple[float, int]:
        """Best texts/s over batch sizes of length-sorted chunks, `sessions` sessions of `threads` threads side by
        side; (rate, batch)."""
        sess = [self.session(threads) for _ in range(sessions)]
        ordered = sorted(texts, key=len)
        best, best_b = 0.0, 1
        for b in batch_sizes:
            chunks = [ordered[i:i + b] for i in range(0, len(ordered), b)]
            for s in sess:
                self.embed(s, chunks[0])
            t0 = time.perf_counter()
            workers = [threading.Thread(target=lambda s=s, part=chunks[k::sessions]: [self.embed(s, c) for c in part])
                       for k, s in enumerate(sess)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            rate = len(texts) / (time.perf_counter() - t0)
            if rate > best:
                best, best_b = rate, b
        return best, best_b

    def single_p50_ms(self, texts: list[str], threads: int) -> float:
        s = self.session(threads)
        for t in texts[:20]:
            self.embed(s, [t])
        lat = []
        for t in texts:
            t0 = time.perf_counter()
            self.embed(s, [t])
            lat.append(time.perf_counter() - t0)
        return statistics.median(lat) * 1000



def ceiling(model_dir: Path, texts: list[str], batch_sizes: list[int]) -> tuple[float, int]:
    """The best in-process texts/s over batch sizes of length-sorted chunks, and its batch size: the best of two
    sessions x one thread and one session x two threads."""
    raw = Raw(model_dir)
    return max(raw.ceiling(texts, batch_sizes, s, t) for s, t in ((2, 1), (1, 2)))


# ---------------------------------------------------------------- (b)/(c) the server


def server(batching: bool, tmp: Path, src: Path | None = None) -> Serve:
    common = f"batching: {{enabled: {str(batching).lower()}}}"
    models = (f"  - {{name: mini, kind: embedding, path: '{SHARED / 'all-minilm-l6-v2'}', {common}}}\n"
              f"  - {{name: rr, kind: rerank, path: '{SHARED / 'tiny-reranker-1'}', {common}}}\n"
              f"  - {{name: pii, kind: pii, path: '{SHARED / 'rampart-pii'}', {common}}}\n")
    return Serve(models, tmp, "max_queue: 1024", name=f"batching-{batching}-{'before' if src else 'now'}", src=src)


async def drive(url: str, route: str, bodies: list[dict], clients: int, max_s: float) -> dict:
    """`clients` keep-alive connections, each sending its next request when the previous answer is in. A bare
    HTTP/1.1 client on asyncio streams: the load generator shares the 2 cores with the server, so it is kept
    as cheap as possible (aiohttp's client costs several times more CPU per request)."""
    host = url.removeprefix("http://").split(":")[0]
    requests = [(f"POST {route} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(p)}\r\n\r\n").encode() + p
                for p in (json.dumps(b).encode() for b in bodies)]
    return await drive_raw(url, requests, clients, max_s)


async def drive_raw(url: str, requests: list[bytes], clients: int, max_s: float) -> dict:
    """`drive` with the requests already written out (any headers and body, e.g. KServe's binary extension)."""
    host, port = url.removeprefix("http://").split(":")
    lat: list[float] = []
    errors = 0
    i = 0
    deadline = time.monotonic() + max_s

    async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: bytes) -> int:
        writer.write(raw)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = int(head.lower().split(b"\r\ncontent-length:")[1].split(b"\r\n")[0])   # not inference-header-…
        await reader.readexactly(length)
        return status

    async def client(warm: bool) -> None:
        nonlocal i, errors
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            if warm:
                await exchange(reader, writer, requests[0])
            while i < len(requests) and time.monotonic() < deadline:
                raw = requests[i]
                i += 1
                t0 = time.perf_counter()
                if await exchange(reader, writer, raw) != 200:
                    errors += 1
                    continue
                lat.append(time.perf_counter() - t0)
        finally:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client(k < 4) for k in range(clients)))
    elapsed = time.perf_counter() - t0
    return {"requests": len(lat), "errors": errors, "rps": len(lat) / elapsed,
            "p50_ms": float(np.percentile(lat, 50) * 1000) if lat else 0.0,
            "p95_ms": float(np.percentile(lat, 95) * 1000) if lat else 0.0,
            "p99_ms": float(np.percentile(lat, 99) * 1000) if lat else 0.0}


def profiled(srv, route: str, bodies: list[dict], clients: int, clock=None):
    """cProfile of an in-process server's event-loop thread (tests/serverutil.ServerThread `srv`) while
    `clients` drive `route` with `bodies` (after a warm-up); `clock`: the profiler's timer (default: wall)."""
    import cProfile

    prof = cProfile.Profile(clock) if clock is not None else cProfile.Profile()
    asyncio.run(drive(srv.url, route, bodies[:200], clients, 30))
    started = threading.Event()
    srv._loop.call_soon_threadsafe(lambda: (prof.enable(), started.set()))
    started.wait(5)
    asyncio.run(drive(srv.url, route, bodies[:1500], clients, 60))
    done = threading.Event()
    srv._loop.call_soon_threadsafe(lambda: (prof.disable(), done.set()))
    done.wait(5)
    return prof


def ceilings(loads: dict) -> tuple[float, int, float, int]:
    """The in-process ceiling (texts/s, best batch) of the short queries and of the mixed texts of `loads`."""
    short_texts = [b["input"] for b in loads["64 clients x 1 short query"][1][:1000]]
    mixed_texts = [t for b in loads["8 clients x 16 mixed texts"][1] for t in b["input"]]
    ceil_short, b_short = ceiling(SHARED / "all-minilm-l6-v2", short_texts, [1, 8, 16, 32, 64])
    ceil_mixed, b_mixed = ceiling(SHARED / "all-minilm-l6-v2", mixed_texts, [1, 4, 8, 16])
    return ceil_short, b_short, ceil_mixed, b_mixed


def workloads() -> dict[str, tuple[str, list[dict], int, int]]:
    """name → (route, request bodies, clients, texts per request)."""
    short = queries(3000, 1)
    mixed_texts = mixed(1600, 2)
    paragraphs = [f"Hi, this is Alex Rivera. {' '.join(mixed(1, k)[0].split()[:40])} Reach me at "
                  f"alex{k}@example.com or (415) 555-{k:04d}." for k in range(300)]
    return {
        "64 clients x 1 short query": ("/v1/embeddings", [{"model": "mini", "input": q} for q in short], 64, 1),
        "8 clients x 16 mixed texts": ("/v1/embeddings", [{"model": "mini", "input": mixed_texts[k:k + 16]}
                                                          for k in range(0, 1600, 16)], 8, 16),
        "1 client x 1 text (latency)": ("/v1/embeddings", [{"model": "mini", "input": q} for q in short[:300]], 1, 1),
        "rerank 1 query x 20 docs": ("/v1/rerank", [{"model": "rr", "query": "where is my parcel",
                                                    "documents": mixed_texts[k:k + 20]} for k in range(0, 1600, 20)],
                                     8, 20),
        "pii 1 paragraph": ("/pii/redact", [{"model": "pii", "text": p} for p in paragraphs], 16, 1),
    }


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import onnxruntime

    return (f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"onnxruntime {onnxruntime.__version__}; run on {time.strftime('%Y-%m-%d')}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-seconds", type=float, default=30, help="per workload and mode")
    ap.add_argument("--out", type=Path, default=ROOT / "RESULTS.md")
    ap.add_argument("--only", help="comma-separated workload prefixes to run (e.g. pii,rerank); default: all")
    ap.add_argument("--before-src", type=Path, help="also run another checkout's src/ with batching on, side by side")
    ap.add_argument("--before-label", help="what the before side is, for the table (default: its path)")
    args = ap.parse_args()
    loads = workloads()
    ceil_short, b_short, ceil_mixed, b_mixed = ceilings(loads)
    if args.only:
        loads = {k: v for k, v in loads.items() if any(k.startswith(p.strip()) for p in args.only.split(","))}
    results: dict[str, dict[str, dict]] = {}
    plans: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        modes = [("on", True, None), ("off", False, None)]
        if args.before_src:   # before, now, off, then now and before again (ABBA): drift favours neither side
            modes = [("before", True, args.before_src), *modes, ("on 2", True, None),
                     ("before 2", True, args.before_src)]
        for mode, batching, src in modes:
            srv = server(batching, Path(tmp), src)
            try:
                if mode == "on":
                    plans = {m: plan_of(srv.url, m) for m in ("mini", "rr", "pii")}
                for name, (route, bodies, clients, _) in loads.items():
                    r = asyncio.run(drive(srv.url, route, bodies, clients, args.max_seconds))
                    results.setdefault(name, {})[mode] = r
            finally:
                srv.stop()
    rows = []
    for name, (_, _, _, per) in loads.items():
        on, off = results[name]["on"], results[name]["off"]
        ceil = ceil_short if "short" in name or "latency" in name else ceil_mixed if "mixed" in name else None
        rows.append({"workload": name, "on_texts_s": on["rps"] * per, "off_texts_s": off["rps"] * per,
                     "on_over_off": on["rps"] / off["rps"] if off["rps"] else 0.0,
                     "on_over_ceiling": on["rps"] * per / ceil if ceil else None,
                     "p50_on_ms": on["p50_ms"], "p50_off_ms": off["p50_ms"],
                     "errors": on["errors"] + off["errors"]})
    text = ["## Cross-request batching against the ceiling (`batching.py`)", "",
            f"Machine: {machine()}.", "",
            "Reproduce: `.venv/bin/python benchmarks/batching.py`. Ceiling = best in-process "
            "tokenize + session.run + mean pooling over batch sizes on the same texts, the best of 2 sessions x 1 "
            "thread and 1 x 2: "
            f"{ceil_short:.1f} texts/s for the short queries (batch {b_short}), {ceil_mixed:.1f} texts/s for the "
            f"mixed texts (batch {b_mixed}). Server: the default config, batching on vs off; its thread plan: "
            + "; ".join(f"{m} {p}" for m, p in plans.items()) + ".", "",
            "| workload | texts/s on | texts/s off | on / off | on / ceiling | p50 on (ms) | p50 off (ms) | errors |",
            "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['on_over_ceiling']:.2f}" if r["on_over_ceiling"] is not None else "-"
        text.append(f"| {r['workload']} | {r['on_texts_s']:.1f} | {r['off_texts_s']:.1f} | {r['on_over_off']:.2f} "
                    f"| {ratio} | {r['p50_on_ms']:.1f} | {r['p50_off_ms']:.1f} | {r['errors']} |")
    from charts import draw

    ceiling_of = {"short": ceil_short, "mixed": ceil_mixed}    # one client has no batch to reach
    draw("batching", {"title": "Texts per second per workload, cross-request batching on and off",
                      "note": f"benchmarks/batching.py, all-MiniLM-L6-v2, tiny-reranker-1 and rampart-pii, the "
                              f"default config, on {machine()}",
                      "rows": [{"workload": r["workload"], "on": r["on_texts_s"], "off": r["off_texts_s"],
                                "ceiling": next((c for k, c in ceiling_of.items() if k in r["workload"]), None)}
                               for r in rows]})
    text += ["", "Drawn in `docs/charts/batching.png` (on the docs' performance page): texts/s per workload, batching "
             "on and off, beside the in-process ceiling.", ""]
    lat = next((r for r in rows if "latency" in r["workload"]), None)
    if lat is not None:
        text += ["", f"One client, one text: p50 with batching on / off = {lat['p50_on_ms'] / lat['p50_off_ms']:.2f}.",
                 ""]
    if args.before_src:
        text += [f"Before ({args.before_label or args.before_src}) and now, both batching on, the same run, each the "
                 "mean of two passes "
                 "in ABBA order:", "",
                 "| workload | texts/s before | texts/s now | now / before | p50 before (ms) | p50 now (ms) |",
                 "|---|---|---|---|---|---|"]
        for name, (_, _, _, per) in loads.items():
            res = results[name]
            b = {k: (res["before"][k] + res["before 2"][k]) / 2 for k in ("rps", "p50_ms")}
            n = {k: (res["on"][k] + res["on 2"][k]) / 2 for k in ("rps", "p50_ms")}
            text.append(f"| {name} | {b['rps'] * per:.1f} | {n['rps'] * per:.1f} | "
                        f"{n['rps'] / b['rps'] if b['rps'] else 0:.2f} | {b['p50_ms']:.1f} | {n['p50_ms']:.1f} |")
        text.append("")
    return write_results(args.out, text)


if __name__ == "__main__":
    sys.exit(main())
