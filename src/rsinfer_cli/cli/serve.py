"""Run the HTTP daemon: every configured model is loaded before the listener binds."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

import typer

if TYPE_CHECKING:
    from ..config import Config

LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["text", "json"]
LEVELS = get_args(LogLevel)


def serve_cmd(
    config: Path = typer.Option(..., "--config", "-c", help="YAML config file (also $RSINFER_CONFIG).",
                                envvar="RSINFER_CONFIG", show_envvar=False),
    host: str = typer.Option(None, "--host", help="Address to listen on, HTTP and gRPC (overrides the host of "
                             "server.bind and server.grpc_bind)."),
    port: int = typer.Option(None, "--port", help="Port to listen on (overrides server.bind)."),
    log_level: LogLevel = typer.Option("info", "--log-level", case_sensitive=False,
                                   help="debug, info (one line per request), warning or error."),
    log_format: LogFormat = typer.Option(None, "--log-format", help="text or json: one object per line (overrides "
                                   "server.log_format)."),
    workers: str = typer.Option(None, "--workers", help="Front-end processes beside one engine process per device: "
                                "a number or auto (overrides server.workers; 1: one process)."),
) -> None:
    from ..config import load_config
    from ..server.logs import configure

    _check_options(log_level, port, log_format, workers)
    configure(log_level, log_format or "text")     # config errors are reported in the format asked for
    cfg = _overridden(load_config(config), host, log_format, workers)
    configure(log_level, cfg.server.log_format)
    from ..server.run import serve

    if cfg.server.workers != 1:
        from ..engine.threads import limit_tokenizer_threads, usable_cpus
        from ..server.app import check_served
        from ..workers.supervisor import serve_workers, worker_count

        if worker_count(cfg) > 1:
            check_served(cfg)                        # before any process starts (serve() checks its own)
            limit_tokenizer_threads(usable_cpus())   # inherited by the worker processes
            serve_workers(cfg, host or cfg.server.host, port or cfg.server.port)
            return
    serve(cfg, host, port)


def _check_options(log_level: str, port: int | None, log_format: str | None, workers: str | None) -> None:
    from ..errors import ConfigError

    if log_level.lower() not in LEVELS:
        raise ConfigError(f"--log-level must be one of {', '.join(LEVELS)}, got '{log_level}'")
    if port is not None and not 0 <= port < 65536:
        raise ConfigError(f"--port must be 0..65535, got {port}")
    if log_format is not None and log_format not in ("text", "json"):
        raise ConfigError(f"--log-format must be text or json, got '{log_format}'")
    if workers is not None and not (workers == "auto" or (workers.isdigit() and 1 <= int(workers) <= 64)):
        raise ConfigError(f"--workers must be 1..64 or auto, got '{workers}'")


def _overridden(cfg: Config, host: str | None, log_format: str | None, workers: str | None) -> Config:
    """The command line's overrides of server.*, applied in one place."""
    import dataclasses

    server: dict[str, Any] = {}
    if log_format is not None:
        server["log_format"] = log_format
    if host is not None and cfg.server.grpc_bind:     # gRPC listens wherever HTTP does (a container's 0.0.0.0)
        from ..config import split_bind

        grpc_port = split_bind(cfg.server.grpc_bind)[1]
        server["grpc_bind"] = f"[{host}]:{grpc_port}" if ":" in host else f"{host}:{grpc_port}"
    if workers is not None:
        server["workers"] = 0 if workers == "auto" else int(workers)
    return dataclasses.replace(cfg, server=dataclasses.replace(cfg.server, **server)) if server else cfg
