"""The floor of KServe gRPC in Python on this machine: what a servicer that does (next to) nothing costs per call,
measured with the load of benchmarks/overhead.py (64 tritonclient.grpc.aio clients, `add_one`), so that rsinfer's
gRPC number has its floor beside it from the same run.

Servers, each in a process of its own on 127.0.0.1:
- `aio fixed`: grpc.aio (uvloop), ModelInfer returns a prepared answer;
- `aio run`: the floor - the same servicer reading `raw_input_contents`, running the real `session.run` of add_one
  and answering;
- `aio meta+run`: the same, reading the call's metadata, setting a trailing `x-request-id` and running the real
  `session.run` of add_one (what any server must do);
- `sync meta+run`: grpc's thread-pool server (`grpc.server`, 16 threads) doing the same;
- `rsinfer`: `rsinfer serve` with the server's defaults and `grpc_bind`;
- `aio run, again`: the floor's own code in a second process, last in the order: its ratio to the floor is what the
  same code reads in this run, the resolution of every other ratio.

    .venv/bin/python benchmarks/grpc_floor.py          # its section of benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path

from _serve import Serve, free_port, interleaved_floor, tree_cpu_seconds, write_results
from batching import ROOT, SHARED, machine
from overhead import config, grpc_load

ADD = SHARED / "tensor-models" / "add_one"
AGAIN = "aio run, again"     # the floor in a second process: the same code's ratio

SERVER = textwrap.dedent('''
    import sys
    from concurrent import futures
    import grpc
    import numpy as np
    import onnxruntime as ort
    from rsinfer_cli.server.kserve import kserve_pb2 as pb, kserve_pb2_grpc as pb_grpc

    mode, port, model = sys.argv[1], sys.argv[2], sys.argv[3]
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    T = pb.ModelInferResponse.InferOutputTensor
    FIXED = pb.ModelInferResponse(model_name="add", model_version="1",
                                  outputs=[T(name="OUTPUT0", datatype="FP32", shape=[1, 4])],
                                  raw_output_contents=[np.ones(4, np.float32).tobytes()])

    def answer(request, context):
        if mode.endswith("fixed"):
            return FIXED
        if mode.endswith("-run"):       # the floor: the tensor read, the graph run, the answer
            x = np.frombuffer(request.raw_input_contents[0], dtype=np.float32).reshape(1, 4)
            y = sess.run(None, {"INPUT0": x})[0]
            return pb.ModelInferResponse(model_name="add", model_version="1",
                                         outputs=[T(name="OUTPUT0", datatype="FP32", shape=list(y.shape))],
                                         raw_output_contents=[y.tobytes()])
        next((v for k, v in (context.invocation_metadata() or ()) if k.lower() == "x-request-id"), None)
        context.set_trailing_metadata((("x-request-id", "0123456789abcdef"),))
        x = np.frombuffer(request.raw_input_contents[0], dtype=np.float32).reshape(1, 4)
        y = sess.run(None, {"INPUT0": x})[0]
        return pb.ModelInferResponse(model_name="add", model_version="1",
                                     outputs=[T(name="OUTPUT0", datatype="FP32", shape=list(y.shape))],
                                     raw_output_contents=[y.tobytes()])

    if mode.startswith("sync"):
        class Sync(pb_grpc.GRPCInferenceServiceServicer):
            def ModelInfer(self, request, context):
                return answer(request, context)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(Sync(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        print("ready", flush=True)
        server.wait_for_termination()
    else:
        import uvloop

        class Aio(pb_grpc.GRPCInferenceServiceServicer):
            async def ModelInfer(self, request, context):
                return answer(request, context)

        async def main():
            server = grpc.aio.server()
            pb_grpc.add_GRPCInferenceServiceServicer_to_server(Aio(), server)
            server.add_insecure_port(f"127.0.0.1:{port}")
            await server.start()
            print("ready", flush=True)
            await server.wait_for_termination()

        uvloop.run(main())
''')


class Grpc:
    """One server under the 64-client gRPC load: `load(seconds)` → (calls/s, CPU µs per call of its process tree)."""

    def __init__(self, target: str, pid: int, stop: Callable[[], None]) -> None:
        self.target, self.pid, self.stop = target, pid, stop
        asyncio.run(grpc_load(target, 2))      # warm-up

    def load(self, seconds: float) -> tuple[float, float]:
        t0 = sum(tree_cpu_seconds(self.pid).values())
        r = asyncio.run(grpc_load(self.target, seconds))
        t1 = sum(tree_cpu_seconds(self.pid).values())
        if r["errors"]:
            raise SystemExit(f"{r['errors']} calls failed against {self.target}")
        return r["rps"], 1e6 * (t1 - t0) / max(r["requests"], 1)


def bare(mode: str) -> Grpc:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT.parent / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-c", SERVER, mode, str(port), str(ADD / "model.onnx")],
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"

    def stop() -> None:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(30)

    return Grpc(f"127.0.0.1:{port}", proc.pid, stop)


def rsinfer(tmp: Path, src: Path | None = None) -> Grpc:
    """`rsinfer serve` with the defaults, from this checkout or `src` (another checkout's src/)."""
    grpc_port = free_port()
    models, server = config(1, grpc_port)              # overhead.py's: the defaults and grpc_bind
    srv = Serve(models, tmp, server, name="grpc-floor" if src is None else "grpc-floor-before", log_level="info",
                src=src)
    return Grpc(f"127.0.0.1:{grpc_port}", srv.proc.pid, srv.stop)


def before_note(src: Path | None) -> list[str]:
    """What "rsinfer before" was: the commit of the checkout `--before-src` named."""
    if src is None:
        return []
    found = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    commit = found.stdout.strip() if found.returncode == 0 else "another checkout"
    return ["", f"rsinfer before = {commit} (`--before-src <checkout of {commit}>/src`), the same rounds."]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "RESULTS.md")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3, help="seconds of load per server per round")
    parser.add_argument("--before-src", type=Path, help="another checkout's src/: its rsinfer as one more row, "
                                                          "\"rsinfer before\", in the same rounds")
    args = parser.parse_args()
    names = ["aio fixed", "aio run", "aio meta+run", "sync meta+run", "rsinfer"]
    if args.before_src:
        names.append("rsinfer before")
    names.append(AGAIN)
    with tempfile.TemporaryDirectory() as tmp:
        def start(name: str) -> Grpc:
            if name.startswith("rsinfer"):
                return rsinfer(Path(tmp), args.before_src if name == "rsinfer before" else None)
            return bare("aio-run" if name == AGAIN else name.replace(" ", "-"))

        table = interleaved_floor(names, start, "calls/s", "call", "aio run", args.rounds, args.seconds)
    lines = ["", "## The floor of KServe gRPC in Python (`grpc_floor.py`)", "",
             f"Machine: {machine()}. Reproduce: `.venv/bin/python benchmarks/grpc_floor.py` (64 "
             "tritonclient.grpc.aio clients on 127.0.0.1, add_one; every server up at once, "
             f"{args.rounds} rounds of {args.seconds:g} s of load per server, in an order reversed each round; CPU = "
             "the server's process tree per call).", *before_note(args.before_src), *table]
    lines.append("")
    return write_results(args.out, lines)


if __name__ == "__main__":
    sys.exit(main())
