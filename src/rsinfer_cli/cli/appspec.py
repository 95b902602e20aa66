"""The Typer app read as data: each command with its parameters (from the declarations, not from Typer's click
internals), the root help and the environment variables rsinfer reads. The generated artefacts - completions and
the man page (cli/docgen.py), the docs site's CLI reference (cli/docref.py) - are all made from it."""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typer.models import ArgumentInfo, OptionInfo

from .app import app

ENVIRONMENT = {
    "RSINFER_CONFIG": "config file for commands that take --config",
    "RSINFER_DEBUG": "set to 1 to show tracebacks of errors",
    "RSINFER_LOG_LEVEL": "log level of the one-shot commands (default WARNING)",
    "HF_HOME": "Hugging Face home; the Hub cache is $HF_HOME/hub unless server.hf_cache_dir is set",
    "HF_HUB_CACHE": "the Hub cache folder itself",
    "HF_ENDPOINT": "Hub URL (a mirror)",
    "HF_TOKEN": "token for gated or private repos",
    "HF_HUB_OFFLINE": "set to 1 to use the Hub cache only, with no network",
}


@dataclass(frozen=True)
class Param:
    """One command parameter, read from the Typer app's declarations (not from Typer's click internals)."""

    kind: str                 # option | argument
    name: str
    opts: tuple[str, ...]
    help: str
    default: Any
    is_flag: bool
    is_path: bool
    required: bool
    metavar: str


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    params: tuple[Param, ...]


def params_of(callback: Any) -> tuple[Param, ...]:
    hints = typing.get_type_hints(callback)
    out = []
    for p in inspect.signature(callback).parameters.values():
        info = p.default
        tp = hints.get(p.name)
        is_path = tp is Path or (typing.get_origin(tp) is not None and Path in typing.get_args(tp))
        is_flag = tp is bool
        if isinstance(info, OptionInfo):
            opts = tuple(info.param_decls or ()) or (f"--{p.name.replace('_', '-')}",)
            out.append(Param("option", p.name, opts, info.help or "", info.default, is_flag, is_path,
                             info.default is ..., info.metavar or ("PATH" if is_path else p.name.upper())))
        elif isinstance(info, ArgumentInfo):
            out.append(Param("argument", p.name, (), info.help or "", info.default, False, is_path,
                             info.default is ..., info.metavar or p.name.upper()))
    return tuple(out)


def commands() -> list[Command]:
    cmds = [Command(str(c.name or getattr(c.callback, "__name__", "")),
                    c.help or (getattr(c.callback, "__doc__", "") or ""), params_of(c.callback))
            for c in app.registered_commands]
    return sorted(cmds, key=lambda c: c.name)


def root_help() -> str:
    cb = app.registered_callback
    return (cb.callback.__doc__ if cb and cb.callback else "") or ""
