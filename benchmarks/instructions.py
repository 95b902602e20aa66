"""What a KServe JSON request costs the server in CPU instructions, counted by valgrind: rsinfer beside the floor of
`http_floor.py` (aiohttp, `request.json()`, the real `session.run` of add_one, `web.json_response`), and what each of
rsinfer's per-request features adds - a count that does not drift with the machine the way CPU seconds under load do
(1.5-2x within hours on a shared 2-core machine, where the features' few µs each stay inside the noise).

Each server runs in a process of its own under `valgrind --tool=callgrind`, in-process: its aiohttp protocol is fed
the request's bytes and writes to a transport that keeps nothing, so no socket or system call is counted, only the
user-space work of one request (HTTP parse, route, handler, response). After a warm-up of 300 requests the measured
requests run as the key function of `sorted()`, and callgrind counts only inside it (`--toggle-collect`). The
harness's own cost per request (a bare turn of the event loop) is counted the same way and taken off every row.

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
from http_floor import ADD, SERVER
from overhead import kserve_json

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


def rsinfer_app(without: str) -> Any:
    """rsinfer's app as `rsinfer serve` builds it, on add_one with the defaults, its log on a stderr that goes
    nowhere (as journald would take it), one feature patched out when `without` names it."""
    from rsinfer_cli.config import parse_config
    from rsinfer_cli.engine import scheduler
    from rsinfer_cli.engine.registry import Registry
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
        from rsinfer_cli.pipelines.infer import Inference

        async def bare(self: Any, model: Any, plan: Any, *args: Any, **kwargs: Any) -> Any:
            work = plan(*args, **kwargs)
            return work.finish(self.pipelines[model.key].forward(model.sessions[0], work.rows))

        Inference.infer = bare      # type: ignore[method-assign]
    # the scheduler picks a request's path from the time of the model's forwards: add_one's take ~10 µs, under
    # `INLINE_FORWARD_S` (run on the event loop, as `rsinfer serve` runs them), but valgrind makes them ~50x
    # slower, which would send every request to a worker thread. Its thresholds are scaled by the same kind of
    # factor (constants: no instruction of a request changes), and `child` checks the path after the count
    scheduler.INLINE_FORWARD_S *= VALGRIND_SLOWDOWN
    scheduler.LONE_FORWARD_S *= VALGRIND_SLOWDOWN
    scheduler.SPIKE_S *= VALGRIND_SLOWDOWN
    cfg = parse_config({"models": [{"name": "add", "kind": "tensor", "path": str(ADD)}]})
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
    if server == "empty":
        def step(i: int) -> int:
            loop.run_until_complete(asyncio.sleep(0))
            return i
    else:
        if server == "floor":      # as http_floor.py's server sets it up
            runner = web.AppRunner(floor_app(), access_log=None)
            loop.run_until_complete(runner.setup())
        else:                      # as `rsinfer serve` does (its request dispatch, handler cancellation)
            from rsinfer_cli.server.run import app_runner

            app = rsinfer_app(without)
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
    if server == "rsinfer" and without != "core":
        from rsinfer_cli.engine.scheduler import INLINE_FORWARD_S
        from rsinfer_cli.server.routes.common import STATE

        (queue,) = app[STATE].runtime.queues.values()   # its forwards measured tiny: each ran on the loop
        if not (queue.now() and queue._forward_s < INLINE_FORWARD_S):
            print("rsinfer's requests did not run on the event loop as `rsinfer serve` runs add_one's: the count is "
                  "not the served path's", flush=True)      # (stderr went to /dev/null with the log)
            raise SystemExit(1)


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
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: apt-get install valgrind")
    with ThreadPoolExecutor(args.jobs) as pool:
        counts = dict(zip(VARIANTS, pool.map(lambda v: count(*v, args.requests), VARIANTS.values()), strict=True))
    names = list(VARIANTS)
    harness = counts[names[0]]
    floor = counts[names[1]] - harness
    defaults = counts[names[2]] - harness
    lines = ["", "## Instructions per request (`instructions.py`)", "",
             f"Machine: {machine()}. Reproduce: `.venv/bin/python benchmarks/instructions.py` (valgrind's callgrind, "
             f"{args.requests} KServe JSON add_one requests per row after a warm-up of {WARM}, the whole HTTP path "
             "in-process with no socket; user-space instructions, the harness's own taken off). rsinfer is counted "
             "on the path `rsinfer serve` takes: behind its runner (routes remembered, no router walk) and, add_one's "
             "forwards being tiny, each request run on the event loop (the process checks it after the count: "
             "under valgrind the forwards' wall time alone would send them to a worker thread).", "",
             "| server | instructions per request | x the floor | rsinfer's feature costs |", "|---|---|---|---|"]
    for name in names[1:]:
        n = counts[name] - harness
        cost = "" if name in names[1:3] else f"{defaults - n:,} ({(defaults - n) / defaults:.1%} of the defaults)"
        lines.append(f"| {name} | {n:,} | {n / floor:.2f} | {cost} |")
    lines += ["", f"The harness alone: {harness:,} instructions a request. Two runs of the script agree to about 1 % "
              "a row (up to ~6,000 instructions: the log's 50 ms writes and the deadline sweep follow the clock), "
              "which is the precision of a feature's cost."]
    return write_results(args.out, lines)


if __name__ == "__main__":
    sys.exit(main())
