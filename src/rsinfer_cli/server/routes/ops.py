"""Operations: `/health`, `/v1/models`, `/metrics`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp import web

from ... import families
from ...errors import public_text
from ...jsonio import dumps, encode
from ..kserve.extensions import model_ready
from ..schemas import Health, Info, ModelList, NotReady
from .common import STATE, json_response

routes = web.RouteTableDef()


@routes.get("/health")
@routes.post("/health")
async def health(request: web.Request) -> web.Response:
    """200 once every model is loaded (the listener binds only then); with a cache, whether it answers (a cache
    that is down never makes the server unhealthy: requests are served without it)."""
    state = request.app[STATE]
    why = state.not_ready()
    if why is not None:
        return web.Response(status=503, body=encode(NotReady(status="unavailable", reason=public_text(why))),
                            content_type="application/json")
    body = Health(status="ok", models_loaded=len(state.registry.models))
    cache = state.cache
    if cache is not None:
        body.cache = "ok" if cache.available else "unavailable"
        if state.config.server.cache is not None and state.config.server.cache.backend == "redis":
            body.redis_connected = cache.available
    return json_response(body)


def public_source(source: str) -> str:
    """A source id without local paths: `path:/srv/models/minilm` → `path:minilm` (a Hub id stays as it is)."""
    if source.startswith("path:"):
        head, plus, rest = source[5:].partition("+")
        return f"path:{Path(head).name}{plus}{rest}"
    return source


def public_provenance(prov: dict[str, Any]) -> dict[str, Any]:
    """Provenance for a public answer: no absolute local paths (`rsinfer inspect` shows them locally)."""
    out = {k: v for k, v in prov.items() if k != "local_path"}
    out["source"] = public_source(str(prov.get("source", "")))
    return out


@routes.get("/v1/models")
async def models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    data = []
    for name, entries in state.registry.entries.items():
        m = entries[0]
        card = m.card()
        pipe = state.pipelines.get(m.key)
        data.append({
            "id": name, "object": "model", "created": int(state.started), "owned_by": "rsinfer",
            "kind": m.kind, "source": public_source(card["source"]),
            "provenance": public_provenance(card["provenance"]),
            "graph_file": card["graph_file"], "dtype": card["dtype"],
            "execution_providers": card["execution_providers"], "replicas": card["replicas"],
            "threads": {**card["threads"], "cpus": state.registry.plan.cpus.count},
            "max_len": card["max_len"], "default": state.registry.defaults.get(m.kind) == name,
            "warmup": card["warmup"],
            "pipeline": pipe.describe() if pipe is not None else {"kind": m.kind},
        })
        if "pooling" in data[-1]["pipeline"]:
            data[-1]["pooling"] = data[-1]["pipeline"]["pooling"]
        if m.version is not None:  # a versioned model: each version's source and share of unnamed requests
            entry = state.registry.configs[name]
            weights = {v.version: v.weight for v in entry.versions}
            data[-1]["versions"] = [{"version": v.version, "source": public_source(v.card()["source"]),
                                     "weight": weights.get(v.version or "")} for v in entries]
            data[-1]["default_version"] = entry.default_version
    return json_response(ModelList(object="list", data=data))


@routes.get("/info")
@routes.get("/models/{name}/info")
async def info(request: web.Request) -> web.Response:
    """TEI's `/info` for the model the path names, or the one model (or the default embedding / rerank model): id,
    kind, limits. `version` is the model's version: rsinfer shows no server version banner."""
    state = request.app[STATE]
    reg = state.registry
    name = request.match_info.get("name") or (next(iter(reg.entries)) if len(reg.entries) == 1 else next(
        (reg.defaults[f.kind] for f in families.all_families() if f.kind in reg.defaults), None))
    if name is None:
        from ...errors import InputError

        raise InputError(f"several models are served ({', '.join(reg.entries)}) and none is a default; "
                         "see /v1/models, or ask /models/{name}/info")
    if name not in reg.entries:
        raise reg.not_found(name)
    m = reg.entries[name][0]
    pipe = state.pipelines[m.key]
    info_type = families.get(m.kind).info_type or m.kind
    return json_response(Info(
        model_id=name, model_sha=m.resolved.commit, model_dtype=m.config.dtype, kind=m.kind,
        model_type={info_type: pipe.describe()}, max_input_length=m.max_len,
        max_concurrent_requests=state.config.server.max_queue, max_batch_tokens=pipe.max_tokens,
        max_batch_requests=None, max_client_batch_size=state.config.server.max_texts, max_batch_rows=pipe.max_rows,
        auto_truncate=m.config.truncate, tokenization_workers=state.runtime.prep_executor._max_workers,
        version=m.version or "1"))


@routes.get("/models/{name}/health")
async def model_health(request: web.Request) -> web.Response:
    """A model's health under its per-model base URL (huggingface_hub's `health_check`): 200 while it serves, 503
    with the reason while it is configured but not loaded, 404 for a name not configured."""
    state = request.app[STATE]
    name = request.match_info["name"]
    ready, why = model_ready(state, name, None)
    if not ready:
        return web.Response(status=503, body=encode(NotReady(status="unavailable", reason=public_text(why))),
                            content_type="application/json")
    return json_response(Health(status="ok", models_loaded=1))


@routes.get("/openapi.json")
async def openapi_json(request: web.Request) -> web.Response:
    from ..openapi import document

    state = request.app[STATE]
    return web.Response(body=dumps(document(secured=bool(state.config.server.api_keys))),
                        content_type="application/json")


@routes.get("/docs")
async def docs(request: web.Request) -> web.Response:
    from ..openapi import DOCS_HTML

    return web.Response(text=DOCS_HTML, content_type="text/html")


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if state.before_metrics is not None:
        await state.before_metrics()
    m = state.metrics
    return web.Response(body=m.render(), headers={"Content-Type": m.content_type})
