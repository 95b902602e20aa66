"""The one configuration schema: frozen dataclasses whose fields carry their bounds, choices and documentation (the
configuration reference is generated from them). `validate.py` reads YAML into them; each foreign dialect (nereid.py,
rs_infer.py) translates into them."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from ..errors import ConfigError

Opts = TypeVar("Opts")   # a family's options dataclass

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
    # the KServe v2 repository extension (POST /v2/repository/index, .../models/{name}/load and /unload, the same
    # over gRPC): load (again) or unload one model of this file at run time; off: those routes answer 403
    model_control: bool = False
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
class WarmupInput:
    """One input of a tensor model's warm-up request (Triton's model_warmup: zero_data / random_data)."""

    # its whole shape, as a request sends it (the batch dimension included)
    dims: tuple[int, ...] = field(metadata={"ge": 0})
    # zero: zeros (empty strings, false); random: uniform values of the input's type
    data: str = _opt("zero", choices=("zero", "random"))


@dataclass(frozen=True)
class WarmupConfig:
    """Forwards run on every replica after the load and before the model is ready, so that the first request pays
    no first-call cost (`warmup: 2` is `warmup: {requests: 2}`)."""

    SHORTHAND: ClassVar[str] = "requests"
    # how many times each warm-up shape runs on each replica
    requests: int = _opt(1, ge=1)
    # tensor models: the inputs of the warm-up request, by name (default: zeros of the signature's shapes)
    inputs: dict[str, WarmupInput] | None = None
    # the most elements one warm-up input may have (its dims multiplied); more is refused at load, before anything
    # is allocated
    max_elements: int = _opt(16_777_216, gt=0)


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
    kind: str = field(metadata={"choices": lambda: families().kinds()})
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
    # forwards on every replica before the model is ready: a count, or {requests, inputs} (below); null: none
    warmup: WarmupConfig | None = None
    # versions: each loads as its own model; requests naming none are routed by weight (or default_version)
    versions: tuple[VersionConfig, ...] = ()
    # the version a request naming none gets, when the versions carry no weights (else the last)
    default_version: str | None = None
    version: str | None = field(default=None, metadata={"internal": True})   # set on each loaded version
    # the family's own keys (written flat in the model entry), as its `options` dataclass (families.Family.options);
    # None: the family's defaults. Read with `own(TheOptions)`: building a ModelConfig resolves no family code
    options: Any = field(default=None, metadata={"internal": True})

    def own(self, cls: type[Opts]) -> Opts:
        """The family's own keys as its options dataclass `cls` (its defaults when the entry set none, or when they
        are another kind's)."""
        return self.options if isinstance(self.options, cls) else cls()

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


def families() -> Any:
    """The families registry (rsinfer_cli.families), imported when first needed: it imports this module."""
    from .. import families as registry

    return registry
