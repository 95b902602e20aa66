"""YAML config → frozen, validated dataclasses; every mistake names the file and the key path."""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError

EPS = ("cpu", "cuda", "tensorrt", "nvrtx", "coreml", "openvino", "directml")
DTYPE_ALIASES = {
    "auto": "auto",
    "fp32": "fp32", "f32": "fp32", "float32": "fp32",
    "fp16": "fp16", "f16": "fp16", "half": "fp16", "float16": "fp16",
    "int8": "int8", "q8": "int8", "quantized": "int8",
}


def _opt(default: Any = None, **meta: Any) -> Any:
    """A field with validation metadata: gt/ge (bounds), choices, aliases, doc."""
    if isinstance(default, (list, dict)):
        raise TypeError("use tuples for defaults")
    return field(default=default, metadata=meta)


opt = _opt   # families declare their options' fields with it (families.Family.options)


CPU_MAX_TOKENS = 512        # padded tokens per forward that run fastest on CPU (benchmarks/RESULTS.md)
ACCELERATOR_MAX_TOKENS = 8192
CPU_MAX_PADDING = 16        # padding tokens a row may add to a CPU batch before it starts a new one


@dataclass(frozen=True)
class BatchingConfig:
    # rows of concurrent requests share forwards; false: each request runs on its own
    enabled: bool = True
    # rows per forward, on every path (rs-infer's `max_batch` sets it)
    max_rows: int = _opt(64, gt=0)
    max_tokens: int | None = _opt(None, gt=0)   # None: 512 when the model runs on CPU, 8192 on an accelerator
    # rows that may wait for this model; more → 429 with Retry-After (a larger request runs alone)
    queue_rows: int = _opt(1024, gt=0)


@dataclass(frozen=True)
class CacheConfig:
    """The row cache (server-wide; a model opts out with `cache: false`)."""

    # memory: an LRU in this process (each front end its own); redis: shared by every replica
    backend: str = _opt("memory", choices=("memory", "redis"))
    max_mb: float = _opt(256, gt=0)                     # memory: an LRU bounded by this many MiB
    url: str = "redis://127.0.0.1:6379/0"               # redis: rediss:// and a password in the URL work
    ttl_s: int = _opt(86400, gt=0)                      # redis: entries expire after this many seconds
    min_inference_ms: float = _opt(0, ge=0)             # cache a request's rows only if their forwards took this long
    timeout_ms: float = _opt(50, gt=0)                  # redis: per round trip; slower = served without the cache


@dataclass(frozen=True)
class RateLimitConfig:
    """`requests` per `window_s` seconds per client (server/ratelimit.py)."""

    # requests allowed per client per window
    requests: int = _opt(60, gt=0)
    # the window, in seconds
    window_s: float = _opt(60.0, gt=0)


@dataclass(frozen=True)
class TracingConfig:
    """OpenTelemetry spans over OTLP/HTTP protobuf to `<otlp_endpoint>/v1/traces` (server/tracing.py)."""

    otlp_endpoint: str                               # required, e.g. http://127.0.0.1:4318
    # the `service.name` of the spans
    service_name: str = "rsinfer"
    # the share of traces sampled, unless the client's traceparent decided
    sample_ratio: float = _opt(1.0, ge=0, le=1)


@dataclass(frozen=True)
class ServerConfig:
    # HTTP host:port (127.0.0.1 unless you mean it; `--host`/`--port` override)
    bind: str = "127.0.0.1:8080"
    grpc_bind: str | None = None          # KServe v2 gRPC (tritonclient.grpc), e.g. 127.0.0.1:8001; off when unset
    # largest request body, checked before it is read; more → 413
    max_body_mb: float = _opt(32, gt=0)
    # a request's deadline: past it → 408 and its queued work is dropped
    request_timeout_ms: int = _opt(120_000, gt=0)
    # requests that may wait for a replica, per model (a model's own `max_queue` overrides); more → 429
    max_queue: int = _opt(256, ge=0)
    # longest wait for a free replica; longer → 503
    queue_timeout_ms: int = _opt(30_000, gt=0)
    # where `hf:` models are cached (<dir>/hf); else $HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub
    hf_cache_dir: str | None = None
    threads: int = _opt(0, ge=0, auto=0)   # CPUs the thread plan uses; 0/auto: those this process may use
    # bearer keys; set, every route but /health, KServe live/ready, /openapi.json and /docs needs one (an entry may
    # be {key, rate_limit})
    api_keys: tuple[str, ...] = ()
    max_texts: int = _opt(2048, gt=0)            # texts per embedding / PII / classification request
    max_text_chars: int = _opt(1_000_000, gt=0)  # characters per text (a model may set its own); more → 413
    # documents per rerank request; more → 413
    max_rerank_documents: int = _opt(1000, gt=0)
    # labels per zero-shot request; more → 400
    max_candidate_labels: int = _opt(64, gt=0)
    # salt of PII `hash` mode; unset: random per process (equal values hash equal only within one)
    pii_hash_salt: str | None = None
    cache: CacheConfig | None = None                 # null: no cache
    # front-end processes (HTTP, validation, tokenizing, JSON) beside one engine process per device; 1: one
    # process does it all; auto (0): a number from the cores and the devices (rsinfer_cli.workers.supervisor)
    workers: int = _opt(1, ge=0, le=64, auto=0)
    log_format: str = _opt("text", choices=("text", "json"))   # json: one object per line (server/logs.py)
    # on SIGTERM: readiness (/health, KServe ready, gRPC health) fails at once; requests are still served this long
    # (a load balancer stops sending), then the listener closes and the requests in flight drain
    shutdown_delay_ms: int = _opt(0, ge=0)
    rate_limit: RateLimitConfig | None = None       # per API key (per address without keys); null: no limit
    tracing: TracingConfig | None = None             # OpenTelemetry over OTLP/HTTP; null: off (and free)
    # an api_keys entry may be {key, rate_limit}: its own limit, by the key's position (set by parse_config)
    key_limits: tuple[tuple[int, RateLimitConfig], ...] = field(default=(), metadata={"internal": True})
    access_log: bool = True               # one line per request at info (method, route, status, timings; no body)
    # auto: uvloop where it is installed (a default dependency on Linux and macOS), else asyncio's own loop
    event_loop: str = _opt("auto", choices=("auto", "uvloop", "asyncio"))

    @property
    def host(self) -> str:
        return split_bind(self.bind)[0]

    @property
    def port(self) -> int:
        return split_bind(self.bind)[1]


@dataclass(frozen=True)
class VersionConfig:
    """One version of a model: its own source, and its share of the requests that name no version."""

    # its name: `/versions/{v}` and `model_version` pick it
    version: str
    # a Hub repo id (or `path:`)
    hf: str | None = None
    # a local folder, relative to the config file
    path: str | None = None
    # the Hub branch, tag or commit
    revision: str = "main"
    # the folder of the repo that holds the graph
    subfolder: str | None = None
    # the graph file, pinned (else the preference order picks one)
    file: str | None = None
    # its share (integers summing to 100) of the requests that name no version
    weight: int | None = _opt(None, ge=0, le=100)


@dataclass(frozen=True)
class ModelConfig:
    # what requests call it (`model`, `/models/{name}`, `/v2/models/{name}`)
    name: str
    # its family: what it serves and which routes
    kind: str = field(metadata={"choices": lambda: _families().kinds()})
    # a Hub repo id, fetched on first start into the Hub cache (or `path:`)
    hf: str | None = None
    # a local folder (`rsinfer download` makes one), relative to the config file
    path: str | None = None
    # the Hub branch, tag or commit of `hf:`
    revision: str = "main"
    # the folder of the repo that holds the graph (searched: the root, this, `onnx/`)
    subfolder: str | None = None
    # the graph file, pinned (else model.onnx, model_fp16, model_quantized, ...)
    file: str | None = None
    # a Hub repo to take the tokenizer from, when the model's own has none
    tokenizer_hf: str | None = None
    # prefer the graph of this precision (auto: fp32, then fp16, then quantized)
    dtype: str = _opt("auto", aliases=DTYPE_ALIASES)
    # tokens per input; longer is cut (or refused with `truncate: false`); default: the model's own limit
    max_len: int | None = _opt(None, gt=0)
    max_text_chars: int | None = _opt(None, gt=0)   # characters per text for this model (else server.max_text_chars)
    # false: an input over `max_len` is a 400 naming it, not cut
    truncate: bool = True
    # the model a request naming none gets, among several of its kind (one of a kind is its default)
    default: bool = False
    cache: bool = True                    # false: this model's rows never go through server.cache
    max_queue: int | None = _opt(None, ge=0)   # requests allowed to wait for this model (else server.max_queue)
    replicas: int | None = _opt(None, ge=1, auto=None)   # concurrent forwards; None/auto: the thread plan
    max_batch: int | None = _opt(None, ge=1)  # rs-infer's spelling of batching.max_rows (one knob: that one)
    # execution providers in order; one not installed is skipped with a warning, CPU always last
    eps: tuple[str, ...] = _opt(("cpu",), choices=EPS)
    intra_threads: int = _opt(0, ge=0, auto=0)          # threads per forward; 0/auto: the thread plan
    # the GPU for cuda/tensorrt/directml
    device_id: int = _opt(0, ge=0)
    # a folder where TensorRT keeps its built engines between starts
    trt_engine_cache: str | None = None
    # CoreML: which units may run the graph
    coreml_compute_units: str = _opt("all", choices=("all", "cpu_and_gpu", "cpu_and_ne", "cpu_only"))
    # OpenVINO: the device (CPU, GPU, NPU, AUTO)
    openvino_device: str = "CPU"
    # ONNX Runtime's own log level for this model's sessions
    ort_log_level: str = _opt("warn", choices=("verbose", "info", "warn", "warning", "error", "fatal"))
    max_batch_size: int = _opt(0, ge=0)    # tensor: > 0 makes dimension 0 the batch (batched up to this many rows)
    # tensor: what serves the folder (engine/scripts/): auto (from its files) | onnx | python | exec (nereid: cpp)
    backend: str = _opt("auto", choices=("auto", "onnx", "python", "exec", "cpp"))
    # cross-request batching of this model's rows (below)
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    # versions: each loads as its own model; requests naming none are routed by weight (or default_version)
    versions: tuple[VersionConfig, ...] = ()
    # the version a request naming none gets, when the versions carry no weights (else the last)
    default_version: str | None = None
    version: str | None = field(default=None, metadata={"internal": True})   # set on each loaded version
    # the family's own keys (written flat in the model entry), as its `options` dataclass (families.Family.options)
    options: Any = field(default=None, metadata={"internal": True})

    def __post_init__(self) -> None:
        cls = _families().options_class(self.kind)
        if cls is not None and not isinstance(self.options, cls):   # none given, or another kind's
            object.__setattr__(self, "options", cls())

    def version_configs(self) -> list[ModelConfig]:
        """One config per version (the entry itself when it has none)."""
        if not self.versions:
            return [self]
        return [dataclasses.replace(self, hf=v.hf, path=v.path, revision=v.revision, subfolder=v.subfolder or
                                    self.subfolder, file=v.file or self.file, versions=(), version=v.version)
                for v in self.versions]

    @property
    def source(self) -> str:
        return f"hf:{self.hf}@{self.revision}" if self.hf else f"path:{self.path}"

    @property
    def key(self) -> str:
        """Unique among a config's loaded models: the name, with `:version` for a version of a versioned model."""
        return self.name if self.version is None else f"{self.name}:{self.version}"


@dataclass(frozen=True)
class Config:
    models: tuple[ModelConfig, ...]
    server: ServerConfig = field(default_factory=ServerConfig)
    file: str = field(default="<config>", metadata={"internal": True})

    def model(self, name: str) -> ModelConfig:
        for m in self.models:
            if m.name == name:
                return m
        names = ", ".join(m.name for m in self.models)
        raise ConfigError(f"{self.file}: no model named '{name}' (configured: {names})")

    def max_queue_of(self, model: ModelConfig) -> int:
        """Requests allowed to wait for a model: its own `max_queue`, else `server.max_queue`."""
        return self.server.max_queue if model.max_queue is None else model.max_queue

    def hf_cache_dir(self) -> Path:
        """Where Hub files land: `server.hf_cache_dir`/hf, else $HF_HUB_CACHE, $HF_HOME/hub, the default."""
        return hub_cache_dir(self.server.hf_cache_dir)


def hub_cache_dir(configured: str | None = None) -> Path:
    if configured:
        return Path(configured).expanduser() / "hf"
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def split_bind(bind: str) -> tuple[str, int]:
    host, sep, port = bind.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"must be host:port (e.g. 127.0.0.1:8080), got {bind!r}")
    return host.strip("[]"), int(port)


def normalize_dtype(value: str) -> str:
    try:
        return DTYPE_ALIASES[value.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype '{value}' (auto|fp32|fp16|int8)") from None


# ---------------------------------------------------------------- loading


class _Errors:
    def __init__(self, file: str) -> None:
        self.file = file
        self.items: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.items.append(f"{self.file}: {path}: {message}" if path else f"{self.file}: {message}")

    def raise_if_any(self) -> None:
        if self.items:
            head = self.items[0] if len(self.items) == 1 else \
                f"{len(self.items)} errors in config:\n  " + "\n  ".join(self.items)
            raise ConfigError(head)


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "a mapping"}.get(type(value), type(value).__name__)


def _convert(tp: Any, value: Any, path: str, meta: dict[str, Any], errs: _Errors) -> Any:
    if "auto" in meta and value == "auto":   # a number field that also takes `auto`
        return meta["auto"]
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _convert(args[0], value, path, meta, errs)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _build(tp, value, path, errs)
    if origin is dict:          # a mapping of names to values (e.g. an embedding model's `prompts`)
        return _convert_mapping(tp, value, path, meta, errs)
    if origin is tuple:
        return _convert_list(tp, value, path, meta, errs)
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
    }[tp]
    if not ok:
        want = {bool: "a boolean (true/false)", int: "an integer", float: "a number", str: "a string"}[tp]
        want += " or 'auto'" if "auto" in meta else ""
        errs.add(path, f"expected {want}, got {_type_name(value)} {value!r}")
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
    choices = meta["choices"]() if callable(meta.get("choices")) else meta.get("choices")
    if choices is not None and value not in choices:
        close = difflib.get_close_matches(str(value), choices, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        errs.add(path, f"must be one of {', '.join(choices)}, got {value!r}{hint}")
        return None
    bounds: tuple[tuple[str, Callable[[Any, Any], bool], str], ...] = (
        ("gt", lambda a, b: a > b, ">"), ("ge", lambda a, b: a >= b, ">="), ("le", lambda a, b: a <= b, "<="))
    for key, op, text in bounds:
        if key in meta and not op(value, meta[key]):
            errs.add(path, f"must be {text} {meta[key]}, got {value!r}")
            return None
    return value


def _convert_mapping(tp: Any, value: Any, path: str, meta: dict[str, Any], errs: _Errors) -> Any:
    """A YAML mapping of string keys, each value converted under `path.key`."""
    _, value_tp = typing.get_args(tp)
    if not isinstance(value, dict):
        errs.add(path, f"expected a mapping, got {_type_name(value)}")
        return None
    out = {}
    for k, v in value.items():
        if not isinstance(k, str):
            errs.add(f"{path}.{k}", f"the key must be a string, got {_type_name(k)}")
            continue
        conv = _convert(value_tp, v, f"{path}.{k}", meta, errs)
        if conv is not None:
            out[k] = conv
    return out


def _convert_list(tp: Any, value: Any, path: str, meta: dict[str, Any], errs: _Errors) -> Any:
    """A YAML list as a tuple, each item converted under `path[i]`; with `choices`, no item twice."""
    (inner, _) = typing.get_args(tp)
    if isinstance(value, str) or not isinstance(value, list):
        errs.add(path, f"expected a list, got {_type_name(value)}")
        return None
    items = []
    for i, item in enumerate(value):
        conv = _convert(inner, item, f"{path}[{i}]", meta, errs)
        if conv is not None:
            items.append(conv)
    if "choices" in meta:
        seen: set[Any] = set()
        for i, item in enumerate(items):
            if item in seen:
                errs.add(f"{path}[{i}]", f"duplicate entry '{item}'")
            seen.add(item)
    return tuple(items)


def _build(cls: type, data: Any, path: str, errs: _Errors) -> Any:
    if not isinstance(data, dict):
        errs.add(path or "(top level)", f"expected a mapping, got {_type_name(data)}")
        return None
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.6)
            hint = f" (did you mean '{close[0]}'?)" if close else f" (allowed: {', '.join(fields)})"
            errs.add(where, f"unknown key{hint}")
            continue
        conv = _convert(hints[key], value, where, dict(fields[key].metadata), errs)
        if conv is not None or value is None:
            kwargs[key] = conv
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and name not in kwargs and name not in data:
            errs.add(f"{path}.{name}" if path else name, "required key is missing")
        if kwargs.get(name, 0) is None and f.default is not None and not _optional(hints[name]):
            errs.add(f"{path}.{name}" if path else name, "must not be null")
            kwargs.pop(name)
    try:
        return cls(**kwargs)
    except TypeError:
        return None  # already reported: a required key is missing


def _families() -> Any:
    from . import families

    return families


def _optional(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


def _build_model(raw: Any, where: str, errs: _Errors) -> ModelConfig | None:
    """A model entry: the keys of every model (ModelConfig) and, written beside them, the keys of its family's
    options dataclass (`families.Family.options`), each validated under the entry's key path."""
    if not isinstance(raw, dict):
        return _build(ModelConfig, raw, where, errs)  # type: ignore[no-any-return]
    fams = _families()
    kind = raw.get("kind")
    if isinstance(kind, str) and kind not in fams.kinds():
        for why in fams.FAILED.values():     # the kind may be a plug-in's that did not load: say why
            errs.add(f"{where}.kind", why)
    cls = fams.options_class(kind) if isinstance(kind, str) else None
    own = set(fams.option_fields(kind)) if cls is not None else set()
    common = {f.name for f in dataclasses.fields(ModelConfig) if not f.metadata.get("internal")}
    owners = fams.specific_fields()
    base: dict[str, Any] = {}
    mine: dict[str, Any] = {}
    for key, value in raw.items():
        if key in own:
            mine[key] = value
        elif key in common:
            base[key] = value
        elif key not in owners:          # another family's key: _check_models names the family
            allowed = sorted(common | own)
            close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
            hint = f" (did you mean '{close[0]}'?)" if close else f" (allowed: {', '.join(allowed)})"
            errs.add(f"{where}.{key}", f"unknown key{hint}")
    m: ModelConfig | None = _build(ModelConfig, base, where, errs)
    if m is None or cls is None:
        return m
    options = _build(cls, mine, where, errs)
    return dataclasses.replace(m, options=options) if options is not None else None


def _check_models(cfg_models: list[Any], raw_models: list[Any], errs: _Errors) -> None:
    names: dict[str, int] = {}
    fams = _families()
    owners = fams.specific_fields()
    for i, m in enumerate(cfg_models):
        if m is None:
            continue
        where = f"models[{i}]"
        raw = raw_models[i] if isinstance(raw_models[i], dict) else {}
        family = fams.get(m.kind)
        for key in raw:
            owner = owners.get(key)
            if owner is not None and owner != m.kind:
                errs.add(f"{where}.{key}", f"applies to kind {owner} only; model '{m.name}' is kind {m.kind}")
            elif key in fams.TEXT_FIELDS and not family.needs_tokenizer:
                errs.add(f"{where}.{key}", f"applies to text models only; model '{m.name}' is kind {m.kind}")
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


def _check_versions(m: ModelConfig, where: str, errs: _Errors) -> None:
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
    weights = [v.weight for v in m.versions]
    if any(w is not None for w in weights):
        if any(w is None for w in weights):
            errs.add(f"{where}.versions", "either every version has a `weight` or none has")
        elif sum(w or 0 for w in weights) != 100:
            errs.add(f"{where}.versions", f"weights must sum to 100, got {sum(w or 0 for w in weights)} "
                                          f"({' + '.join(str(w) for w in weights)})")
    if m.default_version is not None and m.default_version not in seen:
        errs.add(f"{where}.default_version", f"'{m.default_version}' is not one of the versions "
                                             f"({', '.join(seen)})")


# ---------------------------------------------------------------- nereid.yaml


NEREID_SERVER = ("bind_addr", "ml_backends_path")
NEREID_MODEL = ("name", "device", "queue_capacity", "backend")
NEREID_BACKENDS = {"python": "python", "cpp": "exec", "onnx": "onnx"}
NEREID_UNSERVED = {"rust": "TorchScript .pt", "torch": "TorchScript .pt", "tensorflow": "TensorFlow SavedModel",
                   "cxx": "C++ linked into nereid"}


def is_nereid(data: Any) -> bool:
    """A nereid-server config: its `server` has `bind_addr` or `ml_backends_path`."""
    server = data.get("server") if isinstance(data, dict) else None
    return isinstance(server, dict) and any(k in server for k in NEREID_SERVER)


def from_nereid(data: dict[str, Any], errs: _Errors) -> dict[str, Any]:
    """nereid.yaml → the same config in rsinfer's keys: `server.bind_addr` is the KServe gRPC listener, each model
    a `kind: tensor` folder under `ml_backends_path`, `device` its EPs, `queue_capacity` its queue."""
    server = data["server"]
    for key in server:
        if key not in NEREID_SERVER:
            errs.add(f"server.{key}", f"unknown key in a nereid config (allowed: {', '.join(NEREID_SERVER)})")
    for key in data:
        if key not in ("server", "models"):
            errs.add(str(key), "unknown key in a nereid config (allowed: server, models)")
    for key in NEREID_SERVER:
        if not isinstance(server.get(key), str) or not server.get(key):
            errs.add(f"server.{key}", "required: a string")
    root = str(server.get("ml_backends_path") or "")
    models = []
    raw_list = data.get("models")
    for i, m in enumerate(raw_list if isinstance(raw_list, list) else []):
        where = f"models[{i}]"
        if not isinstance(m, dict):
            errs.add(where, f"expected a mapping, got {_type_name(m)}")
            continue
        for key in m:
            if key not in NEREID_MODEL:
                errs.add(f"{where}.{key}", f"unknown key in a nereid config (allowed: {', '.join(NEREID_MODEL)})")
        out: dict[str, Any] = {"name": m.get("name"), "kind": "tensor",
                               "path": os.path.join(root, str(m.get("name", "")))}
        device = m.get("device", "cpu")
        if device == "cpu":
            out["eps"] = ["cpu"]
        elif isinstance(device, str) and (device == "cuda" or (device.startswith("cuda:")
                                                               and device[5:].isdigit())):
            out["eps"] = ["cuda", "cpu"]
            out["device_id"] = int(device[5:]) if ":" in device else 0
        else:
            errs.add(f"{where}.device", f"must be cpu, cuda or cuda:<index>, got {device!r}")
        if "queue_capacity" in m:
            qc = m["queue_capacity"]
            if not isinstance(qc, int) or isinstance(qc, bool) or qc <= 0:
                errs.add(f"{where}.queue_capacity", f"must be > 0, got {qc!r}")
            else:
                out["max_queue"] = qc
        backend = m.get("backend")
        if backend is not None:
            if backend in NEREID_UNSERVED:
                errs.add(f"{where}.backend", f"'{backend}' ({NEREID_UNSERVED[backend]}) is not served by rsinfer; "
                                             "export the model to ONNX, or wrap it in a python main.py")
            elif backend not in NEREID_BACKENDS:
                errs.add(f"{where}.backend", f"must be one of {', '.join(NEREID_BACKENDS)}, got {backend!r}")
            else:
                out["backend"] = NEREID_BACKENDS[backend]
        models.append(out)
    bind = server.get("bind_addr")
    return {"server": {"grpc_bind": bind} if isinstance(bind, str) and bind else {}, "models": models}


def _api_keys(entries: list[Any], limits: list[tuple[int, RateLimitConfig]], errs: _Errors) -> list[Any]:
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
            limit = _build(RateLimitConfig, entry["rate_limit"], f"{where}.rate_limit", errs)
            if limit is not None:
                limits.append((i, limit))
    return out


def parse_config(data: Any, file: str = "<config>", base_dir: Path | None = None) -> Config:
    """Validate an already-parsed YAML document (rsinfer's, rs-infer's or nereid-server's)."""
    errs = _Errors(file)
    if is_nereid(data):
        data = from_nereid(data, errs)
    if not isinstance(data, dict):
        errs.add("", f"expected a mapping with `models:` at the top level, got {_type_name(data)}")
        errs.raise_if_any()
    for key in data:
        if key not in ("server", "models"):
            close = difflib.get_close_matches(str(key), ["server", "models"], n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else " (allowed: server, models)"
            errs.add(str(key), f"unknown key{hint}")
    raw_server = data.get("server") or {}
    key_limits: list[tuple[int, RateLimitConfig]] = []
    if isinstance(raw_server, dict) and isinstance(raw_server.get("api_keys"), list):
        raw_server = dict(raw_server)
        raw_server["api_keys"] = _api_keys(raw_server["api_keys"], key_limits, errs)
    server = _build(ServerConfig, raw_server, "server", errs) or ServerConfig()
    if key_limits:
        server = dataclasses.replace(server, key_limits=tuple(key_limits))
    for key in ("bind", "grpc_bind"):
        value = getattr(server, key)
        if value:
            try:
                split_bind(value)
            except ValueError as exc:
                errs.add(f"server.{key}", str(exc))
    raw_models = data.get("models")
    models: list[Any] = []
    if raw_models is None:
        errs.add("models", "required key is missing (a list of models to serve)")
    elif not isinstance(raw_models, list):
        errs.add("models", f"expected a list, got {_type_name(raw_models)}")
    elif not raw_models:
        errs.add("models", "config has no models")
    else:
        for i, raw in enumerate(raw_models):
            m = _build_model(raw, f"models[{i}]", errs)
            if m is not None and m.max_batch is not None:  # rs-infer's direct-path knob: one knob now
                batching = raw.get("batching")
                given = batching.get("max_rows") if isinstance(batching, dict) else None
                if given is None:
                    m = dataclasses.replace(m, batching=dataclasses.replace(m.batching, max_rows=m.max_batch))
                elif given != m.max_batch:
                    logging.getLogger("rsinfer.config").warning(
                        "%s: models[%d].max_batch (%d) is ignored: batching.max_rows (%d) sets the rows per forward "
                        "on every path", file, i, m.max_batch, given)
            if m is not None and m.path and base_dir is not None and not os.path.isabs(m.path):
                m = dataclasses.replace(m, path=str(base_dir / m.path))
            if m is not None and m.versions and base_dir is not None:
                m = dataclasses.replace(m, versions=tuple(
                    dataclasses.replace(v, path=str(base_dir / v.path)) if v.path and not os.path.isabs(v.path)
                    else v for v in m.versions))
            models.append(m)
        _check_models(models, raw_models, errs)
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
