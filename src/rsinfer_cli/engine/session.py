"""ONNX Runtime sessions: execution providers resolved against the installed wheel, options, graph info."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..config import ModelConfig
from ..errors import ModelLoadError

log = logging.getLogger("rsinfer.engine")

PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "nvrtx": "NvTensorRTRTXExecutionProvider",
    "coreml": "CoreMLExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
    "directml": "DmlExecutionProvider",
}
SHORT = {v: k for k, v in PROVIDERS.items()}
LOG_LEVELS = {"verbose": 0, "info": 1, "warn": 2, "warning": 2, "error": 3, "fatal": 4}
COREML_UNITS = {"all": "ALL", "cpu_and_gpu": "CPUAndGPU", "cpu_and_ne": "CPUAndNeuralEngine",
                "cpu_only": "CPUOnly"}


class Session(Protocol):
    """What rsinfer uses of an `onnxruntime.InferenceSession`."""

    def run(self, output_names: list[str] | None, input_feed: dict[str, Any]) -> list[Any]: ...
    def get_inputs(self) -> list[Any]: ...
    def get_outputs(self) -> list[Any]: ...
    def get_providers(self) -> list[str]: ...


def available_providers() -> list[str]:
    import onnxruntime as ort

    return list(ort.get_available_providers())


@dataclass(frozen=True)
class EpPlan:
    requested: tuple[str, ...]
    resolved: tuple[str, ...]                          # short names, CPU last
    skipped: tuple[tuple[str, str], ...] = ()          # (ep, why)
    options: tuple[dict[str, Any], ...] = field(default=())


def provider_options(ep: str, cfg: ModelConfig) -> dict[str, Any]:
    if ep in ("cuda", "directml"):
        return {"device_id": cfg.device_id}
    if ep in ("tensorrt", "nvrtx"):
        opts: dict[str, Any] = {"device_id": cfg.device_id}
        if cfg.trt_engine_cache:
            opts.update(trt_engine_cache_enable=True, trt_engine_cache_path=cfg.trt_engine_cache,
                        trt_timing_cache_enable=True, trt_timing_cache_path=cfg.trt_engine_cache)
        return opts
    if ep == "coreml":
        return {"MLComputeUnits": COREML_UNITS[cfg.coreml_compute_units]}
    if ep == "openvino":
        return {"device_type": cfg.openvino_device}
    return {}


def plan_eps(cfg: ModelConfig, available: list[str] | None = None) -> EpPlan:
    """Resolve the configured EP priority list against the installed providers; CPU always last."""
    avail = available if available is not None else available_providers()
    resolved, skipped = [], []
    for ep in cfg.eps:
        if ep == "cpu":
            continue
        if PROVIDERS[ep] in avail:
            resolved.append(ep)
        else:
            skipped.append((ep, f"{PROVIDERS[ep]} is not in this onnxruntime build "
                                f"(available: {', '.join(SHORT.get(a, a) for a in avail)})"))
    resolved.append("cpu")
    return EpPlan(requested=tuple(cfg.eps), resolved=tuple(resolved), skipped=tuple(skipped),
                  options=tuple(provider_options(ep, cfg) for ep in resolved))


def session_options(cfg: ModelConfig, threads: int, spinning: bool | None = None) -> Any:
    """`threads` intra-op threads (the thread plan's, engine/threads.py); `spinning` sets whether its idle pool
    threads spin (None: ORT's default)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = LOG_LEVELS[cfg.ort_log_level]
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    if spinning is not None:
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # ORT's memory pattern keeps one allocation plan per distinct input shape and never drops one: with the
    # (rows, tokens) shapes of batched text, a replica's memory grows for as long as new shapes come (+16.3 MiB
    # over 3,000 forwards of all-MiniLM at up to 8 x 80, against +3.5 without), up to one plan for each of
    # max_rows x max_len shapes. Without it forwards are as fast, varied shapes or fixed (benchmarks/mem_pattern.py)
    so.enable_mem_pattern = False
    return so


def build_session(graph: Path, cfg: ModelConfig, plan: EpPlan, threads: int, spinning: bool | None = None) -> Session:
    import onnxruntime as ort

    providers = [(PROVIDERS[ep], opts) for ep, opts in zip(plan.resolved, plan.options, strict=True)]
    # the CPU provider alone: no provider to fall back from, so `run` may skip the wrapper (_cpu_session)
    klass = _cpu_session() if plan.resolved == ("cpu",) else ort.InferenceSession
    try:
        session: Session = klass(str(graph), sess_options=session_options(cfg, threads, spinning),
                                 providers=providers)
    except Exception as exc:  # noqa: BLE001 - ORT raises its own untyped errors
        raise ModelLoadError(f"onnxruntime cannot load {graph}: {exc}", model=cfg.name) from exc
    return session


@functools.cache
def _cpu_session() -> Any:
    """An `onnxruntime.InferenceSession` whose `run` calls ORT's C++ session straight away. The Python wrapper's
    `run` checks, on every call, that no WebGPU graph capture is on, that every required input is fed (reading each
    input's name and type through pybind) and that no OrtValue belongs to another session, and keeps a provider
    fallback: add_one's forward (`LoadedModel.run`) takes 51,300 instructions through it, 43,700 without
    (callgrind). On the CPU provider alone none of them can apply: ORT's C++ refuses a missing input itself (its
    message names it) and there is no provider to fall back from. An onnxruntime without the C++ session where 1.x
    keeps it gets the wrapper."""
    import onnxruntime as ort

    if not callable(getattr(ort.capi.onnxruntime_pybind11_state.InferenceSession, "run", None)):
        return ort.InferenceSession

    class CpuSession(ort.InferenceSession):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._all_outputs = [o.name for o in self._outputs_meta]
            if not isinstance(getattr(self, "_sess", None), ort.capi.onnxruntime_pybind11_state.InferenceSession):
                setattr(self, "run", super().run)       # noqa: B010 - the wrapper's run, for this one

        def run(self, output_names: list[str] | None, input_feed: dict[str, Any],
                run_options: Any = None) -> list[Any]:
            return self._sess.run(output_names or self._all_outputs, input_feed, run_options)  # type: ignore[no-any-return]

    return CpuSession


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str                       # numpy-style: int64, float32, …
    shape: tuple[int | str | None, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class GraphInfo:
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]

    def output(self, name: str) -> TensorInfo | None:
        return next((o for o in self.outputs if o.name == name), None)


_ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
              "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(int16)": "int16",
              "tensor(int8)": "int8", "tensor(uint8)": "uint8", "tensor(uint16)": "uint16",
              "tensor(uint32)": "uint32", "tensor(uint64)": "uint64", "tensor(bool)": "bool",
              "tensor(string)": "string", "tensor(bfloat16)": "bfloat16"}


def graph_info(session: Session) -> GraphInfo:
    def conv(args: list[Any]) -> tuple[TensorInfo, ...]:
        return tuple(TensorInfo(a.name, _ORT_TYPES.get(a.type, a.type), tuple(a.shape)) for a in args)

    return GraphInfo(conv(session.get_inputs()), conv(session.get_outputs()))


def actual_providers(session: Session) -> list[str]:
    return [SHORT.get(p, p) for p in session.get_providers()]


Feeds = dict[str, np.ndarray]


def sample_feeds(graph: GraphInfo, dims: dict[str, int] | None = None) -> Feeds:
    """Feeds built from the signature alone: fixed dims as declared, a named dynamic dim from `dims`, a past
    (KV-cache) length 0, any other dynamic dim 1; zeros (empty strings, False) as values. Used for the trial
    forward at load and for benchmarks of a graph nobody wrote a request for."""
    dims = dims or {}
    feeds: Feeds = {}
    for t in graph.inputs:
        shape = []
        for d in t.shape:
            if isinstance(d, int) and d >= 0:
                shape.append(d)
            elif isinstance(d, str) and d in dims:
                shape.append(dims[d])
            else:
                shape.append(0 if isinstance(d, str) and "past" in d.lower() else 1)
        if t.dtype == "string":
            feeds[t.name] = np.full(shape, "", dtype=object)
        else:
            feeds[t.name] = np.zeros(shape, dtype=np.dtype(t.dtype) if t.dtype != "bfloat16" else np.float32)
    return feeds
