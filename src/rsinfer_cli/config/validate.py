"""YAML → the schema's frozen dataclasses (schema.py), walking each dataclass's fields: their types, bounds,
choices and aliases (the field metadata `opt` writes). Every mistake is reported, not only the first, each with the
file and its key path, with a close match for a misspelt key or value (errors: report.py). A foreign dialect
(nereid.py, rs_infer.py) is translated into rsinfer's keys first."""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from . import rs_infer
from .nereid import from_nereid, is_nereid
from .report import Errors, type_name
from .schema import Config, ModelConfig, RateLimitConfig, ServerConfig, families, split_bind

log = logging.getLogger("rsinfer.config")
TOP_KEYS = ("server", "models")
# server keys that became keys of a family's models: still read (with a deprecation line), each the default of
# every model of that family that does not set its own
MOVED_TO_MODELS = {"max_rerank_documents": "rerank", "max_candidate_labels": "zeroshot", "pii_hash_salt": "pii"}
_WANT = {bool: "a boolean (true/false)", int: "an integer", float: "a number", str: "a string"}
_BOUNDS: tuple[tuple[str, Callable[[Any, Any], bool], str], ...] = (
    ("gt", lambda a, b: a > b, ">"), ("ge", lambda a, b: a >= b, ">="), ("le", lambda a, b: a <= b, "<="))


# ---------------------------------------------------------------- one value


def convert(tp: Any, value: Any, path: str, meta: dict[str, Any], errs: Errors) -> Any:
    """`value` as the field type `tp` (None, reported, when it is not one)."""
    if "auto" in meta and value == "auto":   # a number field that also takes `auto`
        return meta["auto"]
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return None if value is None else convert(args[0], value, path, meta, errs)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        short = getattr(tp, "SHORTHAND", None)     # `warmup: 2` for `warmup: {requests: 2}`
        if short is not None and not isinstance(value, dict):
            value = {short: value}
        return build(tp, value, path, errs)
    if origin is dict:          # a mapping of names to values (e.g. an embedding model's `prompts`)
        return _mapping(tp, value, path, meta, errs)
    if origin is tuple:
        if meta.get("one_or_many") and isinstance(value, str):    # `regex: "..."` for `regex: ["..."]`
            value = [value]
        return _list(tp, value, path, meta, errs)
    return _scalar(tp, value, path, meta, errs)


def _scalar(tp: type, value: Any, path: str, meta: dict[str, Any], errs: Errors) -> Any:
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
    }[tp]
    if not ok:
        want = _WANT[tp] + (" or 'auto'" if "auto" in meta else "")
        errs.add(path, f"expected {want}, got {type_name(value)} {value!r}")
        return None
    if tp is float:
        value = float(value)
    if "aliases" in meta:
        canon = meta["aliases"].get(str(value).lower())
        if canon is None:
            known = "|".join(dict.fromkeys(meta["aliases"].values()))
            errs.add(path, f"must be one of {known}, got {value!r}")
            return None
        value = canon
    return value if _allowed(value, path, meta, errs) else None


def _allowed(value: Any, path: str, meta: dict[str, Any], errs: Errors) -> bool:
    """`value` among the field's choices and within its bounds."""
    choices = meta["choices"]() if callable(meta.get("choices")) else meta.get("choices")
    if choices is not None and value not in choices:
        close = difflib.get_close_matches(str(value), choices, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        errs.add(path, f"must be one of {', '.join(choices)}, got {value!r}{hint}")
        return False
    for key, op, text in _BOUNDS:
        if key in meta and not op(value, meta[key]):
            errs.add(path, f"must be {text} {meta[key]}, got {value!r}")
            return False
    return True


def _mapping(tp: Any, value: Any, path: str, meta: dict[str, Any], errs: Errors) -> Any:
    """A YAML mapping of string keys, each value converted under `path.key`."""
    _, value_tp = typing.get_args(tp)
    if not isinstance(value, dict):
        errs.add(path, f"expected a mapping, got {type_name(value)}")
        return None
    out = {}
    for k, v in value.items():
        if not isinstance(k, str):
            errs.add(f"{path}.{k}", f"the key must be a string, got {type_name(k)}")
            continue
        conv = convert(value_tp, v, f"{path}.{k}", meta, errs)
        if conv is not None:
            out[k] = conv
    return out


def _list(tp: Any, value: Any, path: str, meta: dict[str, Any], errs: Errors) -> Any:
    """A YAML list as a tuple, each item converted under `path[i]`; with `choices`, no item twice."""
    (inner, _) = typing.get_args(tp)
    if isinstance(value, str) or not isinstance(value, list):
        errs.add(path, f"expected a list, got {type_name(value)}")
        return None
    items = []
    for i, item in enumerate(value):
        conv = convert(inner, item, f"{path}[{i}]", meta, errs)
        if conv is not None:
            items.append(conv)
    if "choices" in meta:
        seen: set[Any] = set()
        for i, item in enumerate(items):
            if item in seen:
                errs.add(f"{path}[{i}]", f"duplicate entry '{item}'")
            seen.add(item)
    return tuple(items)


# ---------------------------------------------------------------- one dataclass


def build(cls: type, data: Any, path: str, errs: Errors) -> Any:
    """A mapping as the dataclass `cls`: each key converted by its field, unknown keys, missing required keys and
    nulls where none is allowed reported."""
    if not isinstance(data, dict):
        errs.add(path or "(top level)", f"expected a mapping, got {type_name(data)}")
        return None
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in fields:
            errs.unknown_key(where, key, fields)
            continue
        conv = convert(hints[key], value, where, dict(fields[key].metadata), errs)
        if conv is not None or value is None:
            kwargs[key] = conv
    for name, f in fields.items():
        where = f"{path}.{name}" if path else name
        if _required(f) and name not in kwargs and name not in data:
            errs.add(where, "required key is missing")
        if kwargs.get(name, 0) is None and f.default is not None and not _optional(hints[name]):
            errs.add(where, "must not be null")
            kwargs.pop(name)
    try:
        return cls(**kwargs)
    except TypeError:
        return None  # already reported: a required key is missing


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _optional(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


# ---------------------------------------------------------------- models


def build_model(raw: Any, where: str, errs: Errors, inherited: dict[str, dict[str, Any]] | None = None
                ) -> ModelConfig | None:
    """A model entry: the keys of every model (ModelConfig) and, written beside them, the keys of its family's
    options dataclass (`families.Family.options`), each validated under the entry's key path. `inherited`: by kind,
    the keys a model of that kind gets when it does not set them (the server keys that moved to the models)."""
    if not isinstance(raw, dict):
        return build(ModelConfig, raw, where, errs)  # type: ignore[no-any-return]
    fams = families()
    kind = raw.get("kind")
    if isinstance(kind, str) and kind not in fams.kinds():
        for why in fams.FAILED.values():     # the kind may be a plug-in's that did not load: say why
            errs.add(f"{where}.kind", why)
    cls = fams.options_class(kind) if isinstance(kind, str) else None
    own = set(fams.option_fields(kind)) if cls is not None else set()
    common = {f.name for f in dataclasses.fields(ModelConfig) if not f.metadata.get("internal")}
    owners = fams.specific_fields()
    base: dict[str, Any] = {}
    mine: dict[str, Any] = dict((inherited or {}).get(kind, {})) if isinstance(kind, str) else {}
    for key, value in raw.items():
        if key in own:
            mine[key] = value
        elif key in common:
            base[key] = value
        elif key not in owners:          # another family's key: check_models names the family
            errs.unknown_key(f"{where}.{key}", key, sorted(common | own))
    m: ModelConfig | None = build(ModelConfig, base, where, errs)
    if m is None or cls is None:
        return m
    options = build(cls, mine, where, errs)
    return dataclasses.replace(m, options=options) if options is not None else None


def check_models(cfg_models: list[Any], raw_models: list[Any], errs: Errors) -> None:
    """What no single key tells: another family's keys, the source, unique names, the family's own rules."""
    names: dict[str, int] = {}
    for i, m in enumerate(cfg_models):
        if m is None:
            continue
        where = f"models[{i}]"
        _foreign_keys(m, raw_models[i] if isinstance(raw_models[i], dict) else {}, where, errs)
        if m.versions:
            _check_versions(m, where, errs)
        elif (m.hf is None) == (m.path is None):
            both = "both are set" if m.hf else "neither is set"
            errs.add(where, f"model '{m.name}': exactly one of `hf` or `path` must be set ({both})")
        if not m.name or not m.name.strip():
            errs.add(f"{where}.name", "must not be empty")
        elif m.name in names:
            errs.add(f"{where}.name", f"duplicate model name '{m.name}' (also models[{names[m.name]}])")
        else:
            names[m.name] = i
        check = getattr(m.options, "check", None)   # a family's own rules across its keys
        for key, message in check() if check is not None else ():
            errs.add(f"{where}.{key}", message)


def _foreign_keys(m: ModelConfig, raw: dict[str, Any], where: str, errs: Errors) -> None:
    """Keys of another family, or of text models on a model without a tokenizer."""
    fams = families()
    owners = fams.specific_fields()
    family = fams.get(m.kind)
    for key in raw:
        kinds = owners.get(key)
        if kinds is not None and m.kind not in kinds:
            errs.add(f"{where}.{key}", f"applies to kind {_listed(kinds)} only; model '{m.name}' is kind "
                                       f"{m.kind}")
        elif key in fams.TEXT_FIELDS and not family.needs_tokenizer:
            errs.add(f"{where}.{key}", f"applies to text models only; model '{m.name}' is kind {m.kind}")


def _check_versions(m: ModelConfig, where: str, errs: Errors) -> None:
    if m.hf is not None or m.path is not None:
        errs.add(where, f"model '{m.name}': with `versions`, set `hf` or `path` on each version, not on the model")
    seen: dict[str, int] = {}
    for k, v in enumerate(m.versions):
        at = f"{where}.versions[{k}]"
        if not v.version.strip():
            errs.add(f"{at}.version", "must not be empty")
        elif v.version in seen:
            errs.add(f"{at}.version", f"duplicate version '{v.version}' (also versions[{seen[v.version]}])")
        seen.setdefault(v.version, k)
        if (v.hf is None) == (v.path is None):
            errs.add(at, f"version '{v.version}': exactly one of `hf` or `path` must be set")
    _check_weights(m, where, errs)
    if m.default_version is not None and m.default_version not in seen:
        errs.add(f"{where}.default_version", f"'{m.default_version}' is not one of the versions "
                                             f"({', '.join(seen)})")


def _check_weights(m: ModelConfig, where: str, errs: Errors) -> None:
    weights = [v.weight for v in m.versions]
    if not any(w is not None for w in weights):
        return
    if any(w is None for w in weights):
        errs.add(f"{where}.versions", "either every version has a `weight` or none has")
    elif sum(w or 0 for w in weights) != 100:
        errs.add(f"{where}.versions", f"weights must sum to 100, got {sum(w or 0 for w in weights)} "
                                      f"({' + '.join(str(w) for w in weights)})")


def _relative_to(m: ModelConfig, base_dir: Path | None) -> ModelConfig:
    """The model's and its versions' relative `path:`s, relative to the config file's folder."""
    if base_dir is None:
        return m
    if m.path and not os.path.isabs(m.path):
        m = dataclasses.replace(m, path=str(base_dir / m.path))
    if m.versions:
        m = dataclasses.replace(m, versions=tuple(
            dataclasses.replace(v, path=str(base_dir / v.path)) if v.path and not os.path.isabs(v.path) else v
            for v in m.versions))
    return m


def _models(raw_models: Any, inherited: dict[str, dict[str, Any]], base_dir: Path | None,
            errs: Errors) -> list[Any]:
    if raw_models is None:
        errs.add("models", "required key is missing (a list of models to serve)")
    elif not isinstance(raw_models, list):
        errs.add("models", f"expected a list, got {type_name(raw_models)}")
    elif not raw_models:
        errs.add("models", "config has no models")
    else:
        models = []
        for i, raw in enumerate(raw_models):
            m = build_model(raw, f"models[{i}]", errs, inherited)
            if m is not None:
                m = _relative_to(rs_infer.fold_max_batch(m, raw, f"models[{i}]", errs.file), base_dir)
            models.append(m)
        check_models(models, raw_models, errs)
        return models
    return []


# ---------------------------------------------------------------- server


def _api_keys(entries: list[Any], limits: list[tuple[int, RateLimitConfig]], errs: Errors) -> list[Any]:
    """`server.api_keys`: strings, or `{key, rate_limit}` mappings whose limit is kept by the key's position."""
    out: list[Any] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            out.append(entry)
            continue
        where = f"server.api_keys[{i}]"
        for k in entry:
            if k not in ("key", "rate_limit"):
                errs.add(f"{where}.{k}", "unknown key (allowed: key, rate_limit)")
        if not isinstance(entry.get("key"), str) or not entry.get("key"):
            errs.add(f"{where}.key", "required: the key, a string")
            continue
        out.append(entry["key"])
        if entry.get("rate_limit") is not None:
            limit = build(RateLimitConfig, entry["rate_limit"], f"{where}.rate_limit", errs)
            if limit is not None:
                limits.append((i, limit))
    return out


def _moved(raw_server: dict[str, Any], errs: Errors) -> dict[str, dict[str, Any]]:
    """The server keys that moved to the models (MOVED_TO_MODELS), taken out of `raw_server`: by kind, each valid
    value, for the models of that kind that do not set their own."""
    inherited: dict[str, dict[str, Any]] = {}
    fams = families()
    for key, kind in MOVED_TO_MODELS.items():
        if key not in raw_server:
            continue
        value = raw_server.pop(key)
        log.warning("%s: server.%s is deprecated: set `%s` on each %s model (this value applies to every %s model "
                    "that sets none)", errs.file, key, key, kind, kind)
        cls = fams.options_class(kind)
        f = next(f for f in dataclasses.fields(cls) if f.name == key)
        conv = convert(typing.get_type_hints(cls)[key], value, f"server.{key}", dict(f.metadata), errs)
        if conv is not None:
            inherited.setdefault(kind, {})[key] = conv
    return inherited


def _server(raw: Any, errs: Errors) -> tuple[ServerConfig, dict[str, dict[str, Any]]]:
    """`server:` and the moved keys it still carries (`_moved`)."""
    raw = dict(raw) if isinstance(raw, dict) else raw or {}
    key_limits: list[tuple[int, RateLimitConfig]] = []
    inherited = _moved(raw, errs) if isinstance(raw, dict) else {}
    if isinstance(raw, dict) and isinstance(raw.get("api_keys"), list):
        raw["api_keys"] = _api_keys(raw["api_keys"], key_limits, errs)
    server = build(ServerConfig, raw, "server", errs) or ServerConfig()
    if key_limits:
        server = dataclasses.replace(server, key_limits=tuple(key_limits))
    for key in ("bind", "grpc_bind"):
        value = getattr(server, key)
        if value:
            try:
                split_bind(value)
            except ValueError as exc:
                errs.add(f"server.{key}", str(exc))
    return server, inherited


# ---------------------------------------------------------------- a whole config


def parse_config(data: Any, file: str = "<config>", base_dir: Path | None = None) -> Config:
    """Validate an already-parsed YAML document (rsinfer's, rs-infer's or nereid-server's)."""
    errs = Errors(file)
    if is_nereid(data):
        data = from_nereid(data, errs)
    if not isinstance(data, dict):
        errs.add("", f"expected a mapping with `models:` at the top level, got {type_name(data)}")
        errs.raise_if_any()
    for key in data:
        if key not in TOP_KEYS:
            errs.unknown_key(str(key), key, TOP_KEYS)
    server, inherited = _server(data.get("server"), errs)
    models = _models(data.get("models"), inherited, base_dir, errs)
    errs.raise_if_any()
    return Config(models=tuple(models), server=server, file=file)


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate a YAML config. Relative `path:` entries are relative to the config file."""
    import yaml

    p = Path(path)
    if p.suffix.lower() == ".toml":
        raise ConfigError(f"{p}: TOML configs are not supported; convert it to YAML")
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{p}: config file not found") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read config: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{p}: {where}invalid YAML: {problem}") from exc
    return parse_config(data, file=str(p), base_dir=p.resolve().parent)


def _listed(items: Sequence[str]) -> str:
    """"a", "a and b", "a, b and c"."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"
