"""`rsinfer serve`: load every model, then bind, serve, and drain on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from aiohttp import web

from ..config import Config
from ..engine.registry import Registry
from ..engine.threads import limit_tokenizer_threads, usable_cpus
from ..errors import ConfigError, RsinferError
from ..runtime import Runtime
from .app import check_served, create_app
from .dispatch import install
from .metrics import Metrics
from .routes.common import STATE
from .state import ServerState
from .systemd import Notifier

log = logging.getLogger("rsinfer.server")
T = TypeVar("T")


async def app_runner(app: web.Application, drain_s: float) -> web.AppRunner:
    """The runner every request of `app` goes through, set up (what benchmarks/instructions.py counts, too)."""
    # handler_cancellation: a client that leaves cancels its handler, and so its queued rows and forwards
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=drain_s,
                           handler_cancellation=True)
    await runner.setup()
    install(runner)        # the routes' answers remembered: no router walk for a path served before
    return runner


async def serve_app(app: web.Application, host: str, port: int, drain_s: float, notifier: Notifier, *,
                    reuse_port: bool = False, announce: bool = True,
                    started: Callable[[asyncio.Event], None] | None = None) -> None:
    """Bind HTTP (and gRPC), serve until SIGTERM/SIGINT (or until `started`'s hook sets the stop event), then
    drain; SIGHUP reloads the config file (`announce`: the one-process server; a front-end process ignores it, its
    supervisor reloads). `reuse_port`: front-end processes share the listening ports (SO_REUSEPORT)."""
    runner = await app_runner(app, drain_s)
    site = web.TCPSite(runner, host, port, backlog=1024, reuse_port=reuse_port or None)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror} (server.bind, --host, --port)") from None
    state = app[STATE]
    grpc_server = None
    if state.config.server.grpc_bind:
        from .kserve.grpc_service import start

        try:
            grpc_server = await start(state, state.config.server.grpc_bind)
        except BaseException:
            await runner.cleanup()
            raise
    shown = f"[{host}]" if ":" in host else host
    grpc_note = f" and gRPC on {state.config.server.grpc_bind}" if grpc_server is not None else ""
    if announce:
        print(f"rsinfer: listening on http://{shown}:{port}{grpc_note} serving {served(state.registry)}",
              file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    reloads: set[asyncio.Task[None]] = set()

    def hangup() -> None:
        if announce:
            task = asyncio.ensure_future(reload_config(state, notifier))
            reloads.add(task)
            task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, hangup)   # a front-end process: nothing (never the default: exit)
    if started is not None:
        started(stop)
    # every model is loaded and checked, and every listening socket is bound: ready
    notifier.ready(f"serving {len(state.registry.entries)} model(s) on {shown}:{port}{grpc_note}")
    watchdog = asyncio.create_task(notifier.watchdog())
    await stop.wait()
    state.stopping = True      # /health and KServe ready say 503 from now on; the listener closes next
    notifier.stopping()
    delay = state.config.server.shutdown_delay_ms / 1000
    if delay:
        log.warning("shutdown signal received: not ready; still serving for %.1f s (server.shutdown_delay_ms)",
                    delay)
        if grpc_server is not None:
            await grpc_server.health.enter_graceful_shutdown()
        await asyncio.sleep(delay)
    watchdog.cancel()
    log.warning("shutdown signal received: draining requests in flight")
    # both fronts stop accepting and let the calls in flight finish (up to drain_s), side by side; the app's
    # cleanup waits for the gRPC drain before it stops the schedulers
    if grpc_server is not None:
        state.runtime.draining.append(asyncio.ensure_future(grpc_server.stop(drain_s)))
    await runner.cleanup()
    log.warning("stopped")


async def reload_config(state: ServerState, notifier: Notifier) -> None:
    """SIGHUP: the config file read again and applied model by model (runtime/control.py); an invalid file changes
    nothing (the error is logged with its key path). systemd hears RELOADING=1, then READY=1."""
    notifier.reloading()
    try:
        await state.models.reload()
    except RsinferError:
        pass                   # logged by the control, with the key path; the previous config serves on
    except Exception:          # noqa: BLE001 - a reload never stops the server
        log.exception("reload failed")
    finally:
        notifier.ready(f"serving {len(state.registry.entries)} model(s)")


def served(registry: Registry) -> str:
    return ", ".join(f"{n} ({v[0].kind})" for n, v in registry.entries.items())


def drain_seconds(config: Config) -> float:
    """How long a stop may take: the shutdown delay, then the longest request in flight."""
    return (config.server.shutdown_delay_ms + config.server.request_timeout_ms) / 1000 + 1


def run_loop(main: Coroutine[Any, Any, T], choice: str = "auto") -> T:
    """asyncio.run with the event loop `server.event_loop` names: uvloop (libuv; measured in benchmarks/overhead.py)
    when installed and not turned off, else asyncio's. A front end, an engine and the one-process server all run
    on it."""
    try:
        if choice in ("auto", "uvloop"):
            try:
                import uvloop
            except ImportError:
                if choice == "uvloop":
                    raise ConfigError("server.event_loop: uvloop is not installed (pip install uvloop)") from None
            else:
                log.info("event loop: uvloop")
                result: T = uvloop.run(main)
                return result
        log.info("event loop: asyncio")
        return asyncio.run(main)
    finally:      # the lines the loop's last write would have taken (logs.LoopStreamHandler): out now, in order
        for handler in logging.getLogger().handlers:
            handler.flush()


def serve(config: Config, host: str | None = None, port: int | None = None) -> None:
    """The daemon in one process (`rsinfer serve` chooses between this and worker processes: cli/serve.py; the
    server package never imports workers/, which builds on it)."""
    check_served(config)
    limit_tokenizer_threads(usable_cpus())
    notifier = Notifier()  # systemd's notify protocol when $NOTIFY_SOCKET is set; else nothing
    notifier.status(f"loading {len(config.models)} model(s)")
    registry = Registry.load(config, on_load=lambda where: notifier.status(f"loading {where}"))
    notifier.status("models loaded; binding the listening sockets")  # the listener binds only after every load
    app = create_app(Runtime(config, registry, Metrics()))
    # Forward threads need the GIL briefly before and after each session.run; with the default 5 ms switch
    # interval a busy event loop can keep a replica idle that long. 1 ms keeps replicas fed.
    sys.setswitchinterval(0.001)
    try:
        run_loop(serve_app(app, host or config.server.host, port or config.server.port, drain_seconds(config),
                           notifier), config.server.event_loop)
    finally:
        notifier.close()
