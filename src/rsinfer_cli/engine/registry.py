"""All configured models, loaded in parallel; start-up fails when any of them fails."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..config import Config
from ..errors import InputError, KindMismatch, ModelLoadError, ModelNotFound, RsinferError
from .model import LoadedModel, load_model

log = logging.getLogger("rsinfer.engine")


class Registry:
    def __init__(self, models: dict[str, LoadedModel]) -> None:
        self.models = dict(sorted(models.items()))
        self.defaults: dict[str, str] = {}
        by_kind: dict[str, list[LoadedModel]] = {}
        for m in models.values():
            by_kind.setdefault(m.kind, []).append(m)
        for kind, group in by_kind.items():
            flagged = [m for m in group if m.config.default]
            if len(flagged) > 1:
                log.warning("several %s models have default: true (%s); using '%s'", kind,
                            ", ".join(m.name for m in flagged), flagged[0].name)
            if flagged or len(group) == 1:
                self.defaults[kind] = (flagged or group)[0].name

    @classmethod
    def load(cls, config: Config, cache_dir: Path | None = None, max_workers: int = 4) -> Registry:
        cache = cache_dir or config.hf_cache_dir()
        order = {m.name: i for i, m in enumerate(config.models)}
        loaded: dict[str, LoadedModel] = {}
        failures: list[tuple[str, BaseException]] = []
        with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(config.models))),
                                thread_name_prefix="load") as ex:
            futures = {m.name: ex.submit(load_model, m, config.server, cache) for m in config.models}
            for name, fut in futures.items():
                try:
                    loaded[name] = fut.result()
                except RsinferError as exc:
                    failures.append((name, exc))
                except Exception as exc:  # noqa: BLE001 - reported with the model's name, never swallowed
                    failures.append((name, exc))
        if failures:
            failures.sort(key=lambda f: order[f[0]])
            lines = "\n".join(f"  model '{n}' (models[{order[n]}]): {e}" for n, e in failures)
            raise ModelLoadError(f"failed to load {len(failures)} model(s):\n{lines}") from failures[0][1]
        return cls(loaded)

    def get(self, name: str | None, kind: str) -> LoadedModel:
        """The model a request names, or the default of the route's kind."""
        if name is None or name == "":
            default = self.defaults.get(kind)
            if default is None:
                have = [m.name for m in self.models.values() if m.kind == kind]
                why = f"several are configured ({', '.join(have)})" if have else "none is configured"
                raise InputError(f"no default {kind} model configured ({why}); specify `model`", param="model")
            return self.models[default]
        model = self.models.get(name)
        if model is None:
            raise ModelNotFound(f"model '{name}' not found", param="model", model=name)
        if model.kind != kind:
            raise KindMismatch(f"model '{name}' is {_a(model.kind)} model but was used for {_a(kind)} request",
                               param="model", model=name)
        return model


def _a(word: str) -> str:
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"
