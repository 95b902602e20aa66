"""Run the daemon for tests: in-process on a background loop (fast, patchable) or as a real subprocess."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from rsinfer_cli.config import Config
from rsinfer_cli.engine.registry import Registry


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EngineThread:
    """An EngineServer on its own thread and event loop, listening on a Unix socket in a temporary folder."""

    def __init__(self, config: Config, registry: Registry, metrics) -> None:
        import tempfile

        from rsinfer_cli.workers.engine import EngineServer

        self._dir = tempfile.TemporaryDirectory(prefix="rsinfer-engine-")
        self.address = f"{self._dir.name}/engine.sock"
        self.server = EngineServer(config, registry, metrics)
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("engine thread did not start")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._stop = asyncio.Event()
        self._loop.run_until_complete(self.server.serve(self.address, self._stop, ready=self._ready.set))
        self._loop.close()

    def close(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        self._dir.cleanup()


class ServerThread:
    """create_app() served on 127.0.0.1:<free port> from a thread with its own event loop. `mode` (the `serve_mode`
    fixture): "single", one process - create_app over the loaded models; or "workers", the multi-process split in
    one process - an EngineServer on a thread of its own owns the models and their schedulers, and the app is a
    front end that reaches it over a Unix socket exactly as a worker process does."""

    def __init__(self, config: Config, registry: Registry | None = None, grpc: bool = False,
                 mode: str = "single") -> None:
        from rsinfer_cli.server.app import create_app
        from rsinfer_cli.server.routes.common import STATE

        self.mode = mode
        self.registry = registry or Registry.load(config)
        self._loop = asyncio.new_event_loop()
        self.engine: EngineThread | None = None
        if self.mode == "workers":
            from rsinfer_cli.server.metrics import Metrics
            from rsinfer_cli.workers.frontend import connect, frontend_app

            metrics = Metrics()  # one process: the engine's samples and the front end's in one registry
            self.engine = EngineThread(config, self.registry, metrics)
            clients, models = self._loop.run_until_complete(connect([self.engine.address], 30))
            self.app = frontend_app(config, clients, models, metrics)
        else:
            from rsinfer_cli.runtime import Runtime
            from rsinfer_cli.server.metrics import Metrics

            self.app = create_app(Runtime(config, self.registry, Metrics()))
        self.state = self.app[STATE]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.grpc_url = f"127.0.0.1:{free_port()}" if grpc else None  # KServe v2 gRPC in the same loop
        self._grpc = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="server", daemon=True)

    @property
    def schedulers(self) -> dict:
        """The models' schedulers, where the forwards run (the engine's in workers mode)."""
        return (self.engine.server.runtime if self.engine is not None else self.state.runtime).queues

    @property
    def pipelines(self) -> dict:
        """The models' pipelines with their sessions (the engine's in workers mode)."""
        return (self.engine.server.runtime if self.engine is not None else self.state).pipelines

    def _run(self) -> None:
        from aiohttp import web

        from rsinfer_cli.server.dispatch import install

        asyncio.set_event_loop(self._loop)
        self.runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=5)
        self._loop.run_until_complete(self.runner.setup())
        self.dispatch = install(self.runner)     # as serve_app does
        site = web.TCPSite(self.runner, "127.0.0.1", self.port)
        self._loop.run_until_complete(site.start())
        if self.grpc_url:
            from rsinfer_cli.server.kserve.grpc_service import start

            self._grpc = self._loop.run_until_complete(start(self.state, self.grpc_url))
        self._ready.set()
        self._loop.run_forever()
        if self._grpc is not None:
            self._loop.run_until_complete(self._grpc.stop(1))
        self._loop.run_until_complete(self.runner.cleanup())
        self._loop.close()

    def __enter__(self) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("test server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        if self.engine is not None:
            self.engine.close()


class ServeProcess:
    """`rsinfer serve` as a subprocess; ready when it prints its listening line (bounded wait)."""

    def __init__(self, config_path: Path, port: int, extra_env: dict | None = None, args: list[str] = (),
                 python: str | None = None) -> None:
        """`python`: another interpreter with rsinfer installed (the OpenVINO venv's)."""
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        env = {**os.environ, **(extra_env or {})}
        self.proc = subprocess.Popen(
            [python or sys.executable, "-m", "rsinfer_cli", "serve", "--config", str(config_path), "--port", str(port),
             "--host", "127.0.0.1", "--log-level", "info", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, env=env)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any("listening on" in line for line in self.lines):
                return
            if self.proc.poll() is not None:
                raise RuntimeError("rsinfer serve exited:\n" + "".join(self.lines))
            time.sleep(0.05)
        raise RuntimeError("rsinfer serve did not become ready:\n" + "".join(self.lines))

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(5)
            self._reader.join(5)
            if self.proc.stdout is not None:
                self.proc.stdout.close()

    @property
    def output(self) -> str:
        return "".join(self.lines)


def process_tree(pid: int) -> list[int]:
    """pid and every process below it (a multi-process server: the supervisor, its engines and front ends)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            continue
    return out


def worker_pids(output: str) -> tuple[dict[str, int], list[int]]:
    """(engine pid by device, front-end pids) from a multi-process server's `processes:` line (the last one)."""
    import re

    m = re.findall(r"processes: engines ([^;]+); front ends ([0-9, ]+)", output)
    assert m, output
    engines, fronts = m[-1]
    return ({d: int(p) for d, p in (e.split("=") for e in engines.split(", "))},
            [int(p) for p in fronts.split(", ")])


def forwards(url: str, model: str, version: str = "") -> tuple[float, float]:
    """(forwards, rows) a model's scheduler has run, read from the server's /metrics."""
    import re

    import httpx

    text = httpx.get(url + "/metrics").text

    def value(name: str) -> float:
        m = re.search(rf'^{name}{{model="{model}",version="{version}"}} ([0-9.e+]+)$', text, re.M)
        return float(m.group(1)) if m else 0.0

    return value("rsinfer_batch_rows_count"), value("rsinfer_batch_rows_sum")


class RedisServer:
    """A real `redis-server` on a free loopback port (no persistence), that a test can kill and start again."""

    def __init__(self, workdir: Path) -> None:
        import shutil

        self.binary = shutil.which("redis-server")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None

    def start(self) -> RedisServer:
        assert self.binary is not None
        self.proc = subprocess.Popen([self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", str(self.workdir)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def client(self):
        import redis

        return redis.Redis.from_url(self.url)
