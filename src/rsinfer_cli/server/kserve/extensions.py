"""Triton's statistics and model-repository extensions as `tritonclient` reads them, the same documents for REST
(server/routes/tensor.py) and gRPC (grpc_service.py, through protobuf's JSON mapping).

Statistics come from the counters `/metrics` keeps (with worker processes, merged over every process as `/metrics`
merges them), per model and version:
- success / fail: `rsinfer_model_request_duration_seconds` by result (the inference core's view of a request);
- queue: `rsinfer_queue_wait_seconds`; compute_input: `rsinfer_tokenize_seconds` (text models); compute_infer:
  `rsinfer_inference_seconds`, whose count is the execution count (one per forward: a forward may batch several
  requests); compute_output: `rsinfer_postprocess_seconds`;
- inference_count: the rows forwarded (`rsinfer_batch_rows`: Triton counts each row of a batched request);
- last_inference: when this process last answered the model (milliseconds since the epoch)."""

from __future__ import annotations

from typing import Any

from ...engine.model import LoadedModel
from ...errors import InputError, ModelNotFound, NotAllowed, RsinferError, public_text
from ...runtime.control import READY
from ..state import ServerState

NS = 1e9
STAGES = (("queue", "rsinfer_queue_wait_seconds"), ("compute_input", "rsinfer_tokenize_seconds"),
          ("compute_infer", "rsinfer_inference_seconds"), ("compute_output", "rsinfer_postprocess_seconds"))


def _duration(totals: dict[str, dict[tuple[str, str, str], float]], metric: str, key: tuple[str, str, str]
              ) -> dict[str, int]:
    return {"count": int(totals.get(f"{metric}_count", {}).get(key, 0)),
            "ns": int(totals.get(f"{metric}_sum", {}).get(key, 0) * NS)}


def model_statistics(m: LoadedModel, totals: dict[str, dict[tuple[str, str, str], float]],
                     last: dict[tuple[str, str], float]) -> dict[str, Any]:
    """One version's statistics in Triton's layout."""
    name, version = m.name, m.version or ""
    plain = (name, version, "")
    stats = {"success": _duration(totals, "rsinfer_model_request_duration_seconds", (name, version, "success")),
             "fail": _duration(totals, "rsinfer_model_request_duration_seconds", (name, version, "fail"))}
    for stage, metric in STAGES:
        stats[stage] = _duration(totals, metric, plain)
    hits = totals.get("rsinfer_cache_hits_total", {}).get((name, "", ""), 0)
    misses = totals.get("rsinfer_cache_misses_total", {}).get((name, "", ""), 0)
    stats["cache_hit"] = {"count": int(hits), "ns": 0}
    stats["cache_miss"] = {"count": int(misses), "ns": 0}
    return {"name": name, "version": m.version or "1", "last_inference": int(last.get((name, version), 0) * 1000),
            "inference_count": int(totals.get("rsinfer_batch_rows_sum", {}).get(plain, 0)),
            "execution_count": stats["compute_infer"]["count"], "inference_stats": stats, "batch_stats": []}


async def statistics(state: ServerState, name: str | None, version: str | None) -> dict[str, Any]:
    """`GET /v2/models[/{name}[/versions/{v}]]/stats`: every served version, a model's, or one version's."""
    reg = state.registry
    if name:
        if name not in reg.entries:
            raise reg.not_found(name)
        models = [reg.version_of(name, version)] if version else reg.entries[name]
    else:
        models = list(reg.models.values())
    if state.before_metrics is not None:     # a front-end process: the engine's numbers into the files first
        await state.before_metrics()
    totals = state.metrics.model_totals()
    last = state.metrics.last_request
    return {"model_stats": [model_statistics(m, totals, last) for m in models]}


def repository_index(state: ServerState, ready_only: bool = False) -> list[dict[str, Any]]:
    """`POST /v2/repository/index`: every configured model, one entry per version, its state and why."""
    out = []
    for name, versions, st in state.models.index():
        if ready_only and st.state != READY:
            continue
        for v in versions:
            entry = {"name": name, "version": v, "state": st.state}
            if st.reason:
                entry["reason"] = public_text(st.reason)
            out.append(entry)
    return out


def model_ready(state: ServerState, name: str, version: str | None) -> tuple[bool, str]:
    """Whether `name` (at `version`) serves now, and why not: a configured model that is unloaded, loading or
    failed is not ready (its state's reason); an unknown name or version is ModelNotFound."""
    reg = state.registry
    if name in reg.entries:
        reg.version_of(name, version or None)
        return True, ""
    st = state.models.states.get(name)
    if st is None:
        raise reg.not_found(name)
    return False, public_text(f"model '{name}' is {st.state}" + (f": {st.reason}" if st.reason else ""))


def _allowed(state: ServerState) -> None:
    if not state.config.server.model_control:
        raise NotAllowed("the model-repository API is off; set `server.model_control: true` to load and unload "
                         "models at run time (a SIGHUP reloads the whole config file either way)")


async def load(state: ServerState, name: str, parameters: list[str] | None = None) -> None:
    """`POST /v2/repository/models/{name}/load`: the model's entry of the config file loaded (again)."""
    _allowed(state)
    if parameters:
        raise InputError(f"load parameters ({', '.join(sorted(parameters))}) are not supported: a model's "
                         "configuration is its entry in the config file", param="parameters")
    try:
        await state.models.load(name)
    except ModelNotFound:
        raise
    except RsinferError as exc:
        raise InputError(f"failed to load model '{name}': {exc}", model=name) from None


async def unload(state: ServerState, name: str) -> None:
    """`POST /v2/repository/models/{name}/unload`."""
    _allowed(state)
    await state.models.unload(name)
