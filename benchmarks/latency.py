"""One client, one short request at a time: rsinfer's p50 against the raw forward and against the floor of a bare
Python server doing the same work, all in one run.

    .venv/bin/python benchmarks/latency.py [--before-src <checkout>/src] [--rounds 20]

Two workloads, each with its three (four) sides up at once:
- HTTP, all-MiniLM-L6-v2 (../shared/models), one short query per request to `/v1/embeddings`:
  - raw: the raw pipeline in this process (tokenizers → `session.run` with 2 intra-op threads → mean pooling and
    normalising): the baseline;
  - bare aiohttp: the floor - an aiohttp application (uvloop, no access log) whose one handler reads the body with
    `await request.json()`, runs that same raw pipeline on its event loop and answers with `web.json_response`;
  - rsinfer: `rsinfer serve` with the defaults (the thread plan, batching on, log level info: an access line a
    request, read from the pipe as journald would);
  The client is the thinnest HTTP/1.1 keep-alive one (RawHttp: a socket, requests written whole); rsinfer's TEI
  timing headers split its time into tokenizing, the forward, its own work and HTTP.
- KServe gRPC, add_one ([1, 4] float32), one `tritonclient.grpc` client:
  - raw: `session.run` in this process; bare grpc.aio: the floor of benchmarks/grpc_floor.py (`aio run`: reads
    `raw_input_contents`, runs the graph, answers); rsinfer: `rsinfer serve` with `grpc_bind`.

The sides are measured in blocks of 25 requests, round-robin, the order reversed every other round, a 30 ms pause
before each block (a pool thread that spins after its forwards stops before the next side's block) and each block's
first 3 requests left out; the p50 of a side is over all its blocks. This machine's speed drifts by more than the
differences measured here within minutes: interleaving the sides in small blocks puts that drift on all of them
alike, where one side's run after another's would measure the drift. The chart (`--chart`) shows each side's
percentiles.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

from _serve import Serve, free_port, write_results
from batching import SHARED, machine
from charts import draw
from grpc_floor import SERVER as GRPC_SERVER

ROOT = Path(__file__).resolve().parent
MODEL = SHARED / "all-minilm-l6-v2"
ADD = SHARED / "tensor-models" / "add_one"
QUERIES = [f"how do I reset my password on device {i}" for i in range(250)]
BLOCK, SKIP, PAUSE_S = 25, 3, 0.03

# the raw pipeline, shared by this process's baseline and the bare aiohttp server
PIPELINE = '''
import numpy as np, onnxruntime as ort
from tokenizers import Tokenizer

def pipeline(model_dir):
    tok = Tokenizer.from_file(f"{model_dir}/tokenizer.json")
    tok.no_padding()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(f"{model_dir}/onnx/model.onnx", opts, providers=["CPUExecutionProvider"])

    def embed(text):
        e = tok.encode(text)
        ids = np.array([e.ids], dtype=np.int64)
        mask = np.array([e.attention_mask], dtype=np.int64)
        out = sess.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[0]
        v = (out * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
        return v / np.linalg.norm(v, axis=1, keepdims=True)
    return embed
'''

BARE_HTTP = PIPELINE + textwrap.dedent('''
    import sys, uvloop
    from aiohttp import web

    embed = pipeline(sys.argv[2])

    async def embeddings(request):
        body = await request.json()
        return web.json_response({"object": "list", "model": body["model"], "data": [
            {"object": "embedding", "index": 0, "embedding": embed(body["input"])[0].tolist()}]})

    async def main():
        app = web.Application()
        app.router.add_post("/v1/embeddings", embeddings)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", int(sys.argv[1])).start()
        print("ready", flush=True)
        await __import__("asyncio").Event().wait()

    uvloop.run(main())
''')


class RawHttp:
    """The thinnest HTTP/1.1 keep-alive client: one socket, requests written whole, responses read by their
    Content-Length (a client's own cost out of the measurement: httpx adds ~0.5 ms a request here)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def post(self, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        self.sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        while b"\r\n\r\n" not in self.buf:
            self.buf += self._recv()
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        n = int(headers["content-length"])
        while len(rest) < n:
            rest += self._recv()
        self.buf = rest[n:]
        return int(lines[0].split()[1]), headers, rest[:n]

    def _recv(self) -> bytes:
        data = self.sock.recv(1 << 16)
        if not data:
            raise ConnectionError("the server closed the connection")
        return data

    def close(self) -> None:
        self.sock.close()


class Side:
    """One side of a workload: `call(i)` sends the i-th request and returns the server's timing headers (or {})."""

    def __init__(self, label: str, call: Callable[[int], dict[str, str]]) -> None:
        self.label = label
        self.call = call
        self.wall: list[float] = []
        self.headers: dict[str, list[float]] = {}

    def block(self, start: int) -> None:
        for i in range(start, start + BLOCK):
            t0 = time.perf_counter()
            headers = self.call(i)
            ms = (time.perf_counter() - t0) * 1000
            if i - start < SKIP:
                continue
            self.wall.append(ms)
            for name in ("x-compute-time", "x-tokenization-time", "x-inference-time"):
                if name in headers:
                    self.headers.setdefault(name, []).append(float(headers[name]))

    def p(self, q: float) -> float:
        return statistics.quantiles(self.wall, n=100)[int(q) - 1] if q != 50 else statistics.median(self.wall)

    def median(self, header: str) -> float:
        return statistics.median(self.headers[header]) if header in self.headers else float("nan")


def interleave(sides: list[Side], rounds: int) -> None:
    for side in sides:                     # warm-up: every side's first requests
        side.block(0)
        side.wall.clear()
        side.headers.clear()
    for r in range(rounds):
        for side in (sides if r % 2 == 0 else sides[::-1]):
            time.sleep(PAUSE_S)
            side.block(r * BLOCK)


def started(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", *argv], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", "a bare server did not start"
    return proc


def http_sides(stack: contextlib.ExitStack, tmp: Path, before: Path | None, label: str) -> list[Side]:
    namespace: dict[str, object] = {}
    exec(PIPELINE, namespace)               # noqa: S102 - the one pipeline text both raw sides run
    embed = namespace["pipeline"](str(MODEL))   # type: ignore[operator]

    def raw(i: int) -> dict[str, str]:
        embed(QUERIES[i % len(QUERIES)])
        return {}

    def over_http(port: int) -> Callable[[int], dict[str, str]]:
        client = RawHttp(port)
        stack.callback(client.close)

        def call(i: int) -> dict[str, str]:
            body = json.dumps({"model": "mini", "input": QUERIES[i % len(QUERIES)]}).encode()
            status, headers, _ = client.post("/v1/embeddings", body)
            if status != 200:
                raise RuntimeError(f"status {status}")
            return headers
        return call

    port = free_port()
    bare = started([BARE_HTTP, str(port), str(MODEL)])
    stack.callback(bare.terminate)
    sides = [Side("raw pipeline, in-process", raw), Side("bare aiohttp (the floor)", over_http(port))]
    models = f"  - {{name: mini, kind: embedding, path: '{MODEL}'}}\n"
    for name, src in ((label, before), ("rsinfer", None)):
        if name == label and src is None:
            continue
        srv = stack.enter_context(Serve(models, tmp, name=f"lat-{len(sides)}", src=src, log_level="info"))
        sides.append(Side(name, over_http(srv.port)))
    return sides


def grpc_sides(stack: contextlib.ExitStack, tmp: Path, before: Path | None, label: str) -> list[Side]:
    import numpy as np
    import onnxruntime as ort
    import tritonclient.grpc as tg

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(ADD / "model.onnx"), opts, providers=["CPUExecutionProvider"])
    data = np.array([[1, 2, 3, 4]], dtype=np.float32)

    def raw(i: int) -> dict[str, str]:
        sess.run(None, {"INPUT0": data})
        return {}

    def over_grpc(target: str) -> Callable[[int], dict[str, str]]:
        client = tg.InferenceServerClient(target)
        stack.callback(client.close)
        inp = tg.InferInput("INPUT0", [1, 4], "FP32")
        inp.set_data_from_numpy(data)

        def call(i: int) -> dict[str, str]:
            client.infer("add", [inp])
            return {}
        return call

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT.parent / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    bare = started([GRPC_SERVER, "aio-run", str(port), str(ADD / "model.onnx")], env)
    stack.callback(bare.terminate)
    sides = [Side("raw session.run, in-process", raw),
             Side("bare grpc.aio (the floor)", over_grpc(f"127.0.0.1:{port}"))]
    for name, src in ((label, before), ("rsinfer", None)):
        if name == label and src is None:
            continue
        grpc_port = free_port()
        stack.enter_context(Serve(f"  - {{name: add, kind: tensor, path: '{ADD}'}}\n", tmp,
                                  f"grpc_bind: '127.0.0.1:{grpc_port}'", name=f"grpc-{len(sides)}", src=src,
                                  log_level="info"))
        sides.append(Side(name, over_grpc(f"127.0.0.1:{grpc_port}")))
    return sides


def table(sides: list[Side], split: bool) -> list[str]:
    raw, bare = sides[0].p(50), sides[1].p(50)
    head = "| side | p50 (ms) | p90 | p99 | - raw | - the floor |"
    rule = "|---|---|---|---|---|---|"
    if split:
        head += " tokenize | forward | server's own | HTTP + client |"
        rule += "---|---|---|---|"
    lines = [head, rule]
    for s in sides:
        row = (f"| {s.label} | {s.p(50):.3f} | {s.p(90):.3f} | {s.p(99):.3f} | "
               f"{'' if s is sides[0] else f'{s.p(50) - raw:+.3f}'} | "
               f"{f'{s.p(50) - bare:+.3f}' if s not in sides[:2] else ''} |")
        if split:
            if "x-compute-time" in s.headers:
                compute, tok, fwd = (s.median(h) for h in ("x-compute-time", "x-tokenization-time",
                                                           "x-inference-time"))
                row += f" {tok:.3f} | {fwd:.3f} | {compute - tok - fwd:.3f} | {s.p(50) - compute:.3f} |"
            else:
                row += " | | | |"
        lines.append(row)
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before-src", type=Path, help="another checkout's src/, measured as one more side")
    ap.add_argument("--before-label", default="before")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--out", type=Path, default=ROOT / "RESULTS.md")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d, contextlib.ExitStack() as stack:
        http = http_sides(stack, Path(d), args.before_src, args.before_label)
        interleave(http, args.rounds)
        grpc = grpc_sides(stack, Path(d), args.before_src, args.before_label)
        interleave(grpc, args.rounds)
    n = args.rounds * (BLOCK - SKIP)
    lines = [
        "## One client, one request at a time (`latency.py`)", "",
        f"Machine: {machine()}. Reproduce: `.venv/bin/python "
        f"benchmarks/latency.py` (one client; the sides up at once and measured in interleaved blocks of {BLOCK}, "
        f"{n} requests each; percentiles in ms). rsinfer runs with the defaults. The floor is a bare Python server "
        "doing the same work: aiohttp whose handler reads the body with `request.json()`, runs the raw pipeline and "
        "answers with `web.json_response`; grpc.aio reading `raw_input_contents`, running the graph and answering.",
        "",
        "all-MiniLM-L6-v2, one short query to `/v1/embeddings` (the thinnest HTTP client; rsinfer's split from its "
        "timing headers):", "", *table(http, split=True), "",
        "KServe gRPC `ModelInfer`, add_one [1, 4] (tritonclient.grpc):", "", *table(grpc, split=False), "",
        f"Each side's percentiles{' but the before side' if args.before_src else ''} are drawn in "
        "`docs/charts/latency.png` (on the docs' performance page).", ""]
    # the docs' chart: the product beside its baselines (the before side is the table's)
    qs = (50, 75, 90, 95, 99)
    panels = [{"title": title, "sides": [{"label": s.label, "percentiles": {str(q): s.p(q) for q in qs}}
                                         for s in sides if args.before_src is None or s.label != args.before_label]}
              for title, sides in (("/v1/embeddings, all-MiniLM-L6-v2, one short query", http),
                                   ("KServe gRPC ModelInfer, add_one [1, 4] (tritonclient.grpc)", grpc))]
    draw("latency", {"title": "One client, one request at a time: latency percentiles",
                     "note": f"benchmarks/latency.py on {machine()}", "panels": panels})
    return write_results(args.out, lines)


if __name__ == "__main__":
    raise SystemExit(main())
