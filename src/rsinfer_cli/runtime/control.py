"""Changing the served models of a running server without a restart: the config file read again (SIGHUP) and
applied model by model, and the KServe v2 repository extension's load and unload of one model.

- A reload reads and validates the whole file first; an invalid one changes nothing (the error, with its key path,
  is logged and returned). Then: a new entry loads and is served once it is ready; a removed one stops taking
  requests, answers what it holds and is freed; a changed one loads beside the old and takes over when ready, the old
  draining; an entry that did not change is not touched (its queue, cache entries and requests in flight go on).
  `server:` keys are not applied live: each one that changed is reported as needing a restart.
- A model that fails to load keeps what served before: a changed model its old version, a new one is UNAVAILABLE
  with the reason. A later reload (or load) tries again.
- Every transition is one log line and the metrics' `model_state` / `model_loads`.

One operation at a time (a lock); the loads run on threads, the switch on the event loop, in one step (the registry,
pipelines and queues change together: a request sees the old set or the new one). Nothing here knows HTTP, gRPC or
signals: the fronts call `reload`, `load`, `unload` and `index`."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ..config import Config, ModelConfig, ServerConfig, load_config
from ..engine.model import LoadedModel, load_model
from ..engine.threads import plan_models
from ..errors import ConfigError, ModelNotFound, RsinferError
from ..pipelines.base import RowPipeline
from . import Runtime

log = logging.getLogger("rsinfer.engine")

READY, LOADING, UNAVAILABLE = "READY", "LOADING", "UNAVAILABLE"


class ControlMetrics(Protocol):
    def model_loaded(self, model: str, ok: bool, seconds: float) -> None: ...

    def state(self, model: str, state: str | None) -> None: ...


@dataclass
class ModelState:
    state: str
    reason: str = ""


@dataclass
class Report:
    """What a reload did, by model name."""

    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    restart: list[str] = field(default_factory=list)    # server keys that changed: they need a restart

    def line(self) -> str:
        parts = [f"{what} {', '.join(names)}" for what, names in (
            ("added", self.added), ("changed", self.changed), ("removed", self.removed)) if names]
        parts += [f"failed {name} ({why})" for name, why in self.failed.items()]
        return "; ".join(parts) or "no model changed"


Loaded = tuple[list[LoadedModel], dict[str, RowPipeline]]


class Control:
    """What the fronts ask of whoever changes the served set: this module's ModelControl, or a front-end process's
    RemoteControl (workers/frontend.py), which asks its engines."""

    runtime: Runtime
    states: dict[str, ModelState]

    def index(self) -> list[tuple[str, list[str], ModelState]]:
        """Every configured model: its versions and its state, in config order."""
        reg = self.runtime.registry
        states = self.states
        return [(m.name, reg.versions(m.name) or [v.version for v in m.versions] or ["1"],
                 states.get(m.name, ModelState(UNAVAILABLE, "not loaded")))
                for m in self.runtime.config.models]

    def state_of(self, name: str) -> ModelState:
        state = self.states.get(name)
        if state is None:
            raise ModelNotFound(f"model '{name}' is not in the configuration", model=name)
        return state

    async def reload(self) -> object:
        raise NotImplementedError

    async def load(self, name: str) -> None:
        raise NotImplementedError

    async def unload(self, name: str) -> None:
        raise NotImplementedError


class ModelControl(Control):
    """`check(config)` refuses a config the server cannot serve (kinds without routes); `select(config)` keeps the
    models this runtime serves (an engine process: those of its device); `changed()` is told after every change of
    the served set (the fronts refresh what they copied; an engine process tells its front ends). `quiet_s`: how long
    a replaced version's queue must stay empty before it is freed (an engine: rows its front ends already sent)."""

    def __init__(self, runtime: Runtime, *, check: Callable[[Config], None] | None = None,
                 select: Callable[[Config], Config] | None = None, changed: Callable[[], None] | None = None,
                 metrics: ControlMetrics | None = None, quiet_s: float = 0.0) -> None:
        self.runtime = runtime
        self.check = check
        self.select = select
        self.changed = changed
        self.metrics = metrics
        self.quiet_s = quiet_s
        self.states: dict[str, ModelState] = {}
        # the server section as the file said it at start: the command line's overrides (--port, --workers) are
        # not edits of the file, so a reload compares the file with itself
        self.file_server = self._file_server()
        self._lock = asyncio.Lock()
        for m in runtime.config.models:
            versions = runtime.registry.entries.get(m.name)
            if versions and metrics is not None:     # the start-up loads count too
                metrics.model_loaded(m.name, True, sum(v.stats.get("resolve_s", 0) + v.stats.get("build_s", 0)
                                                       for v in versions))
            self._set(m.name, READY if versions else UNAVAILABLE, quiet=True)

    @property
    def file(self) -> str:
        return self.runtime.config.file

    def _file_server(self) -> ServerConfig:
        try:
            return load_config(self.file).server if Path(self.file).is_file() else self.runtime.config.server
        except ConfigError:
            return self.runtime.config.server

    # ------------------------------------------------------------ what the fronts call

    async def reload(self) -> Report:
        """The config file read again and applied (see the module's docstring). ConfigError: nothing changed."""
        async with self._lock:
            new = await self._read()
            old = self.runtime.config
            report = self._diff(old, new)
            before = {m.name: m for m in old.models}
            after = {m.name: m for m in new.models}
            results = await self._load_all({n: after[n] for n in (*report.added, *report.changed)}, new)
            for name in report.removed:
                self._retire(self.runtime.install(name, None, {}))
                self.states.pop(name, None)
                self._note_gone(name)
            kept: dict[str, ModelConfig] = {}
            for name, result in results.items():
                if not isinstance(result, BaseException):
                    self._serve(name, after[name], result)
                    continue
                report.failed[name] = str(result)
                if name in before:       # the old version goes on serving
                    kept[name] = before[name]
                    log.error("reload: model %s: the new entry failed to load (%s); still serving the old one",
                              name, result)
            models = tuple(kept.get(m.name, m) for m in new.models)
            self.runtime.config = dataclasses.replace(old, models=models)
            self._changed()
            log.warning("reload of %s: %s", self.file, report.line())
            return report

    def _diff(self, old: Config, new: Config) -> Report:
        """What a reload changes, by model name; each `server:` key that changed is logged as needing a restart."""
        report = Report(restart=[f"server.{f.name}" for f in dataclasses.fields(new.server)
                                 if getattr(self.file_server, f.name) != getattr(new.server, f.name)])
        for key in report.restart:
            log.warning("reload: %s changed: needs a restart (the running value is kept)", key)
        before = {m.name: m for m in old.models}
        after = {m.name: m for m in new.models}
        report.removed = [n for n in before if n not in after]
        report.added = [n for n in after if n not in before]
        report.changed = [n for n in after if n in before and after[n] != before[n]]
        report.unchanged = [n for n in after if n in before and after[n] == before[n]]
        return report

    async def load(self, name: str) -> None:
        """Model `name`'s entry of the config file (read again now) loaded, replacing what serves under that name
        once it is ready. ModelNotFound: the file has no such entry."""
        async with self._lock:
            new = await self._read()
            entry = next((m for m in new.models if m.name == name), None)
            if entry is None:
                raise ModelNotFound(f"model '{name}' is not in the configuration file", model=name)
            result = (await self._load_all({name: entry}, new))[name]
            if isinstance(result, BaseException):
                raise result
            self._serve(name, entry, result)
            models = [m for m in self.runtime.config.models if m.name != name]
            order = [m.name for m in new.models]     # the file's order, for the index
            models.append(entry)
            models.sort(key=lambda m: order.index(m.name) if m.name in order else len(order))
            self.runtime.config = dataclasses.replace(self.runtime.config, models=tuple(models))
            self._changed()

    async def unload(self, name: str) -> None:
        """Model `name` served no more: requests get 404 from now on, what it holds is answered, then it is freed."""
        async with self._lock:
            self.state_of(name)
            self._retire(self.runtime.install(name, None, {}))
            why = "unloaded through the repository API"
            self.runtime.registry.unavailable[name] = why
            self._set(name, UNAVAILABLE, why)
            self._changed()

    # ------------------------------------------------------------ the steps

    async def _read(self) -> Config:
        loop = asyncio.get_running_loop()
        try:
            new = await loop.run_in_executor(None, load_config, self.file)
            if self.check is not None:
                self.check(new)
            if self.select is not None:
                new = self.select(new)
        except ConfigError as exc:
            log.error("reload of %s refused, still serving the previous configuration: %s", self.file, exc)
            raise
        return new

    async def _load_all(self, entries: dict[str, ModelConfig], config: Config) -> dict[str, Loaded | BaseException]:
        """Each entry's versions loaded (side by side, on threads) and their pipelines prepared."""
        for name in entries:
            if name not in self.runtime.registry.entries:
                self._set(name, LOADING)
        loop = asyncio.get_running_loop()
        names = list(entries)
        results = await asyncio.gather(*(loop.run_in_executor(None, self._load, entries[n], config) for n in names),
                                       return_exceptions=True)
        out: dict[str, Loaded | BaseException] = {}
        for name, result in zip(names, results, strict=True):
            if isinstance(result, BaseException) and not isinstance(result, Exception):
                raise result      # KeyboardInterrupt and the like are not a load failure
            out[name] = result
            if isinstance(result, BaseException):
                if name not in self.runtime.registry.entries:
                    self._set(name, UNAVAILABLE, f"load failed: {result}")
                    self.runtime.registry.unavailable[name] = f"its load failed ({result})"
                log.error("model %s failed to load: %s", name, result)
        return out

    def _load(self, entry: ModelConfig, config: Config) -> Loaded:
        """One entry, every version (a thread); the time and result go to the metrics."""
        t0 = time.perf_counter()
        ok = False
        try:
            versions = entry.version_configs()
            plan = plan_models(versions, self.runtime.config.server)
            cache = config.hf_cache_dir()
            loaded = [load_model(vc, self.runtime.config.server, cache, threads=plan.models[vc.key])
                      for vc in versions]
            pipes = self.runtime.prepare(loaded)
            ok = True
            return loaded, pipes
        except RsinferError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported with the model's name
            raise RsinferError(f"{type(exc).__name__}: {exc}") from exc
        finally:
            if self.metrics is not None:
                self.metrics.model_loaded(entry.name, ok, time.perf_counter() - t0)

    def _serve(self, name: str, entry: ModelConfig, loaded: Loaded) -> None:
        versions, pipes = loaded
        self._retire(self.runtime.install(name, versions, pipes, entry))
        shown = ", ".join(m.version for m in versions if m.version) or "1"
        self._set(name, READY, f"version {shown}")

    def _retire(self, versions: list[LoadedModel]) -> None:
        self.runtime.retire_later(versions, self.quiet_s)

    def _set(self, name: str, state: str, reason: str = "", *, quiet: bool = False) -> None:
        before = self.states.get(name)
        self.states[name] = ModelState(state, reason)
        if self.metrics is not None:
            self.metrics.state(name, state)
        if not quiet and (before is None or before.state != state or state == READY):
            (log.warning if state == UNAVAILABLE else log.info)(
                "model %s: %s%s", name, state, f" ({reason})" if reason else "")

    def _note_gone(self, name: str) -> None:
        self.runtime.registry.unavailable.pop(name, None)
        if self.metrics is not None:
            self.metrics.state(name, None)
        log.info("model %s: removed from the configuration", name)

    def _changed(self) -> None:
        if self.changed is not None:
            self.changed()
