"""The floor of KServe REST in Python on this machine: what an aiohttp server that does (next to) nothing costs per
request, measured with the load of benchmarks/overhead.py (64 raw HTTP/1.1 keep-alive clients, `add_one`), so that
rsinfer's number has its floor beside it from the same run.

Servers, each in a process of its own on 127.0.0.1 (aiohttp on uvloop, no access log):
- `aiohttp fixed`: reads the body and answers a prepared JSON body;
- `aiohttp request.json()+run`: the floor as a new user would write it - the body read with `await
  request.json()`, the real `session.run` of add_one, the answer made by `web.json_response`;
- `aiohttp parse+run json` / `binary`: what any KServe server must do, and nothing else: the body parsed (orjson; the
  binary extension's header split off), the real `session.run` of add_one, the answer encoded, an `x-request-id`
  echoed or made - no validation, metrics, log line, deadline or timing headers;
- `rsinfer json` / `binary`: `rsinfer serve` with the server's defaults (log level info: an access line a request);
- `aiohttp request.json()+run, again`: the floor's own code in a second process, last in the order: its ratio to
  the floor is what the same code reads in this run, the resolution of every other ratio.

    .venv/bin/python benchmarks/http_floor.py          # its section of benchmarks/RESULTS.md
    .venv/bin/python benchmarks/http_floor.py --before-src <checkout>/src   # another commit's rsinfer beside it
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
from batching import ROOT, SHARED, drive_raw, machine
from grpc_floor import before_note
from overhead import CLIENTS, config, kserve_binary, kserve_json

ADD = SHARED / "tensor-models" / "add_one"
AGAIN = "aiohttp request.json()+run, again"     # the floor in a second process: the same code's ratio

SERVER = textwrap.dedent('''
    import asyncio, itertools, sys
    import numpy as np, onnxruntime as ort, orjson, uvloop
    from aiohttp import web

    mode, port, model = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    FIXED = orjson.dumps({"model_name": "add", "model_version": "1", "outputs": [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 4], "data": [2.0, 3.0, 4.0, 5.0]}]})
    ids = itertools.count()

    async def infer(request):
        if mode == "stdlib":        # what a new user writes: aiohttp's own JSON in and out
            body = await request.json()
            t = body["inputs"][0]
            y = sess.run(None, {t["name"]: np.asarray(t["data"], dtype=np.float32).reshape(t["shape"])})[0]
            return web.json_response({"model_name": request.match_info["model"], "model_version": "1", "outputs": [
                {"name": "OUTPUT0", "datatype": "FP32", "shape": list(y.shape), "data": y.reshape(-1).tolist()}]})
        raw = await request.read()
        if mode == "fixed":
            return web.Response(body=FIXED, content_type="application/json")
        rid = request.headers.get("x-request-id") or f"{next(ids):032x}"
        split = request.headers.get("Inference-Header-Content-Length")
        body = orjson.loads(raw if split is None else raw[:int(split)])
        t = body["inputs"][0]
        x = (np.asarray(t["data"], dtype=np.float32) if split is None
             else np.frombuffer(raw[int(split):], dtype=np.float32)).reshape(t["shape"])
        y = sess.run(None, {t["name"]: x})[0]
        out = {"name": "OUTPUT0", "datatype": "FP32", "shape": list(y.shape)}
        answer = {"model_name": request.match_info["model"], "model_version": "1", "outputs": [out]}
        if split is None:
            out["data"] = y.reshape(-1).tolist()
            return web.Response(body=orjson.dumps(answer), content_type="application/json",
                                headers={"x-request-id": rid})
        out["parameters"] = {"binary_data_size": y.nbytes}
        head = orjson.dumps(answer)
        return web.Response(body=head + y.tobytes(), content_type="application/octet-stream",
                            headers={"x-request-id": rid, "Inference-Header-Content-Length": str(len(head))})

    async def main():
        app = web.Application()
        app.router.add_post("/v2/models/{model}/infer", infer)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        print("ready", flush=True)
        await asyncio.Event().wait()

    uvloop.run(main())
''')


class Http:
    """One server under the 64-client load, JSON or binary bodies: `load(seconds)` → (requests/s, CPU µs per
    request of its process tree `pid`)."""

    def __init__(self, port: int, binary: bool, pid: int, stop: Callable[[], None]) -> None:
        host = f"127.0.0.1:{port}"
        self.requests = (kserve_binary if binary else kserve_json)(host, 200_000)
        self.url, self.pid, self.stop = f"http://{host}", pid, stop
        asyncio.run(drive_raw(self.url, self.requests[:500], 8, 2))          # warm-up

    def load(self, seconds: float) -> tuple[float, float]:
        t0 = sum(tree_cpu_seconds(self.pid).values())
        r = asyncio.run(drive_raw(self.url, self.requests, CLIENTS, seconds))
        t1 = sum(tree_cpu_seconds(self.pid).values())
        if r["errors"]:
            raise SystemExit(f"{r['errors']} requests failed against {self.url}")
        return r["rps"], 1e6 * (t1 - t0) / max(r["requests"], 1)


def bare(mode: str) -> tuple[int, int, Callable[[], None]]:
    """A bare aiohttp server of `mode` started: (port, pid, stop)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, mode, str(port), str(ADD / "model.onnx")],
                            stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"

    def stop() -> None:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(30)

    return port, proc.pid, stop


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "RESULTS.md")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3, help="seconds of load per server per round")
    parser.add_argument("--before-src", type=Path, help="another checkout's src/: its rsinfer as more rows, "
                                                          "\"rsinfer before json|binary\", in the same rounds")
    args = parser.parse_args()
    names = ["aiohttp fixed", "aiohttp request.json()+run", "aiohttp parse+run json", "aiohttp parse+run binary",
             "rsinfer json", "rsinfer binary"]
    if args.before_src:
        names += ["rsinfer before json", "rsinfer before binary"]
    names.append(AGAIN)
    modes = {"aiohttp fixed": "fixed", "aiohttp request.json()+run": "stdlib", "aiohttp parse+run json": "run",
             "aiohttp parse+run binary": "run", AGAIN: "stdlib"}
    servers: dict[str, tuple[int, int, Callable[[], None]]] = {}   # one process per mode, JSON and binary alike
    with tempfile.TemporaryDirectory() as tmp:
        def start(name: str) -> Http:
            mode = ("rsinfer before" if name.startswith("rsinfer before") else "rsinfer") \
                if name.startswith("rsinfer") else modes[name]
            key = name if name == AGAIN else mode     # the copy: a process of its own
            if key not in servers:
                if mode.startswith("rsinfer"):
                    before = mode == "rsinfer before"
                    models, server = config(1, free_port())     # overhead.py's: the defaults (and a gRPC bind)
                    srv = Serve(models, Path(tmp), server, name="http-floor-before" if before else "http-floor",
                                log_level="info", src=args.before_src if before else None)
                    servers[key] = (int(srv.url.rsplit(":", 1)[1]), srv.proc.pid, srv.stop)
                else:
                    servers[key] = bare(mode)
            port, pid, stop = servers[key]
            return Http(port, name.endswith("binary"), pid, stop)

        table = interleaved_floor(names, start, "requests/s", "request", "aiohttp request.json()+run",
                                  args.rounds, args.seconds)
    lines = ["", "## The floor of KServe REST in Python (`http_floor.py`)", "",
             f"Machine: {machine()}. Reproduce: `.venv/bin/python benchmarks/http_floor.py` ({CLIENTS} raw HTTP/1.1 "
             f"keep-alive clients on 127.0.0.1, add_one; every server up at once, {args.rounds} rounds of "
             f"{args.seconds:g} s of load per server, in an order reversed each round; CPU = the server's process "
             "tree per request).", *before_note(args.before_src), *table]
    lines.append("")
    return write_results(args.out, lines)


if __name__ == "__main__":
    sys.exit(main())
