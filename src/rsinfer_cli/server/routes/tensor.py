"""Tensor models over HTTP: KServe v2 REST (the Triton HTTP protocol, JSON tensors and the binary tensor data
extension) under `/v2`, and inferstack-rs's `/infer`, `/batch` and `/models`. Errors on these routes use the
KServe body `{"error": "..."}` (see server/errors.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

import numpy as np
from aiohttp import web
from msgspec import Meta, Struct

from ...engine.model import LoadedModel
from ...engine.session import TensorInfo
from ...errors import InputError
from ...jsonio import encode
from ...pipelines.tensor import TensorPipeline, TensorResult, kserve_shape, platform, tensor_metadata
from ...wire import datatype_of
from ..kserve import codec
from ..kserve import extensions as ext
from ..schemas import KServeError, Model, Op, Request, Response
from ..state import ServerState
from .common import RECORD, STATE, decode, json_response

# ---------------------------------------------------------------- request and response bodies


Datatype = Literal["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16",
                   "FP32", "FP64", "BYTES", "BF16"]


class KServeTensor(Struct, kw_only=True):
    name: str
    datatype: Datatype
    shape: list[int]
    parameters: dict[str, Any] | None = None
    data: list[Any] | None = None


class KServeOutputRequest(Struct, kw_only=True):
    name: str
    parameters: dict[str, Any] | None = None


class KServeInferRequest(Request):
    inputs: list[KServeTensor]
    id: str | None = None
    parameters: dict[str, Any] | None = None
    outputs: list[KServeOutputRequest] | None = None


class KServeInferResponse(Response, omit_defaults=True, kw_only=True):
    model_name: str
    model_version: str
    outputs: list[codec.OutputTensor]
    id: str | None = None


class KServeTensorMeta(Response):
    name: str
    datatype: str
    shape: list[int]


class KServeModelMetadata(Response):
    name: str
    versions: list[str]
    platform: str
    inputs: list[KServeTensorMeta]
    outputs: list[KServeTensorMeta]


class KServeLive(Response):
    live: bool


class KServeReady(Response):
    ready: bool


class KServeModelReady(Response):
    name: str
    ready: bool


class KServeServerMetadata(Response):
    name: str
    version: str
    extensions: list[str]


class TritonTensorConfig(Response):
    name: str
    data_type: str
    dims: list[int]


class TritonModelConfig(Response, omit_defaults=True, kw_only=True):
    """Triton's model configuration (its model_config.proto, as `tritonclient`'s get_model_config reads it)."""

    name: str
    platform: str = ""
    backend: str = ""
    max_batch_size: int
    input: list[TritonTensorConfig]
    output: list[TritonTensorConfig]
    dynamic_batching: dict[str, Any] | None = None


class TritonDuration(Response):
    count: int
    ns: int


class TritonInferStats(Response):
    success: TritonDuration
    fail: TritonDuration
    queue: TritonDuration
    compute_input: TritonDuration
    compute_infer: TritonDuration
    compute_output: TritonDuration
    cache_hit: TritonDuration
    cache_miss: TritonDuration


class TritonModelStats(Response):
    name: str
    version: str
    last_inference: int
    inference_count: int
    execution_count: int
    inference_stats: TritonInferStats
    batch_stats: list[dict[str, Any]]


class TritonStatistics(Response):
    model_stats: list[TritonModelStats]


class RepositoryIndexRequest(Request):
    repository_name: str | None = None
    ready: bool = False


class RepositoryModel(Response, omit_defaults=True):
    name: str
    version: str
    state: str
    reason: str = ""


class RepositoryLoadRequest(Request):
    parameters: dict[str, Any] | None = None


class InferstackRequest(Request):
    input: Annotated[list[Any] | None, Meta(description="Rows for the model's one input (legacy)")] = None
    inputs: Annotated[dict[str, list[Any]] | None, Meta(description="Tensors by input name")] = None
    model: Model = None
    model_version: str | int | None = None


class InferstackResponse(Response):
    output: list[Any]
    outputs: dict[str, Any] | list[dict[str, Any]]
    model_version: str


class TensorSchema(Response):
    name: str
    shape: list[int]
    dtype: str


class InferstackVersion(Response):
    version: str
    inputs: list[TensorSchema]
    outputs: list[TensorSchema]


class InferstackModel(Response):
    name: str
    kind: str
    versions: list[InferstackVersion]


class InferstackModels(Response):
    models: list[InferstackModel]


OPS: tuple[Op, ...] = (   # the route table of this family (server/schemas.py), for /openapi.json
    Op(("/v2",), "GET", "KServe v2 server metadata", "tensor", response=KServeServerMetadata, errors="kserve"),
    Op(("/v2/health/live",), "GET", "KServe v2 liveness: {\"live\": true}", "tensor", response=KServeLive,
       errors="kserve", open=True),
    Op(("/v2/health/ready",), "GET", "KServe v2 readiness: {\"ready\": true} (503 and false while not ready)", "tensor",
       response=KServeReady, errors="kserve", open=True),
    Op(("/v2/models/{model}", "/v2/models/{model}/versions/{version}"), "GET", "KServe v2 model metadata",
       "tensor", response=KServeModelMetadata, errors="kserve"),
    Op(("/v2/models/{model}/ready", "/v2/models/{model}/versions/{version}/ready"), "GET",
       "KServe v2 model readiness: {\"name\", \"ready\": true} (503 with the reason while not ready)", "tensor",
       response=KServeModelReady, errors="kserve"),
    Op(("/v2/models/{model}/config", "/v2/models/{model}/versions/{version}/config"), "GET",
       "Triton's model configuration extension (tensor models)", "tensor", response=TritonModelConfig,
       errors="kserve"),
    Op(("/v2/models/stats", "/v2/models/{model}/stats", "/v2/models/{model}/versions/{version}/stats"), "GET",
       "Triton's statistics extension: counts and times per model version", "tensor", response=TritonStatistics,
       errors="kserve"),
    Op(("/v2/repository/index",), "POST", "KServe v2 model-repository index: every configured model and its state",
       "tensor", RepositoryIndexRequest, response=list[RepositoryModel], errors="kserve"),
    Op(("/v2/repository/models/{model}/load", "/v2/repository/models/{model}/unload"), "POST",
       "KServe v2 model-repository load (the model's entry of the config file, again) and unload "
       "(server.model_control)", "tensor", RepositoryLoadRequest, response="empty", errors="kserve",
       more=(("403", "server.model_control is off"),)),
    Op(("/v2/models/{model}/infer", "/v2/models/{model}/versions/{version}/infer"), "POST",
       "KServe v2 inference (JSON tensors, or the binary tensor data extension)", "tensor", KServeInferRequest,
       KServeInferResponse, errors="kserve"),
    Op(("/infer",), "POST", "inferstack-rs inference", "tensor", InferstackRequest, InferstackResponse,
       errors="kserve"),
    Op(("/batch",), "POST", "inferstack-rs batch: one row per item", "tensor", InferstackRequest,
       InferstackResponse, errors="kserve"),
    Op(("/models",), "GET", "inferstack-rs: every model, its versions and their tensors", "tensor",
       response=InferstackModels, errors="kserve"),
)


routes = web.RouteTableDef()
BENCH = {"/infer": lambda texts: {"input": [[0.0, 0.0, 0.0, 0.0]] * max(len(texts), 1)}}
EXTENSIONS = ["binary_tensor_data", "model_configuration", "statistics", "model_repository"]


def model_of(state: ServerState, name: str | None, version: str | None) -> LoadedModel:
    """A tensor model by name (the default tensor model when None) and version (routed when None/"")."""
    return state.registry.get(name, "tensor", version or None)


def metadata(state: ServerState, m: LoadedModel) -> KServeModelMetadata:
    g = m.graph
    return KServeModelMetadata(name=m.name, versions=state.registry.versions(m.name) or ["1"], platform=platform(m),
                               inputs=[KServeTensorMeta(**t) for t in tensor_metadata(g.inputs)],
                               outputs=[KServeTensorMeta(**t) for t in tensor_metadata(g.outputs)])


async def infer(request: web.Request, state: ServerState, m: LoadedModel, tensors: dict[str, Any],
                outputs: list[str] | None = None) -> TensorResult:
    pipe = state.pipelines[m.key]
    assert isinstance(pipe, TensorPipeline)
    return await state.core.infer(request[RECORD], m, pipe.plan, tensors, outputs)


# ---------------------------------------------------------------- KServe v2 REST


# first in the table: aiohttp tries every /v2/models/... resource in registration order, and infer is the hot one
@routes.post("/v2/models/{model}/infer")
@routes.post("/v2/models/{model}/versions/{version}/infer")
async def kserve_infer(request: web.Request) -> web.Response:
    state = request.app[STATE]
    m = model_of(state, request.match_info["model"], request.match_info.get("version"))
    pipe = state.pipelines[m.key]
    assert isinstance(pipe, TensorPipeline)
    header = request.headers.get("Inference-Header-Content-Length")
    try:
        header_length = int(header) if header is not None else None
    except ValueError:
        raise InputError(f"Inference-Header-Content-Length must be an integer, got {header!r}") from None
    body, tail = codec.parse_infer_body(await request.read(), header_length)
    tensors = codec.decode_inputs(body, tail, pipe.check_datatype)
    names, binary, binary_default = codec.requested_outputs(body)
    result: TensorResult = await state.core.infer(request[RECORD], m, pipe.plan, tensors, names)
    items, chunks = codec.encode_outputs(result.outputs, binary, binary_default and names is None)
    head = encode(KServeInferResponse(model_name=m.name, model_version=m.version or "1", outputs=items,
                                      id=body.get("id")))
    if not chunks:
        return web.Response(body=head, content_type="application/json")
    return web.Response(body=head + b"".join(chunks), content_type="application/octet-stream",
                        headers={"Inference-Header-Content-Length": str(len(head))})


# before /v2/models/{model}: "stats" is not a model's name here
@routes.get("/v2/models/stats")
@routes.get("/v2/models/{model}/stats")
@routes.get("/v2/models/{model}/versions/{version}/stats")
async def triton_statistics(request: web.Request) -> web.Response:
    """Triton's statistics extension (`tritonclient` get_inference_statistics), from the counters of /metrics."""
    state = request.app[STATE]
    doc = await ext.statistics(state, request.match_info.get("model"), request.match_info.get("version"))
    return json_response(doc)


@routes.post("/v2/repository/index")
async def repository_index(request: web.Request) -> web.Response:
    """Every configured model with its state (READY, LOADING, UNAVAILABLE) and the reason."""
    state = request.app[STATE]
    body = await request.read()
    req = decode(body, RepositoryIndexRequest) if body.strip() else RepositoryIndexRequest()
    return json_response(ext.repository_index(state, req.ready))


@routes.post("/v2/repository/models/{model}/load")
async def repository_load(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body = await request.read()
    req = decode(body, RepositoryLoadRequest) if body.strip() else RepositoryLoadRequest()
    await ext.load(state, request.match_info["model"], list(req.parameters or ()))
    return web.Response(status=200)


@routes.post("/v2/repository/models/{model}/unload")
async def repository_unload(request: web.Request) -> web.Response:
    state = request.app[STATE]
    await ext.unload(state, request.match_info["model"])
    return web.Response(status=200)


@routes.get("/v2/health/live")
async def live(request: web.Request) -> web.Response:
    """The KServe v2 body, `{"live": true}`: the `kserve` client reads it (tritonclient reads the status)."""
    return json_response(KServeLive(live=True))


@routes.get("/v2/health/ready")
async def ready(request: web.Request) -> web.Response:
    """Ready: every model loaded (the listener binds only then), and with worker processes, the engine and every
    front end up."""
    state = request.app[STATE]
    ready = state.not_ready() is None
    return web.Response(status=200 if ready else 503, body=encode(KServeReady(ready=ready)),
                        content_type="application/json")


@routes.get("/v2")
async def server_metadata(request: web.Request) -> web.Response:
    return json_response(KServeServerMetadata(name="rsinfer", version="", extensions=EXTENSIONS))


@routes.get("/v2/models/{model}")
@routes.get("/v2/models/{model}/versions/{version}")
async def model_metadata(request: web.Request) -> web.Response:
    state = request.app[STATE]
    m = model_of(state, request.match_info["model"], request.match_info.get("version"))
    return json_response(metadata(state, m))


@routes.get("/v2/models/{model}/ready")
@routes.get("/v2/models/{model}/versions/{version}/ready")
async def model_ready(request: web.Request) -> web.Response:
    """200 while the model serves; 503 (with the reason) while it is configured but unloaded, loading or failed;
    404 for a name or version that is not configured."""
    name = request.match_info["model"]
    ready, why = ext.model_ready(request.app[STATE], name, request.match_info.get("version"))
    if not ready:
        return web.Response(status=503, body=encode(KServeError(error=why)), content_type="application/json")
    return json_response(KServeModelReady(name=name, ready=True))


def triton_type(datatype: str) -> str:
    """KServe's datatype → Triton's TYPE_* (FP32 → TYPE_FP32, BYTES → TYPE_STRING)."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def model_config(state: ServerState, m: LoadedModel) -> TritonModelConfig:
    """A tensor model as Triton describes it: dims without the batch dimension when max_batch_size > 0."""
    pipe = state.pipelines[m.key]
    assert isinstance(pipe, TensorPipeline)
    batch = pipe.max_batch_size

    def tensors(ts: Sequence[TensorInfo]) -> list[TritonTensorConfig]:
        return [TritonTensorConfig(name=t["name"], data_type=triton_type(t["datatype"]),
                                   dims=t["shape"][1:] if batch > 0 else t["shape"]) for t in tensor_metadata(ts)]

    onnx = m.backend == "onnx"
    return TritonModelConfig(name=m.name, platform=platform(m) if onnx else "", backend="" if onnx else m.backend,
                             max_batch_size=batch, input=tensors(m.graph.inputs), output=tensors(m.graph.outputs),
                             dynamic_batching={} if batch > 0 and pipe.batching else None)


@routes.get("/v2/models/{model}/config")
@routes.get("/v2/models/{model}/versions/{version}/config")
async def triton_model_config(request: web.Request) -> web.Response:
    """Triton's model-configuration extension (`tritonclient.http.get_model_config`), for tensor models."""
    state = request.app[STATE]
    m = model_of(state, request.match_info["model"], request.match_info.get("version"))
    return json_response(model_config(state, m))


# ---------------------------------------------------------------- inferstack-rs


def _named(result: TensorResult) -> dict[str, Any]:
    return {k: v.tolist() for k, v in result.outputs.items()}


def _legacy_tensor(pipe: TensorPipeline, value: Any, what: str) -> dict[str, Any]:
    """`input` (legacy, the model's first input) as an array of the input's dtype."""
    first = next(iter(pipe.inputs.values()))
    if len(pipe.inputs) != 1:
        raise InputError(f"`{what}` feeds the model's one input, but it has {len(pipe.inputs)} "
                         f"({pipe.signature()}); send `inputs` by name", param=what)
    return {first.name: _array(first.name, first.dtype, value)}


def _array(name: str, dtype: str, value: Any) -> Any:
    datatype = datatype_of(dtype)
    try:
        arr = np.array(value, dtype=object if datatype == "BYTES" else dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        why = "it is ragged: every row needs the same length" if "inhomogeneous" in str(exc) else str(exc)
        raise InputError(f"input '{name}' cannot be read as {datatype}: {why}", param=name) from None
    if arr.dtype == object and datatype != "BYTES":
        raise InputError(f"input '{name}' is ragged: every row needs the same length", param=name)
    return arr


async def _inferstack_model(request: web.Request) -> tuple[ServerState, InferstackRequest, LoadedModel,
                                                              TensorPipeline]:
    state = request.app[STATE]
    req = decode(await request.read(), InferstackRequest)
    version = req.model_version
    m = model_of(state, req.model, str(version) if version is not None else None)
    pipe = state.pipelines[m.key]
    assert isinstance(pipe, TensorPipeline)
    return state, req, m, pipe


@routes.post("/infer")
async def inferstack_infer(request: web.Request) -> web.Response:
    """inferstack-rs: `{"input": [[...]]}` (the first input) or `{"inputs": {"NAME": [...]}}`."""
    state, req, m, pipe = await _inferstack_model(request)
    if (req.input is None) == (req.inputs is None):
        raise InputError("provide exactly one of `input` or `inputs`", param="input")
    if req.inputs is not None:
        named = req.inputs              # may be empty: a model that takes no input
        tensors = {}
        for k, v in named.items():
            info = pipe.inputs.get(k)
            if info is None:
                raise InputError(f"unknown input '{k}'; the model's inputs are {pipe.signature()}", param=k)
            tensors[k] = _array(k, info.dtype, v)
    else:
        tensors = _legacy_tensor(pipe, req.input, "input")
    result = await infer(request, state, m, tensors)
    outputs = _named(result)
    return json_response(InferstackResponse(output=next(iter(outputs.values())), outputs=outputs,
                                            model_version=m.version or "1"))


@routes.post("/batch")
async def inferstack_batch(request: web.Request) -> web.Response:
    """inferstack-rs: every item of `input` is one row of the batch; the answer has one entry per item."""
    state, req, m, pipe = await _inferstack_model(request)
    items = req.input
    if not items:
        raise InputError("`input` must be a non-empty list of items", param="input")
    if pipe.max_batch_size == 0:
        raise InputError(f"model '{m.name}' has no batch dimension (max_batch_size: 0); use /infer", param="input")
    if len(items) > pipe.max_batch_size:
        raise InputError(f"`input` has {len(items)} items; at most {pipe.max_batch_size} (max_batch_size)",
                         param="input")
    tensors = _legacy_tensor(pipe, items, "input")
    result = await infer(request, state, m, tensors)
    per_item = [{k: v[i].tolist() for k, v in result.outputs.items()} for i in range(len(items))]
    return json_response(InferstackResponse(output=[next(iter(o.values())) for o in per_item], outputs=per_item,
                                            model_version=m.version or "1"))


@routes.get("/models")
async def inferstack_models(request: web.Request) -> web.Response:
    """Every model with its versions and each version's input/output schema (name, shape, dtype)."""
    state = request.app[STATE]
    def schema(tensors: Sequence[TensorInfo]) -> list[TensorSchema]:
        return [TensorSchema(name=t.name, shape=kserve_shape(t), dtype=t.dtype) for t in tensors]

    return json_response(InferstackModels(models=[
        InferstackModel(name=name, kind=versions[0].kind, versions=[
            InferstackVersion(version=v.version or "1", inputs=schema(v.graph.inputs), outputs=schema(v.graph.outputs))
            for v in versions])
        for name, versions in state.registry.entries.items()]))
