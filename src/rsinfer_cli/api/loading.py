"""One model's runtime for a one-shot caller (the public API, and through it the CLI's commands): which model
(`name` in a config, or a folder / Hub repo given directly), its keys overridden, loaded on one replica with the
thread plan's CPUs (or `threads`), and `run` through the inference core as the server's requests are.

Messages name what the caller wrote: `Names` spells each key as the CLI's flag or as the API's keyword.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..errors import ConfigError

if TYPE_CHECKING:   # the runtime imports onnxruntime: loaded when a model is, never on import
    from ..pipelines.base import RowPipeline, Work
    from ..runtime import Runtime
    from ..runtime.core import PlanArgs

P = TypeVar("P", bound="RowPipeline")
R = TypeVar("R")


@dataclass(frozen=True)
class Names:
    """How messages spell the loading keys: the CLI's flags, or the API's keywords."""

    path: str = "path="
    hf: str = "hf="
    config: str = "config="
    name: str = "model="
    dtype: str = "dtype="
    batch_size: str = "batch_size="
    threads: str = "threads="

    def key(self, key: str, flags: Mapping[str, str]) -> str:
        return flags.get(key, key)


API_NAMES = Names()
CLI_NAMES = Names(path="--path", hf="--hf", config="--config", name="NAME", dtype="--dtype",
                  batch_size="--batch-size", threads="--threads")


def model_from_options(*, name: str | None, config: Path | None, path: Path | None, hf: str | None,
                       revision: str = "main", file: str | None = None, subfolder: str | None = None,
                       tokenizer_hf: str | None = None, dtype: str = "auto", kind: str | None = None,
                       replicas: int | None = None, names: Names = CLI_NAMES) -> tuple[Any, Any]:
    """(ModelConfig, ServerConfig) from a config entry or from a folder / repo given directly."""
    from ..config import ModelConfig, ServerConfig, normalize_dtype

    given = [x for x in (path, hf) if x is not None]
    if len(given) > 1:
        raise ConfigError(f"give either {names.path} or {names.hf}, not both")
    if given and name:
        raise ConfigError(f"give either a model name with {names.config}, or {names.path}/{names.hf} "
                          f"(got '{name}' and a source)")
    if not given:
        return _from_config(name, config, replicas, names)
    try:
        dtype = normalize_dtype(dtype)
    except ValueError as exc:
        raise ConfigError(f"{names.dtype.rstrip('=')}: {exc}") from None
    label = Path(path).name if path is not None else str(hf).rsplit("/", 1)[-1]
    model = ModelConfig(name=label or "model", kind=kind or "embedding", path=str(path) if path else None,
                        hf=hf, revision=revision, file=file, subfolder=subfolder, tokenizer_hf=tokenizer_hf,
                        dtype=dtype, replicas=replicas)
    return model, ServerConfig()


def _from_config(name: str | None, config: Path | None, replicas: int | None, names: Names) -> tuple[Any, Any]:
    import dataclasses

    from ..config import load_config

    if config is None:
        raise ConfigError(f"say which model: {names.name} with {names.config} FILE, {names.path} DIR or "
                          f"{names.hf} REPO")
    cfg = load_config(config)
    if name is None:
        if len(cfg.models) != 1:
            raise ConfigError(f"{config}: several models are configured "
                              f"({', '.join(m.name for m in cfg.models)}); name one")
        model = cfg.models[0]
    else:
        model = cfg.model(name)
    if model.versions:  # a versioned model: its default version, else the last listed
        configs = {vc.version: vc for vc in model.version_configs()}
        model = configs.get(model.default_version or "", list(configs.values())[-1])
    if replicas is not None:
        model = dataclasses.replace(model, replicas=replicas)
    return model, cfg.server


def guess_source_kind(cfg: Any, cache_dir: Path | None = None) -> tuple[str, str]:
    """(kind, why) of a --path/--hf model from its files: config.json, the sentence-transformers configs and
    whether a tokenizer is there."""
    import dataclasses

    from .. import families
    from ..engine.scripts import script_backend
    from ..errors import ModelLoadError
    from ..hub import ModelSource, resolve

    try:
        backend = script_backend(dataclasses.replace(cfg, kind="tensor")) if cfg.path else None
    except ModelLoadError:      # not clearly a script folder: judged by its graph below
        backend = None
    if backend is not None:
        return "tensor", f"a script model folder (backend {backend})"
    resolved = resolve(ModelSource.of(cfg, needs_tokenizer=False), cache_dir)
    return families.guess_kind(families.Folder.read(resolved.aux, resolved.tokenizer_path is not None))


@dataclass(frozen=True)
class Source:
    """Which model to load and how: a config entry (`name`, `config`) or a folder / repo (`path`, `hf`), its
    precision, rows per forward, intra-op threads and model keys (`keys`: the family's own or the entry's)."""

    name: str | None = None
    config: Path | None = None
    path: Path | None = None
    hf: str | None = None
    revision: str = "main"
    dtype: str = "auto"
    kind: str | None = None           # for path/hf: the family (default: guessed from the folder's files)
    max_rows: int | None = None
    threads: int | None = None
    keys: tuple[tuple[str, Any], ...] = ()

    def model(self, want: str | None, names: Names, flags: Mapping[str, str]) -> tuple[Any, Any]:
        """(ModelConfig, ServerConfig): one replica; of a family that answers `want` (None: any)."""
        import dataclasses

        from .. import families
        from ..config import hub_cache_dir

        cfg, server = model_from_options(name=self.name, config=self.config, path=self.path, hf=self.hf,
                                         revision=self.revision, dtype=self.dtype, kind=self.kind or want,
                                         replicas=1, names=names)
        if (self.path is not None or self.hf is not None) and self.kind is None:
            cfg = _own_kind(cfg, want, hub_cache_dir(server.hf_cache_dir))
        if want is not None and not families.answers(cfg.kind, want):
            raise ConfigError(f"model '{cfg.name}' is a {cfg.kind} model; this command needs a {want} model")
        if self.max_rows is not None:
            if self.max_rows < 1:
                raise ConfigError(f"{names.batch_size.rstrip('=')} must be >= 1, got {self.max_rows}")
            cfg = dataclasses.replace(cfg, batching=dataclasses.replace(cfg.batching, max_rows=self.max_rows))
        if self.threads is not None:
            if self.threads < 1:
                raise ConfigError(f"{names.threads.rstrip('=')} must be >= 1, got {self.threads}")
            cfg = dataclasses.replace(cfg, intra_threads=self.threads)
        return _with_overrides(cfg, {k: v for k, v in self.keys if v is not None}, flags), server

    def load(self, want: str | None, names: Names = API_NAMES, flags: Mapping[str, str] | None = None) -> Runtime:
        """The model loaded, its runtime started (one replica, no queue)."""
        from ..config import hub_cache_dir
        from ..engine.model import load_model
        from ..runtime import Runtime

        cfg, server = self.model(want, names, flags or {})
        return Runtime.one_shot(load_model(cfg, server, hub_cache_dir(server.hf_cache_dir)), server).start()


def _own_kind(cfg: Any, want: str | None, cache_dir: Path) -> Any:
    """A folder with no kind asked for is loaded as the family its files say; one asked for a kind that several
    families serve (a ColBERT model for `rerank`) as its own family when that family serves it, else as asked."""
    import dataclasses

    from .. import families

    if want is not None and not any(want in f.serves for f in families.all_families()):
        return cfg
    guessed, _ = guess_source_kind(cfg, cache_dir)
    if want is None or (guessed != want and families.answers(guessed, want)):
        return dataclasses.replace(cfg, kind=guessed)
    return cfg


def _with_overrides(cfg: Any, given: dict[str, Any], flags: Mapping[str, str]) -> Any:
    """Model keys from the caller: the family's own keys go to its options (held to its `check()`, as the
    config is), the rest to the model entry; a key neither knows is an error naming it."""
    import dataclasses

    if not given:
        return cfg
    from .. import families

    cls = families.options_class(cfg.kind)
    own = {f.name for f in dataclasses.fields(cls)} if cls is not None else set()
    entry = {f.name for f in dataclasses.fields(cfg)}
    unknown = sorted(set(given) - own - entry)
    if unknown:
        raise ConfigError(f"{', '.join(flags.get(k, k) for k in unknown)}: not a key of a model of kind "
                          f"{cfg.kind} (its family's keys: {', '.join(sorted(own)) or 'none'})")
    options = dataclasses.replace(cfg.own(cls), **{k: v for k, v in given.items() if k in own}) \
        if cls is not None and own else cfg.options
    check = getattr(options, "check", None)
    for key, message in check() if check is not None else ():
        base = key.split("[")[0]
        raise ConfigError(f"{flags.get(base, base)}: {message}")
    return dataclasses.replace(cfg, options=options, **{k: v for k, v in given.items() if k not in own})


class OneShot(Generic[P]):
    """One model's runtime for a one-shot caller: its pipeline (`pipe`), and `run` for a request through the
    inference core - synchronously on one replica, through the config's `server.cache` as the server's are."""

    def __init__(self, runtime: Runtime, pipeline: type[P]) -> None:
        self.runtime = runtime
        self.model = next(iter(runtime.registry.models.values()))
        pipe = runtime.pipelines[self.model.key]
        if not isinstance(pipe, pipeline):
            raise ConfigError(f"model '{self.model.name}' has a {type(pipe).__name__}, not a {pipeline.__name__}")
        self.pipe = pipe

    def run(self, plan: Callable[PlanArgs, Work[R]], *args: PlanArgs.args, **kwargs: PlanArgs.kwargs) -> R:
        from ..runtime.record import RequestRecord  # (the runtime floor: loaded with the model)

        return self.runtime.core.run(RequestRecord(), self.model, plan, *args, **kwargs)


def load_pipeline(pipeline: type[P], *, name: str | None, config: Path | None, path: Path | None, hf: str | None,
                  revision: str = "main", dtype: str = "auto", max_rows: int | None = None,
                  flags: dict[str, str] | None = None, **overrides: Any) -> OneShot[P]:
    """One model's runtime for a one-shot command (one replica), checking that its kind makes a `pipeline`.
    `overrides`: model keys from command-line flags (`flags`: key → the flag that set it, for error messages)."""
    source = Source(name=name, config=config, path=path, hf=hf, revision=revision, dtype=dtype, max_rows=max_rows,
                    keys=tuple(overrides.items()))
    return OneShot(source.load(pipeline.kind, CLI_NAMES, flags), pipeline)
