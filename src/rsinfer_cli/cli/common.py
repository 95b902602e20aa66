"""Options shared by the commands that load one model: `NAME --config FILE` or `--path DIR` / `--hf REPO`."""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import typer

from ..errors import ConfigError

if TYPE_CHECKING:   # the runtime imports onnxruntime: loaded by a command, never by --help
    from ..pipelines.base import RowPipeline, Work
    from ..pipelines.infer import PlanArgs
    from ..runtime import Runtime

P = TypeVar("P", bound="RowPipeline")
R = TypeVar("R")

CONFIG_OPT = typer.Option(None, "--config", "-c", help="YAML config file (also $RSINFER_CONFIG).",
                          envvar="RSINFER_CONFIG", show_envvar=False)
PATH_OPT = typer.Option(None, "--path", help="Model folder (a Hub-repo layout or `rsinfer download` output).")
HF_OPT = typer.Option(None, "--hf", help="Hugging Face repo id.")
REVISION_OPT = typer.Option("main", "--revision", help="Branch, tag or commit (with --hf).")
FILE_OPT = typer.Option(None, "--file", help="Pin the graph file, e.g. onnx/model_fp16.onnx.")
SUBFOLDER_OPT = typer.Option(None, "--subfolder", help="Extra folder to search for the graph and aux files.")
TOKENIZER_HF_OPT = typer.Option(None, "--tokenizer-hf", help="Repo with tokenizer.json when the model's lacks it.")
DTYPE_OPT = typer.Option("auto", "--dtype", help="Graph precision preference: auto, fp32, fp16 or int8.")
JSON_OPT = typer.Option(False, "--json", help="Print JSON for programs instead of a table.")
MODEL_OPT = typer.Option(None, "--model", "-m", help="Model name in --config.")
INPUT_OPT = typer.Option(None, "--input", "-i", help="File of lines or JSONL records ('-' = stdin).")
FORMAT_OPT = typer.Option("auto", "--format", help="auto (JSONL when the first line is an object), lines, jsonl.")
FIELD_OPT = typer.Option("text", "--field", help="JSONL field holding the text (dotted path: a.b).")


@dataclass(frozen=True)
class ModelFlags:
    """Which model a one-shot command loads: `--model NAME --config FILE`, or `--path DIR` / `--hf REPO`."""

    model: str | None = None
    config: Path | None = None
    path: Path | None = None
    hf: str | None = None
    revision: str = "main"
    dtype: str = "auto"

    def options(self) -> dict[str, Any]:
        """As load_pipeline's keyword arguments."""
        return {"name": self.model, "config": self.config, "path": self.path, "hf": self.hf,
                "revision": self.revision, "dtype": self.dtype}


MODEL_FLAGS = ModelFlags()   # the default of a `source: ModelFlags` parameter (model_command replaces it)
# the options a `source: ModelFlags` parameter stands for, in the order --help lists them
SOURCE_OPTIONS: tuple[tuple[str, Any, Any], ...] = (
    ("model", str, MODEL_OPT), ("config", Path, CONFIG_OPT), ("path", Path, PATH_OPT), ("hf", str, HF_OPT),
    ("revision", str, REVISION_OPT), ("dtype", str, DTYPE_OPT))


def flag_group(param: str, cls: Callable[..., Any],
               options: Sequence[tuple[str, Any, Any]]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A decorator for commands whose `param` parameter stands for several options: Typer sees `options` ((name,
    type, typer.Option), in --help's order) where the parameter is, and the command gets them as one `cls(...)`.
    One definition of options that several commands share."""

    def decorate(fn: Callable[..., None]) -> Callable[..., None]:
        hints = typing.get_type_hints(fn)
        params: list[inspect.Parameter] = []
        for p in inspect.signature(fn).parameters.values():
            if p.name == param:
                params += [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default,
                                             annotation=tp) for name, tp, default in options]
            else:
                params.append(p.replace(annotation=hints.get(p.name, p.annotation)))

        @functools.wraps(fn)
        def command(*args: Any, **kwargs: Any) -> None:
            given = {name: kwargs.pop(name) for name, _, _ in options if name in kwargs}
            fn(*args, **{param: cls(**given)}, **kwargs)

        command.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate


# a family command whose `source: ModelFlags` parameter stands for --model/-m, --config, --path, --hf, --revision
# and --dtype: one definition of the options every family's commands share
model_command = flag_group("source", ModelFlags, SOURCE_OPTIONS)


def model_from_options(*, name: str | None, config: Path | None, path: Path | None, hf: str | None,
                       revision: str = "main", file: str | None = None, subfolder: str | None = None,
                       tokenizer_hf: str | None = None, dtype: str = "auto", kind: str | None = None,
                       replicas: int | None = None) -> tuple[Any, Any]:
    """(ModelConfig, ServerConfig) from a config entry or from a folder / repo given directly."""
    import dataclasses

    from ..config import ModelConfig, ServerConfig, load_config, normalize_dtype

    given = [x for x in (path, hf) if x is not None]
    if len(given) > 1:
        raise ConfigError("give either --path or --hf, not both")
    if given and name:
        raise ConfigError(f"give either a model name with --config, or --path/--hf (got '{name}' and a source)")
    if not given:
        if config is None:
            raise ConfigError("say which model: NAME --config FILE, --path DIR or --hf REPO")
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
    try:
        dtype = normalize_dtype(dtype)
    except ValueError as exc:
        raise ConfigError(f"--dtype: {exc}") from None
    label = Path(path).name if path is not None else str(hf).rsplit("/", 1)[-1]
    model = ModelConfig(name=label or "model", kind=kind or "embedding", path=str(path) if path else None,
                        hf=hf, revision=revision, file=file, subfolder=subfolder, tokenizer_hf=tokenizer_hf,
                        dtype=dtype, replicas=replicas)
    return model, ServerConfig()


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


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def stderr_is_tty() -> bool:
    return sys.stderr.isatty() and os.environ.get("TERM") != "dumb"


def load_pipeline(pipeline: type[P], *, name: str | None, config: Path | None, path: Path | None, hf: str | None,
                  revision: str = "main", dtype: str = "auto", max_rows: int | None = None,
                  flags: dict[str, str] | None = None, **overrides: Any) -> OneShot[P]:
    """One model's runtime for a one-shot command (one replica), checking that its kind makes a `pipeline`.
    `overrides`: model keys from command-line flags (`flags`: key → the flag that set it, for error messages)."""
    import dataclasses

    from .. import families
    from ..config import hub_cache_dir
    from ..engine.model import load_model
    from ..runtime import Runtime

    cfg, server = model_from_options(name=name, config=config, path=path, hf=hf, revision=revision, dtype=dtype,
                                     kind=pipeline.kind, replicas=1)
    if path is not None or hf is not None:
        cfg = _own_kind(cfg, pipeline.kind, hub_cache_dir(server.hf_cache_dir))
    if not families.answers(cfg.kind, pipeline.kind):
        raise ConfigError(f"model '{cfg.name}' is a {cfg.kind} model; this command needs a {pipeline.kind} model")
    if max_rows is not None:
        if max_rows < 1:
            raise ConfigError(f"--batch-size must be >= 1, got {max_rows}")
        cfg = dataclasses.replace(cfg, batching=dataclasses.replace(cfg.batching, max_rows=max_rows))
    cfg = _with_overrides(cfg, {k: v for k, v in overrides.items() if v is not None}, flags or {})
    return OneShot(Runtime.one_shot(load_model(cfg, server, hub_cache_dir(server.hf_cache_dir)), server).start(),
                   pipeline)


def _own_kind(cfg: Any, kind: str, cache_dir: Path) -> Any:
    """A --path/--hf folder of a family that serves the command's kind (a ColBERT model for `rerank`) is loaded as
    its own family; any other folder as the command's."""
    import dataclasses

    from .. import families

    if not any(kind in f.serves for f in families.all_families()):
        return cfg
    guessed, _ = guess_source_kind(cfg, cache_dir)
    return dataclasses.replace(cfg, kind=guessed) if guessed != kind and families.answers(guessed, kind) else cfg


def _with_overrides(cfg: Any, given: dict[str, Any], flags: dict[str, str]) -> Any:
    """Model keys from command-line flags: the family's own keys go to its options (held to its `check()`, as the
    config is), the rest to the model entry."""
    import dataclasses

    if not given:
        return cfg
    own = {f.name for f in dataclasses.fields(cfg.options)} if cfg.options is not None else set()
    options = dataclasses.replace(cfg.options, **{k: v for k, v in given.items() if k in own}) if own else None
    check = getattr(options, "check", None)
    for key, message in check() if check is not None else ():
        base = key.split("[")[0]
        raise ConfigError(f"{flags.get(base, base)}: {message}")
    return dataclasses.replace(cfg, options=options, **{k: v for k, v in given.items() if k not in own})


class OneShot(Generic[P]):
    """One model's runtime for a one-shot command: its pipeline (`pipe`), and `run` for a request through the
    inference core - synchronously on one replica, through the config's `server.cache` as the server's are."""

    def __init__(self, runtime: Runtime, pipeline: type[P]) -> None:
        self.runtime = runtime
        self.model = next(iter(runtime.registry.models.values()))
        pipe = runtime.pipelines[self.model.key]
        if not isinstance(pipe, pipeline):
            raise ConfigError(f"model '{self.model.name}' has a {type(pipe).__name__}, not a {pipeline.__name__}")
        self.pipe = pipe

    def run(self, plan: Callable[PlanArgs, Work[R]], *args: PlanArgs.args, **kwargs: PlanArgs.kwargs) -> R:
        return self.runtime.core.run(self.model, plan, *args, **kwargs)
