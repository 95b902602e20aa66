"""`rsinfer serve` with `server.workers` > 1: one supervisor process, one engine process per device, N front ends.

- **Engines** (`engine.py`) load the models of their device (every CPU model in one; one per GPU `device_id`),
  own the ORT sessions and the schedulers, and run the rows of all front ends. SIGTERM and SIGINT do not stop an
  engine: the supervisor does, once every front end has drained (systemd's default KillMode signals every
  process of the unit at once, and a front end's requests in flight still need their engine).
- **Front ends** (`frontend.py`) start once every engine is ready, fetch the models from them (no model is loaded
  twice; each front end reads the tokenizer), bind the same ports with SO_REUSEPORT (the kernel spreads
  connections), and drain on SIGTERM as a single process does.
- **The supervisor** starts them, says READY=1 to systemd once all are up, restarts a front end that dies, and
  stops everything, exiting non-zero, when an engine dies (systemd or Kubernetes starts the server again; a
  front end answers 503 and fails `/health` from the moment its engine's socket closes). SIGTERM: front ends drain
  first, then the engines stop. Metrics of every process are merged through prometheus_client's multiprocess
  mode in a private directory.

`/health` (and KServe ready) is 200 only while the engines and every front end are up: a shared array of
readiness flags, one per front end.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import replace
from typing import Any

from ..config import Config, ModelConfig, split_bind
from ..engine.threads import usable_cpus
from ..errors import ConfigError, RsinferError
from . import ipc

log = logging.getLogger("rsinfer.server")

ACCELERATORS = ("cuda", "tensorrt", "nvrtx", "directml")
RESTARTS = (10, 60.0)          # more front-end deaths than this within that many seconds: give up (exit 1)
STOP_ENGINE_S = 10.0


# ------------------------------------------------------------------ how many, where


def device_of(model: ModelConfig) -> str:
    """The engine a model runs in: its accelerator and device id, else the host ("cpu", also CoreML/OpenVINO)."""
    ep = next((e for e in model.eps if e in ACCELERATORS), None)
    return f"gpu{model.device_id}" if ep is not None else "cpu"


def cores() -> int:
    """The CPUs this process may use (affinity and cgroup quota: engine/threads.py)."""
    return usable_cpus().count


def worker_count(config: Config) -> int:
    """`server.workers`, or for `auto`: on CPU, the forwards need the cores (2 cores: one process is fastest,
    benchmarks/RESULTS.md), so a front end per 8 cores; with accelerators, the front ends are where the CPU time
    goes, so every core but one per engine, up to 8. Always 1 off Linux (SO_REUSEPORT does not spread
    connections there)."""
    if not sys.platform.startswith("linux"):
        if config.server.workers > 1:
            log.warning("server.workers: %d ignored: worker processes need Linux (SO_REUSEPORT spreading "
                        "connections); serving in one process", config.server.workers)
        return 1
    if config.server.workers:
        return config.server.workers
    devices = {device_of(m) for m in config.models}
    n = cores()
    if devices == {"cpu"}:
        return max(1, min(n // 8, 8))
    return max(1, min(n - len(devices), 8))


def check_free(host: str, port: int, keys: str) -> None:
    """The front ends bind with SO_REUSEPORT, which would let them share a port with another server of the same
    user without a word: bind it once here without, so a port in use fails start-up as it does in one process."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror} ({keys})") from None


# ------------------------------------------------------------------ the child processes


def _child(level: int, title: str, fmt: str) -> None:
    """A child's logging as the supervisor's, and its name in `ps -o comm`/`top` (Linux: 15 characters)."""
    from ..server.logs import configure

    configure(logging.getLevelName(level), fmt)
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, title.encode()[:15], 0, 0, 0)   # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def _models_of(config: Config, device: str) -> Config:
    return replace(config, models=tuple(m for m in config.models if device_of(m) == device))


def _stop_when_readable(conn: Any, stop: asyncio.Event) -> None:
    """`stop` is set when the supervisor writes to `conn` or its end closes (it stopped, or died)."""
    loop = asyncio.get_running_loop()

    def fire() -> None:
        loop.remove_reader(conn.fileno())
        stop.set()

    loop.add_reader(conn.fileno(), fire)


def _engine_orders(conn: Any, stop: asyncio.Event, server: Any) -> None:
    """The supervisor's orders to an engine: ("reload", None) - the config file applied (runtime/control.py), then
    ("reloaded", what it did or why not) back; ("stop", None), or its end closing (it stopped, or died) - `stop`."""
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()

    async def reload() -> None:
        try:
            report = await server.control.reload()
            await server.applied(server.config.server.request_timeout_ms / 1000)   # every front end serves it
            conn.send(("reloaded", report.line()))
        except Exception as exc:  # noqa: BLE001 - told to the supervisor; the engine serves on
            conn.send(("reloaded", f"refused: {exc}"))

    def readable() -> None:
        try:
            order, _ = conn.recv()
        except (EOFError, OSError):
            order = "stop"
        if order == "reload":
            task = asyncio.ensure_future(reload())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            return
        loop.remove_reader(conn.fileno())
        stop.set()

    loop.add_reader(conn.fileno(), readable)


def engine_main(config: Config, device: str, address: str, conn: Any, level: int) -> None:
    """An engine process: load this device's models, answer front ends until the supervisor says stop (a message
    or its end of the pipe closing, which also happens when the supervisor dies)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):   # the supervisor decides (SIGHUP: a reload)
        signal.signal(sig, signal.SIG_IGN)
    _child(level, f"rsinfer-{device}", config.server.log_format)
    from ..engine.registry import Registry
    from ..server.metrics import Metrics
    from .engine import EngineServer

    try:
        mine = _models_of(config, device)
        registry = Registry.load(mine)
        server = EngineServer(mine, registry, Metrics(batched=True), select=lambda c: _models_of(c, device))
    except Exception as exc:  # noqa: BLE001 - told to the supervisor, which reports it as `serve` does
        conn.send(("error", ipc.error_to_wire(exc)))
        return
    sys.setswitchinterval(0.001)   # forward threads get the GIL back promptly (as in one process)

    async def run() -> None:
        stop = asyncio.Event()
        _engine_orders(conn, stop, server)
        await server.serve(address, stop, ready=lambda: conn.send(("ready", None)))

    from ..server.run import run_loop

    run_loop(run(), config.server.event_loop)


def frontend_main(config: Config, index: int, host: str, port: int, engines: list[str], board: Any,
                  conn: Any, level: int) -> None:
    """A front-end process: connect to the engines, bind the shared ports, serve until SIGTERM/SIGINT or the
    supervisor's end, drain."""
    _child(level, f"rsinfer-front{index}", config.server.log_format)
    from ..server.run import drain_seconds, run_loop, serve_app
    from ..server.systemd import Notifier
    from .frontend import connect, frontend_app

    def unready() -> str | None:
        down = [i for i in range(len(board)) if not board[i]]
        return f"front end(s) {', '.join(map(str, down))} not up" if down else None

    async def run() -> None:
        clients, models = await connect(engines)
        app = frontend_app(config, clients, models, unready=unready)

        def started(stop: asyncio.Event) -> None:
            _stop_when_readable(conn, stop)
            board[index] = 1
            conn.send(("ready", None))

        try:
            await serve_app(app, host, port, drain_seconds(config), Notifier({}), reuse_port=True, announce=False,
                            started=started)
        finally:
            board[index] = 0

    try:
        run_loop(run(), config.server.event_loop)
    except RsinferError as exc:
        conn.send(("error", ipc.error_to_wire(exc)))
        sys.exit(2)


# ------------------------------------------------------------------ the supervisor


class _Child:
    def __init__(self, process: Any, conn: Any, address: str = "") -> None:
        self.process = process
        self.conn = conn
        self.address = address     # an engine's socket

    @property
    def pid(self) -> int:
        return int(self.process.pid)


class Supervisor:
    def __init__(self, config: Config, host: str, port: int, workers: int) -> None:
        self.config = config
        self.host, self.port, self.workers = host, port, workers
        self.ctx = multiprocessing.get_context("spawn")   # no fork after threads (ORT, gRPC) exist
        self.runtime = tempfile.mkdtemp(prefix="rsinfer-")  # 0700: the engine sockets and the metrics files
        self.metrics_dir = os.path.join(self.runtime, "metrics")
        os.mkdir(self.metrics_dir)
        self.level = logging.getLogger().getEffectiveLevel()
        self.devices = sorted({device_of(m) for m in config.models})
        self.engines: dict[str, _Child] = {}
        self.frontends: list[_Child | None] = [None] * workers
        self.board: Any = self.ctx.RawArray("b", workers)
        self.stopping = False
        self.exit_code = 0
        self._deaths: list[float] = []
        self._signals: list[int] = []
        self._reload = False                   # a SIGHUP came
        self._reloading: set[_Child] = set()   # the engines still applying it
        self._reload_again = False
        self._wake_r, self._wake_w = socket.socketpair()

    # ---------------------------------------------------------- starting

    def _spawn(self, target: Any, args: tuple[Any, ...], name: str, address: str = "") -> _Child:
        parent, child = self.ctx.Pipe()
        # children write metrics there, never talk to systemd (only the supervisor does), and stop on our word
        saved = {k: os.environ.pop(k) for k in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID") if k in os.environ}
        try:
            process = self.ctx.Process(target=target, args=(*args, child, self.level), name=name, daemon=False)
            process.start()
        finally:
            os.environ.update(saved)
        child.close()
        return _Child(process, parent, address)

    def _await_ready(self, child: _Child, what: str) -> None:
        """Its ("ready", None), or the error it reports, or its death: raised as the error `serve` reports."""
        while True:
            ready = multiprocessing.connection.wait([child.conn, child.process.sentinel, self._wake_r])
            if self._wake_r in ready:
                self._drain_signals()
                if self.stopping:
                    raise KeyboardInterrupt
            if child.conn in ready:
                try:
                    kind, payload = child.conn.recv()
                except EOFError:
                    kind, payload = "died", None
                if kind == "ready":
                    return
                if kind == "error":
                    raise ipc.error_from_wire(payload)
            if child.process.sentinel in ready or not child.process.is_alive():
                child.process.join(5)
                raise RsinferError(f"{what} exited with code {child.process.exitcode} while starting")

    def start(self) -> None:
        check_free(self.host, self.port, "server.bind, --host, --port")
        if self.config.server.grpc_bind:
            check_free(*split_bind(self.config.server.grpc_bind), "server.grpc_bind")
        for device in self.devices:
            address = os.path.join(self.runtime, f"engine-{device}.sock")
            self.engines[device] = self._spawn(engine_main, (self.config, device, address),
                                               f"rsinfer-engine-{device}", address)
        for device, child in self.engines.items():
            self._await_ready(child, f"the engine process for {device}")
        started = [self._start_frontend(i) for i in range(self.workers)]   # side by side: each reads tokenizers
        for i, child in enumerate(started):
            self._await_ready(child, f"front end {i}")

    def _start_frontend(self, index: int) -> _Child:
        engines = [c.address for c in self.engines.values()]
        child = self.frontends[index] = self._spawn(frontend_main, (self.config, index, self.host, self.port, engines,
                                                                    self.board), f"rsinfer-frontend-{index}")
        return child

    # ---------------------------------------------------------- running

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if signum == signal.SIGHUP:
            self._reload = True
        else:
            self._signals.append(signum)

    def _drain_signals(self) -> None:
        try:
            while self._wake_r.recv(64):
                pass
        except BlockingIOError:
            pass
        if self._signals:
            self.stopping = True

    def _start_reload(self, notifier: Any) -> None:
        """SIGHUP: every engine applies the config file (each its device's models) and pushes its new set to the
        front ends; systemd hears RELOADING=1 now and READY=1 once every engine answered."""
        self._reload = False
        if self._reloading:
            log.warning("reload: one is running; this SIGHUP is applied after it")
            self._reload_again = True
            return
        notifier.reloading()
        log.warning("reload: reading the config file again")
        for child in self.engines.values():
            try:
                child.conn.send(("reload", None))
                self._reloading.add(child)
            except OSError:
                pass

    def _engine_said(self, device: str, notifier: Any) -> None:
        child = self.engines[device]
        try:
            kind, payload = child.conn.recv()
        except (EOFError, OSError):
            return                  # its death is seen by its sentinel
        if kind == "reloaded":
            log.warning("reload: engine %s: %s", device, payload)
            self._reloading.discard(child)
            if not self._reloading:
                notifier.ready(f"serving with {self.workers} front ends (reloaded)")
                if self._reload_again:
                    self._reload_again = False
                    self._start_reload(notifier)

    def run(self, notifier: Any) -> int:
        """Watch the children until a signal or an engine's death; returns the exit code."""
        watchdog_s = notifier.watchdog_s / 2 if notifier.watchdog_s else None
        while not self.stopping:
            if self._reload:
                self._start_reload(notifier)
            waits: dict[Any, tuple[str, Any]] = {self._wake_r: ("signal", None)}
            for device, child in self.engines.items():
                waits[child.process.sentinel] = ("engine", device)
                waits[child.conn] = ("said", device)
            for i, front in enumerate(self.frontends):
                if front is not None:
                    waits[front.process.sentinel] = ("frontend", i)
            ready = multiprocessing.connection.wait(list(waits), timeout=watchdog_s or 5.0)
            if watchdog_s:
                notifier.send("WATCHDOG=1")
            if self._signals:   # a signal first: under systemd every process gets SIGTERM at once, and a front
                self._drain_signals()   # end that drained and left is then not one to start again
            for obj in ready:
                what, which = waits[obj]
                if what == "signal":
                    self._drain_signals()
                elif what == "said":
                    self._engine_said(which, notifier)
                elif what == "engine":
                    code = self.engines[which].process.exitcode
                    log.error("the engine process for %s exited (code %s): stopping (exit 1)", which, code)
                    self.stopping, self.exit_code = True, 1
                elif what == "frontend" and not self.stopping:
                    self._restart(which)
        return self.exit_code

    def _restart(self, index: int) -> None:
        old = self.frontends[index]
        assert old is not None
        if self._signals:
            self.stopping = True
            return
        old.process.join(5)
        self.board[index] = 0
        self._mark_dead(old.pid)
        now = time.monotonic()
        self._deaths = [t for t in self._deaths if now - t < RESTARTS[1]] + [now]
        if len(self._deaths) > RESTARTS[0]:
            log.error("front ends died %d times in %.0f s: stopping (exit 1)", len(self._deaths), RESTARTS[1])
            self.stopping, self.exit_code = True, 1
            return
        log.error("front end %d (pid %d) exited with code %s: starting it again", index, old.pid,
                  old.process.exitcode)
        old.conn.close()
        new = self._start_frontend(index)
        print(f"rsinfer: front end {index} (pid {old.pid}) exited; restarted as pid {new.pid}", file=sys.stderr,
              flush=True)
        self.say_processes()

    def say_processes(self) -> None:
        engines = ", ".join(f"{d}={c.pid}" for d, c in self.engines.items())
        fronts = ", ".join(str(c.pid) for c in self.frontends if c is not None)
        print(f"rsinfer: processes: engines {engines}; front ends {fronts}", file=sys.stderr, flush=True)

    def _mark_dead(self, pid: int) -> None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, self.metrics_dir)  # type: ignore[no-untyped-call]

    # ---------------------------------------------------------- stopping

    def stop(self, drain_s: float) -> None:
        """Front ends drain (SIGTERM, as a single process does); then the engines stop; stragglers are killed."""
        live = [c for c in self.frontends if c is not None and c.process.is_alive()]
        for child in live:
            child.process.terminate()
        self._join(live, drain_s + 5)
        for child in self.engines.values():
            if child.process.is_alive():
                try:
                    child.conn.send(("stop", None))
                except OSError:
                    pass
        self._join(list(self.engines.values()), STOP_ENGINE_S)
        for child in [*self.engines.values(), *(c for c in self.frontends if c is not None)]:
            child.conn.close()

    @staticmethod
    def _join(children: list[_Child], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for child in children:
            child.process.join(max(0.0, deadline - time.monotonic()))
            if child.process.is_alive():
                log.error("%s (pid %d) did not stop in time: killed", child.process.name, child.pid)
                child.process.kill()
                child.process.join(5)

    def close(self) -> None:
        self._wake_r.close()
        self._wake_w.close()
        shutil.rmtree(self.runtime, ignore_errors=True)


def serve_workers(config: Config, host: str, port: int) -> None:
    """The supervisor's life: start, announce, watch, stop. Raises what a child reported at start-up (as `serve`
    reports it); exits 1 when an engine died."""
    from ..server.run import drain_seconds
    from ..server.systemd import Notifier

    workers = worker_count(config)
    config = replace(config, server=replace(config.server, workers=workers))   # its children: the count resolved
    sup = Supervisor(config, host, port, workers)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = sup.metrics_dir   # before any child imports prometheus_client
    notifier = Notifier()
    sup._wake_w.setblocking(False)
    sup._wake_r.setblocking(False)
    old_wakeup = signal.set_wakeup_fd(sup._wake_w.fileno())
    previous = {s: signal.signal(s, sup._on_signal) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    code = 0
    try:
        notifier.status(f"starting {len(sup.devices)} engine process(es) and {workers} front end(s)")
        try:
            sup.start()
        except KeyboardInterrupt:
            return
        shown = f"[{host}]" if ":" in host else host
        names = ", ".join(f"{m.name} ({m.kind})" for m in config.models)
        grpc_note = f" and gRPC on {config.server.grpc_bind}" if config.server.grpc_bind else ""
        print(f"rsinfer: listening on http://{shown}:{port}{grpc_note} serving {names} "
              f"({workers} front-end processes, engines: {', '.join(sup.devices)})", file=sys.stderr, flush=True)
        sup.say_processes()
        notifier.ready(f"serving {len(config.models)} model(s) on {shown}:{port}{grpc_note} with {workers} "
                       "front ends")
        code = sup.run(notifier)
        notifier.stopping()
        log.warning("stopping: front ends drain the requests in flight, then the engines stop")
    finally:
        sup.stopping = True
        sup.stop(drain_seconds(config))
        signal.set_wakeup_fd(old_wakeup)
        for s, handler in previous.items():
            signal.signal(s, handler)
        sup.close()
        os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
        notifier.close()
    if code:
        sys.exit(code)
