"""What a KServe JSON request costs the server in CPU instructions, counted by valgrind: rsinfer beside the floor of
`http_floor.py` (aiohttp, `request.json()`, the real `session.run` of add_one, `web.json_response`), and what each of
rsinfer's per-request features adds - a count that does not drift with the machine the way CPU seconds under load do
(1.5-2x within hours on a shared 2-core machine, where the features' few µs each stay inside the noise). The same for
a KServe gRPC call's handler: rsinfer's `ModelInfer` beside the servicer of `grpc_floor.py`'s `aio run`.

Each server runs in a process of its own under `valgrind --tool=callgrind`, in-process: its aiohttp protocol is fed
the request's bytes and writes to a transport that keeps nothing, so no socket or system call is counted, only the
user-space work of one request (HTTP parse, route, handler, response). After a warm-up of 300 requests the measured
requests run as the key function of `sorted()`, and callgrind counts only inside it (`--toggle-collect`). The
harness's own cost per request (a bare turn of the event loop) is counted the same way and taken off every row.
A gRPC call is counted from the decoded request on: the servicer's coroutine, run to its answer (grpc.aio's own
Cython layer and C core around it are the same code for both servers and are not counted).

    .venv/bin/python benchmarks/instructions.py          # its section of benchmarks/RESULTS.md (needs valgrind)

The rows without a feature patch it out of rsinfer's code in that process only, to price it: they are measurements,
not configurations (only the access line has a setting, `--log-level warning`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _serve import write_results
from batching import ROOT, machine
from grpc_floor import SERVER as GRPC_SERVER
from http_floor import ADD, SERVER
from overhead import _post, kserve_json

WARM = 300
VALGRIND_SLOWDOWN = 1000     # > callgrind's slow-down of Python (~50-100x)
VARIANTS = {     # row → (server, what is patched out of rsinfer)
    "harness alone (taken off every row)": ("empty", ""),
    "aiohttp request.json()+run (the floor)": ("floor", ""),
    "rsinfer, the defaults": ("rsinfer", ""),
    "rsinfer without the access line (log level warning)": ("rsinfer", "access"),
    "rsinfer without its histograms": ("rsinfer", "histograms"),
    "rsinfer without the timing headers": ("rsinfer", "timing"),
    "rsinfer without the inference core (plan, one forward, answer called by the route)": ("rsinfer", "core"),
}
GRPC_VARIANTS = {     # the same for a gRPC call's handler
    "harness alone (taken off every row)": ("grpc-empty", ""),
    "grpc.aio servicer reading raw_input_contents, run, answer (the floor)": ("grpc-floor", ""),
    "rsinfer's ModelInfer, the defaults": ("grpc-rsinfer", ""),
    "rsinfer without the access line (log level warning)": ("grpc-rsinfer", "access"),
    "rsinfer without its histograms": ("grpc-rsinfer", "histograms"),
    "rsinfer without the inference core": ("grpc-rsinfer", "core"),
}
EMBED_VARIANTS = {     # OpenAI's /v1/embeddings on a tiny sentence-transformers folder (tokenize, forward, pooling)
    "harness alone (taken off every row)": ("empty", ""),
    "rsinfer /v1/embeddings, the defaults": ("embed-rsinfer", ""),
}
TINY_ST = ROOT.parent / "tests" / "fixtures" / "st-cls-dense"


class Sink(asyncio.Transport):
    """A connection that takes the response and keeps nothing: `done` is set by the response's write."""

    def __init__(self) -> None:
        super().__init__()
        self.done: asyncio.Event | None = None

    def write(self, data: Any) -> None:
        assert self.done is not None
        self.done.set()

    def writelines(self, data: Any) -> None:
        self.write(data)

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


def floor_app() -> Any:
    """http_floor.py's own `request.json()+run` server, its handler taken from that script's text (not a copy)."""
    from aiohttp import web

    scope: dict[str, Any] = {}
    argv, sys.argv = sys.argv, ["floor", "stdlib", "0", str(ADD / "model.onnx")]
    try:
        exec(SERVER.replace("uvloop.run(main())", ""), scope)    # noqa: S102 - our own benchmark's server text
    finally:
        sys.argv = argv
    app = web.Application()
    app.router.add_post("/v2/models/{model}/infer", scope["infer"])
    return app


def grpc_floor_answer() -> Any:
    """grpc_floor.py's `aio run` servicer's ModelInfer, its `answer` taken from that script's text (not a copy)."""
    scope: dict[str, Any] = {}
    argv, sys.argv = sys.argv, ["floor", "aio-run", "0", str(ADD / "model.onnx")]
    try:
        exec(GRPC_SERVER.split('if mode.startswith("sync")')[0], scope)   # noqa: S102 - our own benchmark's text
    finally:
        sys.argv = argv
    answer = scope["answer"]

    async def model_infer(request: Any, context: Any) -> Any:     # as its servicer's ModelInfer
        return answer(request, context)

    return model_infer


class CallContext:
    """What a servicer reads and sets of a call's grpc.aio context: tritonclient's metadata, the trailing
    metadata."""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("user-agent", "grpc-python-asyncio/1.0"),)

    def set_trailing_metadata(self, metadata: Any) -> None:
        self.trailing = metadata


def rsinfer_app(without: str, model: dict[str, Any] | None = None) -> Any:
    """rsinfer's app as `rsinfer serve` builds it, on add_one with the defaults, its log on a stderr that goes
    nowhere (as journald would take it), one feature patched out when `without` names it."""
    from rsinfer_cli.config import parse_config
    from rsinfer_cli.engine.registry import Registry
    from rsinfer_cli.engine.scheduler import learner
    from rsinfer_cli.runtime import Runtime
    from rsinfer_cli.server import app as server_app
    from rsinfer_cli.server import logs, metrics
    from rsinfer_cli.server.metrics import Metrics

    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    logs.configure("warning" if without == "access" else "info")
    if without == "histograms":
        metrics._Hist.observe = lambda self, value: None      # type: ignore[method-assign]
    elif without == "timing":
        server_app.timing_headers = lambda headers, stats, total_s: None
    elif without == "core":      # no queue, lanes, timing record or request metrics: what the pipeline itself does
        from rsinfer_cli.runtime.core import Inference

        async def bare(self: Any, record: Any, model: Any, plan: Any, *args: Any, **kwargs: Any) -> Any:
            work = plan(*args, **kwargs)
            return work.finish(self.pipelines[model.key].forward(model.sessions[0], work.rows))

        Inference.infer = bare      # type: ignore[method-assign]
    # the scheduler picks a request's path from the time of the model's forwards: add_one's take ~10 µs, under
    # `INLINE_FORWARD_S` (run on the event loop, as `rsinfer serve` runs them), but valgrind makes them ~50x
    # slower, which would send every request to a worker thread. Its thresholds are scaled by the same kind of
    # factor (constants: no instruction of a request changes), and `child` checks the path after the count
    t = learner.TUNABLES
    learner.TUNABLES = learner.Tunables(inline_forward_s=t.inline_forward_s * VALGRIND_SLOWDOWN,
                                        spike_s=t.spike_s * VALGRIND_SLOWDOWN,
                                        lone_forward_s=t.lone_forward_s * VALGRIND_SLOWDOWN)
    cfg = parse_config({"models": [model or {"name": "add", "kind": "tensor", "path": str(ADD)}]})
    registry = Registry.load(cfg)

    async def build() -> Any:
        return server_app.create_app(Runtime(cfg, registry, Metrics()))

    return asyncio.get_event_loop().run_until_complete(build())


def child(server: str, without: str, n: int) -> None:
    """The process callgrind watches: warm-up, then `n` requests inside sorted()."""
    import uvloop
    from aiohttp import web

    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    request = kserve_json("127.0.0.1", 1)[0]
    if server == "embed-rsinfer":
        request = _post("127.0.0.1", "/v1/embeddings", b'{"model":"e","input":"hello world"}')
    if server == "empty":
        def step(i: int) -> int:
            loop.run_until_complete(asyncio.sleep(0))
            return i
    elif server.startswith("grpc-"):
        step = grpc_step(loop, server, without)
    else:
        if server == "floor":      # as http_floor.py's server sets it up
            runner = web.AppRunner(floor_app(), access_log=None)
            loop.run_until_complete(runner.setup())
        else:                      # as `rsinfer serve` does (its request dispatch, handler cancellation)
            from rsinfer_cli.server.run import app_runner

            embed = {"name": "e", "kind": "embedding", "path": str(TINY_ST)} if server == "embed-rsinfer" else None
            app = rsinfer_app(without, embed)
            APP.append(app)
            runner = loop.run_until_complete(app_runner(app, 5.0))
        sink = Sink()

        async def connect() -> Any:
            assert runner.server is not None
            protocol = runner.server()
            protocol.connection_made(sink)
            return protocol

        protocol = loop.run_until_complete(connect())

        def step(i: int) -> int:
            sink.done = done = asyncio.Event()
            protocol.data_received(request)
            loop.run_until_complete(done.wait())
            return i
    for i in range(WARM):
        step(i)
    sorted(range(n), key=step)
    if server in ("rsinfer", "grpc-rsinfer") and without != "core":
        from rsinfer_cli.server.routes.common import STATE

        (queue,) = APP[0][STATE].runtime.queues.values()   # its forwards measured tiny: each ran on the loop
        if not (queue.now() and queue.learner.forward_s < queue.learner.t.inline_forward_s):
            print("rsinfer's requests did not run on the event loop as `rsinfer serve` runs add_one's: the count is "
                  "not the served path's", flush=True)      # (stderr went to /dev/null with the log)
            raise SystemExit(1)


APP: list[Any] = []     # the rsinfer app a child counted (its path is checked after the count)


def grpc_step(loop: asyncio.AbstractEventLoop, server: str, without: str) -> Any:
    """One gRPC call's handler, run to its answer: tritonclient's request for add_one ([1, 4] FP32, raw contents)."""
    import numpy as np

    from rsinfer_cli.server.kserve import kserve_pb2 as pb

    request = pb.ModelInferRequest(model_name="add")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(np.array([1, 2, 3, 4], np.float32).tobytes())
    context = CallContext()
    if server == "grpc-empty":
        async def handler(request: Any, context: Any) -> Any:
            return None
    elif server == "grpc-floor":
        handler = grpc_floor_answer()
    else:
        from rsinfer_cli.server.kserve.grpc_service import KServeServicer
        from rsinfer_cli.server.routes.common import STATE
        from rsinfer_cli.server.run import app_runner

        app = rsinfer_app(without)
        APP.append(app)
        loop.run_until_complete(app_runner(app, 5.0))      # started as `rsinfer serve` starts it, beside gRPC
        handler = KServeServicer(app[STATE]).ModelInfer

    def step(i: int) -> int:
        loop.run_until_complete(handler(request, context))
        return i

    return step


def count(server: str, without: str, n: int) -> int:
    """Instructions per request of one variant (all of them, the harness's included)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT.parent / "src"), str(ROOT)])}
        proc = subprocess.run(["valgrind", "--tool=callgrind", "--toggle-collect=builtin_sorted",
                               f"--callgrind-out-file={out}", sys.executable, __file__, "--child", server,
                               without, str(n)], capture_output=True, text=True, env=env, timeout=1800)
        if proc.returncode != 0:
            raise SystemExit(f"{server} {without}: valgrind failed\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        found = re.search(r"^summary:\s+(\d+)", out.read_text(), flags=re.M)
        assert found is not None, "callgrind wrote no summary"
        return int(found.group(1)) // n


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "RESULTS.md")
    parser.add_argument("--requests", type=int, default=400, help="requests counted per variant")
    parser.add_argument("--jobs", type=int, default=2, help="variants counted at once")
    parser.add_argument("--defaults", action="store_true",
                        help="count only the harness and rsinfer's defaults, print them, write nothing (before/after)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: apt-get install valgrind")
    if args.defaults:
        return defaults_only(args.requests, args.jobs)
    every = [*VARIANTS.values(), *GRPC_VARIANTS.values(), *EMBED_VARIANTS.values()]
    with ThreadPoolExecutor(args.jobs) as pool:
        found = list(pool.map(lambda v: count(*v, args.requests), every))
    counts = dict(zip(VARIANTS, found[:len(VARIANTS)], strict=True))
    grpc_counts = dict(zip(GRPC_VARIANTS, found[len(VARIANTS):len(VARIANTS) + len(GRPC_VARIANTS)], strict=True))
    embed = dict(zip(EMBED_VARIANTS, found[len(VARIANTS) + len(GRPC_VARIANTS):], strict=True))
    embed_n = embed["rsinfer /v1/embeddings, the defaults"] - embed["harness alone (taken off every row)"]
    lines = ["", "## Instructions per request (`instructions.py`)", "",
             f"Machine: {machine()}. Reproduce: `.venv/bin/python benchmarks/instructions.py` (valgrind's callgrind, "
             f"{args.requests} KServe JSON add_one requests per row after a warm-up of {WARM}, the whole HTTP path "
             "in-process with no socket; user-space instructions, the harness's own taken off). rsinfer is counted "
             "on the path `rsinfer serve` takes: behind its runner (routes remembered, no router walk) and, add_one's "
             "forwards being tiny, each request run on the event loop (the process checks it after the count: "
             "under valgrind the forwards' wall time alone would send them to a worker thread).", "",
             *table(counts, "server", "request"), "",
             f"A KServe gRPC call's handler, add_one ([1, 4] FP32 in raw_input_contents, as tritonclient sends it), "
             f"{args.requests} calls per row: the servicer's coroutine from the decoded request to its answer "
             "(grpc.aio's Cython layer and C core around it, the same for both, are not counted):", "",
             *table(grpc_counts, "handler", "call"), "",
             f"OpenAI's `/v1/embeddings`, one short text to a tiny sentence-transformers folder "
             f"(`tests/fixtures/st-cls-dense`: tokenize, forward, CLS pooling, two Dense layers), {args.requests} "
             f"requests: {embed_n:,} instructions a request (the harness's taken off).", "",
             f"The harness alone: {counts[next(iter(VARIANTS))]:,} instructions a request, "
             f"{grpc_counts[next(iter(GRPC_VARIANTS))]:,} a gRPC call. Two runs of the script agree to about 1 % "
             "a row (up to ~6,000 instructions: the log's 50 ms writes and the deadline sweep follow the clock), "
             "which is the precision of a feature's cost."]
    return write_results(args.out, lines)


def defaults_only(n: int, jobs: int) -> int:
    """The defaults of KServe JSON, gRPC and /v1/embeddings, the harness's taken off: a before/after of one change."""
    rows = {"KServe JSON": (("empty", ""), ("rsinfer", "")),
            "KServe gRPC": (("grpc-empty", ""), ("grpc-rsinfer", "")),
            "/v1/embeddings": (("empty", ""), ("embed-rsinfer", ""))}
    every = [v for pair in rows.values() for v in pair]
    with ThreadPoolExecutor(jobs) as pool:
        found = list(pool.map(lambda v: count(*v, n), every))
    for k, name in enumerate(rows):
        print(f"{name}: {found[2 * k + 1] - found[2 * k]:,} instructions a request", flush=True)
    return 0


def table(counts: dict[str, int], what: str, per: str) -> list[str]:
    """One table: its first row the harness (taken off every row), then the floor and rsinfer's defaults, then
    rsinfer without one feature each (its cost: the difference from the defaults)."""
    names = list(counts)
    harness = counts[names[0]]
    floor = counts[names[1]] - harness
    defaults = counts[names[2]] - harness
    out = [f"| {what} | instructions per {per} | x the floor | rsinfer's feature costs |", "|---|---|---|---|"]
    for name in names[1:]:
        n = counts[name] - harness
        cost = "" if name in names[1:3] else f"{defaults - n:,} ({(defaults - n) / defaults:.1%} of the defaults)"
        out.append(f"| {name} | {n:,} | {n / floor:.2f} | {cost} |")
    return out


if __name__ == "__main__":
    sys.exit(main())
