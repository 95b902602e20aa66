"""The server CPU one small request costs: the whole process tree's user+sys CPU per request, from /proc.

    .venv/bin/python benchmarks/overhead.py                       # its section of benchmarks/RESULTS.md
    .venv/bin/python benchmarks/overhead.py --before-src <checkout>/src   # the same, an older checkout beside

Workloads, 64 clients on 127.0.0.1, each the next request when its answer is in: `add_one` ([1, 4] FP32, a forward
of a few µs) over KServe v2 REST JSON, REST with the binary tensor extension, and gRPC (tritonclient.grpc.aio), and a
one-token `/v1/embeddings` on all-MiniLM-L6-v2; each with `server.workers` 1 and 2. Reported: requests/s, CPU per
request of the whole tree (front ends, engine, supervisor) and, with workers, of the engine process alone; the
model's forward time (rsinfer_inference_seconds) per request, and the engine's CPU beside its forwards. Rounds: each
configuration twice, the second pass in reverse order (ABBA), the spread shown. The server logs at info, the
default: an access line per request.
`--pin`: the server on CPU 0 and the load generator on CPU 1 (requests/s per server core).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import struct
import sys
import tempfile
import time
from pathlib import Path

import orjson
from _serve import Serve, free_port, inference_sum, spread, tree_cpu_seconds, write_results
from batching import ROOT, SHARED, drive_raw, machine

ADD = SHARED / "tensor-models" / "add_one"
MINI = SHARED / "all-minilm-l6-v2"
CLIENTS = 64


def _post(host: str, route: str, body: bytes, extra: str = "", ctype: str = "application/json") -> bytes:
    return (f"POST {route} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {ctype}\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def kserve_json(host: str, n: int) -> list[bytes]:
    return [_post(host, "/v2/models/add/infer", json.dumps({"inputs": [
        {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [float(i % 7), 2.0, 3.0, 4.0]}]}).encode())
        for i in range(n)]


def kserve_binary(host: str, n: int) -> list[bytes]:
    out = []
    for i in range(n):
        head = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32",
                                       "parameters": {"binary_data_size": 16}}],
                           "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
        body = head + struct.pack("<4f", float(i % 7), 2.0, 3.0, 4.0)
        out.append(_post(host, "/v2/models/add/infer", body, f"Inference-Header-Content-Length: {len(head)}\r\n",
                         "application/octet-stream"))
    return out


def embed_one_token(host: str, n: int) -> list[bytes]:
    words = ["hi", "yes", "no", "ok", "cat", "dog", "sun", "sea"]
    return [_post(host, "/v1/embeddings", json.dumps({"model": "mini", "input": words[i % 8]}).encode())
            for i in range(n)]


async def grpc_load(target: str, max_s: float) -> dict:
    import numpy as np
    import tritonclient.grpc.aio as tg

    client = tg.InferenceServerClient(target)
    data = np.array([[1, 2, 3, 4]], dtype=np.float32)
    done = errors = 0
    deadline = time.monotonic() + max_s

    async def one() -> None:
        nonlocal done, errors
        while time.monotonic() < deadline:
            inp = tg.InferInput("INPUT0", [1, 4], "FP32")
            inp.set_data_from_numpy(data)
            try:
                await client.infer("add", [inp])
                done += 1
            except Exception:  # noqa: BLE001 - counted, the run goes on
                errors += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(CLIENTS)))
    elapsed = time.perf_counter() - t0
    await client.close()
    return {"requests": done, "errors": errors, "rps": done / elapsed}


class Raw:
    """The baseline of each workload, from the same run: the raw pipeline in-process, with no server - the request's
    body decoded, `session.run` on one thread (the lane a request gets under load), the answer encoded - in CPU µs per
    request (process time over a loop, the best of three); add_one one request per forward (the server runs it so),
    the embedding in batches of the load's 64 (as the server batches it under load). A server's CPU per request ÷
    this is the cost of serving, and stays comparable between runs on a machine whose speed drifts (this one's varies
    by 1.5-2x within hours)."""

    def __init__(self) -> None:
        import numpy as np
        import onnxruntime as ort
        from tokenizers import Tokenizer

        from rsinfer_cli.server.kserve import kserve_pb2 as pb

        so = ort.SessionOptions()
        so.intra_op_num_threads = so.inter_op_num_threads = 1
        self.np, self.pb = np, pb        # imported once, not in the timed loops
        self.add = ort.InferenceSession(str(ADD / "model.onnx"), so, providers=["CPUExecutionProvider"])
        graph = next(p for p in (MINI / "onnx" / "model.onnx", MINI / "model.onnx") if p.exists())
        self.mini = ort.InferenceSession(str(graph), so, providers=["CPUExecutionProvider"])
        self.tok = Tokenizer.from_file(str(MINI / "tokenizer.json"))
        self.tok.no_padding()          # its tokenizer.json pads to 128; a request of one text is not padded
        makers = {"KServe JSON add_one": kserve_json, "KServe binary add_one": kserve_binary,
                  "one-token /v1/embeddings": embed_one_token}
        self.bodies = {name: [r.split(b"\r\n\r\n", 1)[1] for r in make("127.0.0.1:1", 64)]
                       for name, make in makers.items()}

    def json_add(self, body: bytes) -> bytes:
        np = self.np
        t = orjson.loads(body)["inputs"][0]
        y = self.add.run(None, {t["name"]: np.asarray(t["data"], np.float32).reshape(t["shape"])})[0]
        return orjson.dumps({"model_name": "add", "model_version": "1", "outputs": [
            {"name": "OUTPUT0", "datatype": "FP32", "shape": list(y.shape), "data": y.reshape(-1).tolist()}]})

    def binary_add(self, body: bytes) -> bytes:
        np = self.np
        n = len(body) - 16
        t = orjson.loads(body[:n])["inputs"][0]
        y = self.add.run(None, {t["name"]: np.frombuffer(body[n:], np.float32).reshape(t["shape"])})[0]
        head = orjson.dumps({"model_name": "add", "model_version": "1", "outputs": [
            {"name": "OUTPUT0", "datatype": "FP32", "shape": list(y.shape), "parameters": {"binary_data_size": 16}}]})
        return head + y.tobytes()

    def grpc_add(self, raw: bytes) -> bytes:
        np, pb = self.np, self.pb
        req = pb.ModelInferRequest.FromString(raw)
        y = self.add.run(None, {"INPUT0": np.frombuffer(req.raw_input_contents[0], np.float32).reshape(1, 4)})[0]
        out = pb.ModelInferResponse(model_name="add", model_version="1")
        out.outputs.add(name="OUTPUT0", datatype="FP32", shape=list(y.shape))
        out.raw_output_contents.append(y.tobytes())
        return out.SerializeToString()

    def embed(self, bodies: list[bytes]) -> list[bytes]:
        """Requests of one text each, as one batch: the baseline under load is the batched pipeline (every word
        here is one token, so the batch needs no padding)."""
        np = self.np
        encs = self.tok.encode_batch([orjson.loads(b)["input"] for b in bodies])
        ids = np.array([e.ids for e in encs], np.int64)
        mask = np.array([e.attention_mask for e in encs], np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        hidden = self.mini.run(None, {i.name: feeds[i.name] for i in self.mini.get_inputs()})[0]
        pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
        pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
        return [orjson.dumps({"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": v.tolist()}]})
                for v in pooled]

    def us(self, workload: str) -> float:
        """CPU µs per request of the workload's raw pipeline, the best of three loops."""
        pb = self.pb
        if workload == "KServe gRPC add_one":
            req = pb.ModelInferRequest(model_name="add")
            req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
            req.raw_input_contents.append(self.np.array([1, 2, 3, 4], self.np.float32).tobytes())
            fn, bodies = self.grpc_add, [req.SerializeToString()] * 64
        elif "embeddings" in workload:          # batches of CLIENTS requests (the load's concurrency)
            batch = self.bodies[workload][:CLIENTS]
            best = math.inf
            for _ in range(3):
                t0 = time.process_time()
                for _ in range(10):
                    self.embed(batch)
                best = min(best, time.process_time() - t0)
            return 1e6 * best / (10 * len(batch))
        else:
            fn = {"KServe JSON add_one": self.json_add, "KServe binary add_one": self.binary_add}[workload]
            bodies = self.bodies[workload]
        n = 3000
        best = math.inf
        for _ in range(3):
            t0 = time.process_time()
            for i in range(n):
                fn(bodies[i % len(bodies)])
            best = min(best, time.process_time() - t0)
        return 1e6 * best / n


def config(workers: int, grpc_port: int) -> tuple[str, str]:
    models = (f"  - {{name: add, kind: tensor, path: '{ADD}'}}\n"
              f"  - {{name: mini, kind: embedding, path: '{MINI}'}}\n")
    server = f"workers: {workers}, grpc_bind: '127.0.0.1:{grpc_port}'"   # the defaults; gRPC needs its bind
    return models, server


def engine_pid(tree: dict[int, float], root: int) -> int | None:
    """The engine child of a worker tree: the process named rsinfer-<device> (front ends are rsinfer-frontN)."""
    for pid in tree:
        if pid == root:
            continue
        try:
            with open(f"/proc/{pid}/comm") as f:
                name = f.read().strip()
            if name.startswith("rsinfer-") and not name.startswith("rsinfer-front"):
                return pid
        except OSError:
            continue
    return None


def measure(src: Path | None, workers: int, max_s: float, tmp: Path, label: str, pin: bool,
            raw: Raw) -> dict[str, dict]:
    grpc_port = free_port()
    models, server = config(workers, grpc_port)
    srv = Serve(models, tmp, server, name=f"overhead-{label}-{workers}", src=src, log_level="info",
                cpus="0" if pin else None)
    host = "127.0.0.1"
    out: dict[str, dict] = {}
    try:
        loads = {"KServe JSON add_one": kserve_json(host, 200_000),
                 "KServe binary add_one": kserve_binary(host, 200_000),
                 "KServe gRPC add_one": None, "one-token /v1/embeddings": embed_one_token(host, 200_000)}
        for name, requests in loads.items():
            raw_us = raw.us(name)        # the baseline, just before (the server idle)
            warm = asyncio.run(drive_raw(srv.url, requests[:500], 8, 5)) if requests else None
            del warm
            tree0 = tree_cpu_seconds(srv.proc.pid)
            model = "mini" if "embeddings" in name else "add"
            f0 = inference_sum(srv.url, model)
            if requests is None:
                r = asyncio.run(grpc_load(f"127.0.0.1:{grpc_port}", max_s))
            else:
                r = asyncio.run(drive_raw(srv.url, requests, CLIENTS, max_s))
            tree1 = tree_cpu_seconds(srv.proc.pid)
            f1 = inference_sum(srv.url, model)
            n = max(r["requests"], 1)
            eng = engine_pid(tree1, srv.proc.pid) if workers > 1 else None
            forward = 1e6 * (f1 - f0) / n
            engine = 1e6 * (tree1[eng] - tree0.get(eng, 0.0)) / n if eng else None
            out[name] = {
                "rps": r["rps"], "errors": r["errors"], "raw_us": raw_us,
                "cpu_us": 1e6 * sum(tree1[p] - tree0.get(p, 0.0) for p in tree1) / n,
                "engine_us": engine, "forward_us": forward,
                # only where the forwards run on the engine's loop (tiny ones): a forward on a worker thread has a
                # wall time that is not the engine's CPU (it waits for the GIL, and its ORT threads run beside it)
                "engine_beside_us": engine - forward if engine is not None and "embeddings" not in name else None,
            }
    finally:
        srv.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before-src", type=Path)
    ap.add_argument("--max-seconds", type=float, default=12)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--out", type=Path, default=ROOT / "RESULTS.md")
    ap.add_argument("--pin", action="store_true",
                    help="the server on CPU 0 (taskset), this load generator on CPU 1: requests/s per server core")
    args = ap.parse_args()
    if args.pin:
        os.sched_setaffinity(0, {1})
    sides = ([("before", args.before_src)] if args.before_src else []) + [("now", None)]
    plan = [(side, src, int(w)) for w in args.workers.split(",") for side, src in sides]
    runs: dict[tuple[str, int], list[dict[str, dict]]] = {}
    raw = Raw()
    with tempfile.TemporaryDirectory() as tmp:
        for k, order in enumerate((plan, plan[::-1])):            # ABBA
            for side, src, workers in order:
                runs.setdefault((side, workers), []).append(measure(src, workers, args.max_seconds, Path(tmp),
                                                                    f"{side}{k}", args.pin, raw))
    lines = ["", "## Server CPU per small request (`overhead.py`)", "",
             f"Machine: {machine()}. Reproduce: `.venv/bin/python benchmarks/overhead.py"
             f"{' --before-src <checkout>/src' if args.before_src else ''}` ({CLIENTS} clients on 127.0.0.1, "
             f"{args.max_seconds:.0f} s per workload, every configuration twice in ABBA order; CPU = the whole "
             "process tree's user+sys from /proc per answered request; log level info, the default: an access line "
             "per request; " + ("the server pinned to CPU 0, the load generator to CPU 1)" if args.pin else
                                "the load generator shares the machine)") + ". "
             "Each cell: the mean of the two passes, their spread in brackets.", "",
             "Forward = the model's forwards (`rsinfer_inference_seconds`, wall time around each `session.run` and "
             "its batch assembly) per request; with workers, the engine beside its forwards = the engine's CPU less "
             "that, for the tiny add_one only (its forwards run on the engine's event loop, so their wall time is "
             "CPU time; the embedding's run on worker threads). Raw = the baseline: the same request's raw pipeline "
             "in-process, no server (decode, `session.run` on one thread, encode), CPU µs measured just before each "
             "cell; × raw = the server's CPU per request over it.", "",
             "| workload | side | workers | requests/s | CPU µs/request | raw µs | × raw | engine µs/request "
             "| forward µs/request | engine beside forwards | errors |", "|---" * 11 + "|"]

    names = list(next(iter(runs.values()))[0])
    for name in names:
        for (side, workers), passes in runs.items():
            rows = [p[name] for p in passes]
            eng = [r["engine_us"] for r in rows if r["engine_us"] is not None]
            fwd = [r["forward_us"] for r in rows if r["forward_us"] is not None]
            beside = [r["engine_beside_us"] for r in rows if r.get("engine_beside_us") is not None]
            ratio = [r["cpu_us"] / r["raw_us"] for r in rows]
            lines.append(f"| {name} | {side} | {workers} | {spread([r['rps'] for r in rows], '.0f')} | "
                         f"{spread([r['cpu_us'] for r in rows], '.0f')} | {spread([r['raw_us'] for r in rows], '.0f')} "
                         f"| {spread(ratio, '.2f')} | {spread(eng, '.0f') if eng else '-'} | "
                         f"{spread(fwd, '.0f') if fwd else '-'} | {spread(beside, '.0f') if beside else '-'} | "
                         f"{sum(r['errors'] for r in rows)} |")
    lines.append("")
    return write_results(args.out, lines)


if __name__ == "__main__":
    sys.exit(main())
