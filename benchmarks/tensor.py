"""Tensor serving (KServe v2) against raw onnxruntime, in one run.

    .venv/bin/python benchmarks/tensor.py            # its section of benchmarks/RESULTS.md

add_one ([batch, 4] float32 + 1), the default thread plan (no replicas or intra_threads). Measured:
  - latency: p50 of one [1, 4] request with the real tritonclient over HTTP (binary tensors) and over gRPC, against
    a raw `session.run` of the same [1, 4] in-process (one thread); and of a call that does nothing (HTTP
    /v2/health/live, gRPC ServerLive) on rsinfer and on a bare grpc.aio server, which says how much of the gRPC
    cost is grpcio's own;
  - throughput: rows/s for 64 concurrent clients each sending [1, 4] requests over HTTP/JSON, with dynamic batching
    on (max_batch_size 64) and off (max_batch_size 0), against the raw ceiling: the same rows in-process in
    batches of the best size on two sessions x one thread.
The load generator is a bare asyncio HTTP/1.1 client on 127.0.0.1; every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from _serve import Serve, free_port, write_results
from batching import ROOT, SHARED, drive, machine

MODEL = SHARED / "tensor-models" / "add_one"


def raw(reps: int) -> tuple[float, float, int]:
    """(p50 ms of one [1,4] session.run, best rows/s over batch sizes on two sessions x one thread, its batch)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sessions = [ort.InferenceSession(str(MODEL / "model.onnx"), so, providers=["CPUExecutionProvider"])
                for _ in range(2)]
    x = np.ones((1, 4), np.float32)
    for _ in range(100):
        sessions[0].run(None, {"INPUT0": x})
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        sessions[0].run(None, {"INPUT0": x})
        times.append(time.perf_counter() - t0)
    best, best_b = 0.0, 1
    rows = 20_000
    for b in (1, 8, 32, 64):
        batch = np.ones((b, 4), np.float32)

        def work(s, n=rows // b // 2, batch=batch) -> None:
            for _ in range(n):
                s.run(None, {"INPUT0": batch})

        t0 = time.perf_counter()
        threads = [threading.Thread(target=work, args=(s,)) for s in sessions]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rate = (rows // b // 2) * 2 * b / (time.perf_counter() - t0)
        if rate > best:
            best, best_b = rate, b
    return statistics.median(times) * 1000, best, best_b


def bare_grpc_server(port: int) -> None:
    """A grpc.aio server that answers ServerLive and nothing else: the gRPC stack's own cost."""
    import grpc

    from rsinfer_cli.server.kserve import kserve_pb2 as pb
    from rsinfer_cli.server.kserve import kserve_pb2_grpc as pb_grpc

    class Live(pb_grpc.GRPCInferenceServiceServicer):
        async def ServerLive(self, request, context):  # noqa: N802 - the protocol's name
            return pb.ServerLiveResponse(live=True)

    async def run() -> None:
        server = grpc.aio.server()
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(Live(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print("ready", flush=True)
        await asyncio.wait_for(server.wait_for_termination(), 600)

    asyncio.run(run())


def p50_ms(call, reps: int) -> float:
    for _ in range(20):
        call()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def noop_latency(http_url: str, grpc_url: str, reps: int) -> tuple[float, float, float]:
    """p50 of a call that does nothing: rsinfer's HTTP live, its gRPC ServerLive, a bare grpc.aio ServerLive."""
    import subprocess

    import tritonclient.grpc as tg
    import tritonclient.http as th

    port = free_port()
    bare = subprocess.Popen([sys.executable, __file__, "--bare-grpc", str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert bare.stdout is not None and bare.stdout.readline().strip() == "ready"
        got = (p50_ms(th.InferenceServerClient(http_url.removeprefix("http://")).is_server_live, reps),
               p50_ms(tg.InferenceServerClient(grpc_url).is_server_live, reps),
               p50_ms(tg.InferenceServerClient(f"127.0.0.1:{port}").is_server_live, reps))
    finally:
        bare.kill()
        bare.wait(10)
    return got


def client_latency(http_url: str, grpc_url: str, reps: int) -> tuple[float, float]:
    import tritonclient.grpc as tg
    import tritonclient.http as th

    x = np.ones((1, 4), np.float32)
    h = th.InferenceServerClient(http_url.removeprefix("http://"))
    g = tg.InferenceServerClient(grpc_url)
    out: list[float] = []
    for kind, client, mod in (("http", h, th), ("grpc", g, tg)):
        times = []
        for k in range(reps + 20):
            i = mod.InferInput("INPUT0", [1, 4], "FP32")
            if kind == "http":
                i.set_data_from_numpy(x, binary_data=True)
                outputs = [mod.InferRequestedOutput("OUTPUT0", binary_data=True)]
            else:
                i.set_data_from_numpy(x)
                outputs = None
            t0 = time.perf_counter()
            client.infer("m", [i], outputs=outputs)
            if k >= 20:
                times.append(time.perf_counter() - t0)
        out.append(statistics.median(times) * 1000)
    return out[0], out[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-seconds", type=float, default=15)
    ap.add_argument("--reps", type=int, default=500)
    ap.add_argument("--out", type=Path, default=ROOT / "RESULTS.md")
    ap.add_argument("--bare-grpc", type=int, help=argparse.SUPPRESS)   # the child: a bare grpc.aio server
    args = ap.parse_args()
    if args.bare_grpc:
        bare_grpc_server(args.bare_grpc)
        return 0
    raw_p50, ceiling, best_b = raw(args.reps)
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1.0, 2.0, 3.0, 4.0]}]}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, mbs in (("on", 64), ("off", 0)):
            grpc_port = free_port()
            model = f"  - {{name: m, kind: tensor, path: '{MODEL}', max_batch_size: {mbs}}}\n"
            srv = Serve(model, Path(tmp), f"grpc_bind: '127.0.0.1:{grpc_port}', max_queue: 1024", name=label)
            try:
                if label == "on":
                    results["http_p50"], results["grpc_p50"] = client_latency(srv.url, f"127.0.0.1:{grpc_port}",
                                                                               args.reps)
                    results["noop"] = noop_latency(srv.url, f"127.0.0.1:{grpc_port}", args.reps)
                results[label] = asyncio.run(drive(srv.url, "/v2/models/m/infer", [body] * 200_000, 64,
                                                   args.max_seconds))
            finally:
                srv.stop()
    on, off = results["on"], results["off"]
    live_http, live_grpc, live_bare = results["noop"]
    lines = ["", "## Tensor serving: KServe v2 (tritonclient) vs raw onnxruntime (`tensor.py`)", "",
             f"Machine: {machine()}. Reproduce: `.venv/bin/python benchmarks/tensor.py` (one run). Model: add_one "
             "([batch, 4] float32 + 1), the server's default thread plan.", "",
             "| measure | rsinfer | raw onnxruntime | ratio |", "|---|---|---|---|",
             f"| [1,4] p50, tritonclient HTTP (binary) | {results['http_p50']:.3f} ms | {raw_p50:.3f} ms "
             f"(session.run) | +{results['http_p50'] - raw_p50:.3f} ms |",
             f"| [1,4] p50, tritonclient gRPC | {results['grpc_p50']:.3f} ms | {raw_p50:.3f} ms (session.run) | "
             f"+{results['grpc_p50'] - raw_p50:.3f} ms |",
             f"| no-op p50 (HTTP /v2/health/live; gRPC ServerLive) | {live_http:.3f} ms HTTP, {live_grpc:.3f} ms "
             f"gRPC | {live_bare:.3f} ms (a bare grpc.aio server, gRPC) | gRPC / bare {live_grpc / live_bare:.2f} |",
             f"| [1,4] p50 minus the same protocol's no-op | {results['http_p50'] - live_http:.3f} ms HTTP, "
             f"{results['grpc_p50'] - live_grpc:.3f} ms gRPC | - | - |",
             f"| 64 clients x [1,4], dynamic batching on | {on['rps']:.0f} rows/s | {ceiling:.0f} rows/s "
             f"(batch {best_b}) | {on['rps'] / ceiling:.3f} |",
             f"| 64 clients x [1,4], dynamic batching off | {off['rps']:.0f} rows/s | {ceiling:.0f} rows/s | "
             f"{off['rps'] / ceiling:.3f} |",
             "", f"Dynamic batching on / off: {on['rps'] / max(off['rps'], 1e-9):.2f}x rows/s; p50 under load "
             f"{on['p50_ms']:.1f} ms on vs {off['p50_ms']:.1f} ms off; errors {on['errors'] + off['errors']}. gRPC's "
             "extra latency over HTTP is the gap between the no-op calls: grpcio's client and server (a bare "
             "grpc.aio server costs as much), not rsinfer's gRPC code; the inference path costs the same on both.", ""]
    return write_results(args.out, lines)


if __name__ == "__main__":
    sys.exit(main())
