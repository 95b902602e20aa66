"""All configured models (every version of each), loaded in parallel; start-up fails when any of them fails.
A request names a model (or gets its kind's default) and optionally a version; a versioned model routes the
requests that name none by weight, with a smooth weighted round-robin, so the shares hold over any short run."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .. import families
from ..config import Config, ModelConfig
from ..errors import (
    ConfigError,
    HubError,
    InputError,
    KindMismatch,
    ModelLoadError,
    ModelNotFound,
    RsinferError,
    UnknownModel,
    VersionNotFound,
)
from .model import LoadedModel, load_model
from .threads import ThreadPlan, plan_models, usable_cpus

log = logging.getLogger("rsinfer.engine")


class VersionRouter:
    """Which version answers a request that names none: by weight (smooth weighted round-robin, as nginx does:
    deterministic, and 70/30 holds over every 10 consecutive picks), else `default_version`, else the last."""

    def __init__(self, config: ModelConfig) -> None:
        self.versions = [v.version for v in config.versions]
        self.weights = [v.weight or 0 for v in config.versions]
        self.weighted = any(self.weights)
        self.fallback = config.default_version or (self.versions[-1] if self.versions else None)
        self._current = [0] * len(self.versions)
        self._lock = threading.Lock()   # the gRPC and HTTP fronts share one router

    def pick(self) -> str | None:
        if not self.weighted:
            return self.fallback
        with self._lock:
            total = sum(self.weights)
            for i, w in enumerate(self.weights):
                self._current[i] += w
            best = max(range(len(self.versions)), key=lambda i: self._current[i])
            self._current[best] -= total
            return self.versions[best]


class Registry:
    def __init__(self, models: dict[str, LoadedModel], configs: dict[str, ModelConfig] | None = None,
                 plan: ThreadPlan | None = None) -> None:
        # how the CPU models share the CPUs (engine/threads.py); for models loaded elsewhere, what they were given
        self.plan = plan or ThreadPlan(cpus=usable_cpus(), models={k: m.threads for k, m in models.items()})
        self.unavailable: dict[str, str] = {}     # configured models not served now, and why (runtime/control.py)
        self._index(models, configs or {m.name: m.config for m in models.values()})

    def _index(self, models: dict[str, LoadedModel], configs: dict[str, ModelConfig]) -> None:
        """Every lookup table, from the loaded models and their entries' configs."""
        self.models = dict(sorted(models.items()))                   # by key (name, or name:version)
        self.entries: dict[str, list[LoadedModel]] = {}              # by name: its versions, in config order
        for m in models.values():
            self.entries.setdefault(m.name, []).append(m)
        self.configs = {name: cfg for name, cfg in configs.items() if name in self.entries}
        self.routers = {name: VersionRouter(cfg) for name, cfg in self.configs.items() if cfg.versions}
        self.defaults: dict[str, str] = {}
        by_kind: dict[str, list[str]] = {}
        for name, versions in self.entries.items():
            by_kind.setdefault(versions[0].kind, []).append(name)
        for kind, names in by_kind.items():
            self._default(kind, names)
        serving: dict[str, list[str]] = {}   # a kind's routes → models of other families that answer them
        for kind, names in by_kind.items():
            for served in families.get(kind).serves if kind in families.kinds() else ():
                serving.setdefault(served, []).extend(names)
        for kind, names in serving.items():
            if kind not in by_kind:         # a model of the kind itself is always its routes' default
                self._default(kind, names)

    def swap(self, name: str, versions: list[LoadedModel] | None, config: ModelConfig | None = None) -> None:
        """Serve `versions` (an entry's loaded versions, `config` its entry) as model `name` from now on, or
        nothing under that name (None); every other model's entry is kept as it is. In one step on the event
        loop: a request sees the old set or the new one, never a mix."""
        models = {k: m for k, m in self.models.items() if m.name != name}
        for m in self.entries.get(name, ()):
            self.plan.models.pop(m.key, None)
        configs = {n: c for n, c in self.configs.items() if n != name}
        for m in versions or ():
            models[m.key] = m
            self.plan.models[m.key] = m.threads
        if versions:
            configs[name] = config or versions[0].config
            self.unavailable.pop(name, None)
        self._index(models, configs)

    def _default(self, kind: str, names: list[str]) -> None:
        """The default of `kind`'s routes: the model flagged `default: true`, else the only one."""
        flagged = [n for n in names if self.entries[n][0].config.default]
        if len(flagged) > 1:
            log.warning("several %s models have default: true (%s); using '%s'", kind, ", ".join(flagged),
                        flagged[0])
        if flagged or len(names) == 1:
            self.defaults[kind] = (flagged or names)[0]

    @classmethod
    def load(cls, config: Config, cache_dir: Path | None = None, max_workers: int = 4,
             on_load: Callable[[str], None] | None = None) -> Registry:
        """Every model of the config; `on_load(description)` is told as each one starts loading."""
        cache = cache_dir or config.hf_cache_dir()
        jobs: list[tuple[str, ModelConfig]] = []
        for i, m in enumerate(config.models):
            for k, vc in enumerate(m.version_configs()):
                where = f"model '{m.name}' (models[{i}])" if vc.version is None else \
                    f"model '{m.name}' version '{vc.version}' (models[{i}].versions[{k}])"
                jobs.append((where, vc))
        plan = plan_models([vc for _, vc in jobs], config.server)
        for line in plan.lines():
            (log.warning if line.startswith("warning: ") else log.info)("thread plan: %s", line)
        loaded: dict[str, LoadedModel] = {}
        failures: list[tuple[str, BaseException]] = []
        with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(jobs))), thread_name_prefix="load") as ex:
            def load(where: str, vc: ModelConfig) -> LoadedModel:
                if on_load is not None:
                    on_load(where)
                return load_model(vc, config.server, cache, threads=plan.models[vc.key])

            futures = [(where, ex.submit(load, where, vc)) for where, vc in jobs]
            for where, fut in futures:
                try:
                    model = fut.result()
                    loaded[model.key] = model
                except RsinferError as exc:
                    failures.append((where, exc))
                except Exception as exc:  # noqa: BLE001 - reported with the model's name, never swallowed
                    failures.append((where, exc))
        if failures:
            lines = "\n".join(f"  {w}: {e}" for w, e in failures)
            raise _common_error(failures)(f"failed to load {len(failures)} model(s):\n{lines}") from failures[0][1]
        return cls(loaded, {m.name: m for m in config.models}, plan)

    def not_found(self, name: str) -> ModelNotFound:
        """The error for a name that is not served now: unknown, or configured and not available (and why)."""
        why = self.unavailable.get(name)
        if why is not None:
            return ModelNotFound(f"model '{name}' is not available: {why}", param="model", model=name)
        return UnknownModel(f"model '{name}' not found", param="model", model=name)

    def versions(self, name: str) -> list[str]:
        return [m.version for m in self.entries.get(name, []) if m.version is not None]

    def get(self, name: str | None, kind: str, version: str | None = None) -> LoadedModel:
        """The model a request names, or the default of the route's kind; the version it names, else the one
        the model's routing picks."""
        if name is None or name == "":
            default = self.defaults.get(kind)
            if default is None:
                have = [n for n, v in self.entries.items() if families.answers(v[0].kind, kind)]
                why = f"several are configured ({', '.join(have)})" if have else "none is configured"
                raise InputError(f"no default {kind} model configured ({why}); specify `model`", param="model")
            name = default
        versions = self.entries.get(name)
        if versions is None:
            raise self.not_found(name)
        model_kind = versions[0].config.kind
        if model_kind != kind and not families.answers(model_kind, kind):   # (its own kind: no call to make)
            raise KindMismatch(f"model '{name}' is {_a(versions[0].kind)} model but was used for {_a(kind)} request",
                               param="model", model=name)
        if not version and name not in self.routers:     # its one version (most requests): no look-up to make
            return versions[0]
        return self.version_of(name, version)

    def version_of(self, name: str, version: str | None = None) -> LoadedModel:
        """`name` at `version` (None or "": routed); VersionNotFound for a version the model does not have."""
        versions = self.entries[name]
        router = self.routers.get(name)
        if not version:
            if router is None:
                return versions[0]
            version = router.pick()
        for m in versions:
            if m.version == version or (m.version is None and version == "1"):
                return m
        have = ", ".join(self.versions(name)) or "1"
        raise VersionNotFound(f"model '{name}' has no version '{version}' (versions: {have})", param="model_version",
                              model=name)


def _common_error(failures: list[tuple[str, BaseException]]) -> type[RsinferError]:
    """The error class of a failed start: the failures' own kind where all share one (files the Hub or a folder
    could not provide are a HubError, exit 4 as in the one-shot commands), else ModelLoadError (exit 5)."""
    for kind in (ConfigError, HubError):
        if all(isinstance(exc, kind) for _, exc in failures):
            return kind
    return ModelLoadError


def _a(word: str) -> str:
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"
