"""KServe v2 gRPC (`inference.GRPCInferenceService`, what `tritonclient.grpc` speaks) on `server.grpc_bind`, in
the daemon's own event loop (grpc.aio): the same registry, schedulers, metrics and API keys as HTTP, drained on
SIGTERM with it; Triton's configuration, statistics and model-repository extensions too. Beside it, the standard
`grpc.health.v1.Health` (grpcio-health-checking): SERVING while the server is ready (a worker process: while its
engine and the other front ends are up), NOT_SERVING from the start of the drain, for Kubernetes' gRPC probes and
grpc_health_probe. Health needs no API key, like /health."""

from __future__ import annotations

import asyncio
import hmac
import logging
import sys
import time
import weakref
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format
from grpc_health.v1 import health as grpc_health
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ...errors import (
    DeadlinePassed,
    EngineUnavailable,
    InputError,
    ModelNotFound,
    NotAllowed,
    PoolTimeout,
    RsinferError,
    Saturated,
)
from ...pipelines.tensor import TensorPipeline, platform, tensor_metadata
from ...runtime.record import RequestRecord
from ...wire import element_count, numpy_dtype
from ..errors import kserve_message
from ..logs import ACCESS, REQUEST_ID, request_id
from ..logs import access as log_access
from ..state import ServerState
from . import codec
from . import extensions as ext
from . import kserve_pb2 as pb
from . import kserve_pb2_grpc as pb_grpc

log = logging.getLogger("rsinfer.server")

Context = grpc.aio.ServicerContext[Any, Any]


CODES: list[tuple[type[BaseException], grpc.StatusCode]] = [
    (ModelNotFound, grpc.StatusCode.NOT_FOUND),
    (InputError, grpc.StatusCode.INVALID_ARGUMENT),
    (Saturated, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (PoolTimeout, grpc.StatusCode.UNAVAILABLE),
    (DeadlinePassed, grpc.StatusCode.DEADLINE_EXCEEDED),
    (EngineUnavailable, grpc.StatusCode.UNAVAILABLE),
    (NotAllowed, grpc.StatusCode.PERMISSION_DENIED),
]
# typed `contents` field of each datatype (FP16 and BF16 travel only as raw bytes)
CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
            "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
            "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
            "FP64": "fp64_contents", "BYTES": "bytes_contents"}


# raw input headers remembered per model (KServeServicer._headers) and answers' templates: the distinct (name,
# datatype, shape) clients send; more (a model whose shapes vary without end) start the memory over
HEADERS = 1024
# an input's name, the numpy dtype and size in bytes its raw contents must have (None: BYTES, any size) and its shape
RawHeader = tuple[str, "np.dtype[Any] | None", list[int], int]


def _checked(pipe: TensorPipeline, t: Any, i: int) -> tuple[str, str, list[int]]:
    """inputs[i]'s header: its name, datatype and shape, and the datatype against the model."""
    name, datatype, shape = codec.check_header(t.name, t.datatype, t.shape[:], f"inputs[{i}]")
    pipe.check_datatype(name, datatype)
    return name, datatype, shape


def _raw_header(pipe: TensorPipeline, t: Any, i: int) -> RawHeader:
    """An input header of raw contents, checked (_checked), with the dtype and byte size its contents must have."""
    name, datatype, shape = _checked(pipe, t, i)
    if datatype == "BYTES" or sys.byteorder != "little":    # (raw bytes are little-endian: codec.from_raw converts)
        return name, None, shape, 0
    dtype = numpy_dtype(datatype)
    return name, dtype, shape, element_count(shape) * dtype.itemsize


def _typed_tensors(pipe: TensorPipeline, inputs: Any, count: int) -> dict[str, Any]:
    """The inputs in their typed `contents` as arrays by name."""
    tensors: dict[str, Any] = {}
    for i in range(count):
        t = inputs[i]
        name, datatype, shape = _checked(pipe, t, i)
        if name in tensors:
            raise InputError(f"input '{name}' is given twice", param=name)
        field = CONTENTS.get(datatype)
        if field is None:
            raise InputError(f"input '{name}': {datatype} travels only in raw_input_contents", param=name)
        values = getattr(t.contents, field)[:]
        if datatype == "BYTES":
            try:
                values = [v.decode("utf-8") for v in values]
            except UnicodeDecodeError:
                raise InputError(f"input '{name}': BYTES elements must be UTF-8 text", param=name) from None
        elements = element_count(shape)
        if len(values) != elements:
            raise InputError(f"input '{name}' has {len(values)} elements but shape {shape} holds {elements}",
                             param=name)
        tensors[name] = np.array(values, dtype=numpy_dtype(datatype)).reshape(shape)
    return tensors


OK = grpc.StatusCode.OK


def _access_line(method: str, code: str, elapsed: float, record: RequestRecord | None) -> None:
    """A call's access line (a function of its own: a closure in `_call` would turn its locals into cells, slower
    on every access), with an inference call's record: the same fields as an HTTP request's."""
    log_access(f"gRPC {method} {code} {elapsed * 1000:.1f}ms", lambda: {
        "method": "gRPC", "route": method, "code": code, "duration_ms": round(elapsed * 1000, 3),
        **(record.log_fields() if record is not None else {})})


def code_for(exc: BaseException) -> grpc.StatusCode:
    for klass, code in CODES:
        if isinstance(exc, klass):
            return code
    return grpc.StatusCode.INTERNAL


def failure(method: str, exc: Exception) -> tuple[grpc.StatusCode, str]:
    """A call's (or a stream request's) exception → its status code and the message its client gets: ours with
    their text, anything else INTERNAL "internal server error" with the traceback in the log (grpc.aio itself would
    send the exception's text as UNKNOWN)."""
    if isinstance(exc, RsinferError):
        return code_for(exc), kserve_message(exc)
    log.error("gRPC %s failed: %s", method, exc, exc_info=True)
    return grpc.StatusCode.INTERNAL, "internal server error"


class Unauthenticated(RsinferError):
    pass


class KServeServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.keys = [k.encode() for k in state.config.server.api_keys]
        m = state.metrics
        self.requests = m.grpc_requests
        self.duration = m.grpc_duration
        self.access = state.config.server.access_log
        self._children: dict[tuple[str, str], tuple[Any, Any]] = {}   # metric children, looked up once each
        self._templates: dict[tuple[Any, ...], Any] = {}      # _response's
        self.tracing = state.tracing
        # raw input headers remembered per model (by its pipeline: a new version starts afresh): the header's bytes
        # → _raw_header's answer
        self._headers: dict[int, tuple[weakref.ref[TensorPipeline], dict[bytes, RawHeader]]] = {}

    def _observe(self, method: str, code: str, seconds: float) -> None:
        """One call of `method` ended with status `code` (its name) after `seconds`."""
        key = (method, code)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (self.requests.labels(method, code), self.duration.labels(method))
        children[0].inc()
        children[1].observe(seconds)

    # ------------------------------------------------------------ plumbing

    def _authorize(self, context: Context) -> None:
        """The call's API key against the configured ones, if any (`_call` looks at `keys` before calling)."""
        if not self.keys:
            return
        meta = {k.lower(): v for k, v in (context.invocation_metadata() or ())}
        header = meta.get("authorization", "")
        given = header[7:].strip().encode() if isinstance(header, str) and header[:7].lower() == "bearer " else b""
        if not any([hmac.compare_digest(given, k) for k in self.keys]):  # noqa: C419 - compare every key
            raise Unauthenticated("missing or invalid API key; send `authorization: Bearer <key>` metadata")

    def _request_id(self, context: Context) -> tuple[tuple[str, str], ...]:
        """The call's request id (its `x-request-id` metadata, else a new one), set for its log lines; returned as
        the trailing metadata that echoes it."""
        given = None
        for k, v in context.invocation_metadata() or ():    # (gRPC's keys arrive lower-case: HTTP/2's)
            if k == "x-request-id":
                given = v
                break
        rid = request_id(given if type(given) is str else None)
        REQUEST_ID.set(rid)
        echo = (("x-request-id", rid),)
        context.set_trailing_metadata(echo)
        return echo

    async def _call(self, method: str, context: Context, fn: Any, *args: Any,
                    open_: bool = False, record: RequestRecord | None = None) -> Any:
        """Auth, metrics, the request id, and every error as a gRPC status with its message (never a traceback);
        an inference call's `record` (made by its method, passed to the core) in its access line and trace."""
        t0 = time.perf_counter()
        code = OK
        echo = self._request_id(context)
        try:
            if not open_ and self.keys:
                self._authorize(context)
            return await fn(*args)
        except Unauthenticated as exc:
            code = grpc.StatusCode.UNAUTHENTICATED
            await context.abort(code, str(exc), trailing_metadata=echo)
        except asyncio.CancelledError:      # the client cancelled or went away, or its deadline passed
            code = grpc.StatusCode.CANCELLED
            raise
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # noqa: BLE001 - every error becomes a status (failure)
            code, message = failure(method, exc)
            await context.abort(code, message, trailing_metadata=echo)
        finally:
            elapsed = time.perf_counter() - t0
            name = "OK" if code is OK else code.name      # (an enum's name: a Python-level property)
            self._observe(method, name, elapsed)
            if record is not None and self.tracing is not None:
                self._trace(context, method, name, echo[0][1], t0, elapsed, record)
            if self.access and ACCESS.isEnabledFor(logging.INFO):
                _access_line(method, name, elapsed, record)

    def _trace(self, context: Context, method: str, code: str, rid: str, t0: float, elapsed: float,
               record: RequestRecord) -> None:
        """The call's span and its children (tokenize, queue, forward, postprocess), as an HTTP request's."""
        headers = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        self.tracing.request(headers, f"gRPC {method}", t0, t0 + elapsed, {
            "rpc.system": "grpc", "rpc.method": method, "rpc.grpc.status_code": code, "rsinfer.request_id": rid,
            "rsinfer.model": record.model, "rsinfer.rows": record.rows}, record)

    def _model(self, name: str, version: str) -> Any:
        return self.state.registry.get(name, "tensor", version or None)

    # ------------------------------------------------------------ health and metadata

    async def ServerLive(self, request: Any, context: Any) -> Any:  # noqa: N802 - the protocol's names
        async def live() -> Any:
            return pb.ServerLiveResponse(live=True)
        return await self._call("ServerLive", context, live, open_=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        async def ready() -> Any:
            return pb.ServerReadyResponse(ready=self.state.not_ready() is None)
        return await self._call("ServerReady", context, ready, open_=True)

    async def ModelReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        async def ready() -> Any:
            return pb.ModelReadyResponse(ready=ext.model_ready(self.state, request.name, request.version)[0])
        return await self._call("ModelReady", context, ready)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        async def meta() -> Any:
            from ..routes.tensor import EXTENSIONS

            return pb.ServerMetadataResponse(name="rsinfer", version="", extensions=EXTENSIONS)
        return await self._call("ServerMetadata", context, meta)

    async def ModelMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        async def meta() -> Any:
            m = self._model(request.name, request.version)
            tm = pb.ModelMetadataResponse.TensorMetadata
            return pb.ModelMetadataResponse(
                name=m.name, versions=self.state.registry.versions(m.name) or ["1"], platform=platform(m),
                inputs=[tm(**t) for t in tensor_metadata(m.graph.inputs)],
                outputs=[tm(**t) for t in tensor_metadata(m.graph.outputs)])
        return await self._call("ModelMetadata", context, meta)

    async def ModelConfig(self, request: Any, context: Any) -> Any:  # noqa: N802
        """Triton's model configuration, the same as GET /v2/models/{name}/config answers."""
        from ..routes.tensor import model_config

        async def config() -> Any:
            c = model_config(self.state, self._model(request.name, request.version))
            return pb.ModelConfigResponse(config=pb.ModelConfig(
                name=c.name, platform=c.platform, backend=c.backend, max_batch_size=c.max_batch_size,
                input=[pb.ModelInput(name=t.name, data_type=t.data_type, dims=t.dims)
                       for t in c.input],
                output=[pb.ModelOutput(name=t.name, data_type=t.data_type, dims=t.dims)
                        for t in c.output],
                dynamic_batching=pb.ModelDynamicBatching() if c.dynamic_batching is not None else None))
        return await self._call("ModelConfig", context, config)

    # ------------------------------------------------------------ statistics and the model repository

    async def ModelStatistics(self, request: Any, context: Any) -> Any:  # noqa: N802
        async def stats() -> Any:
            doc = await ext.statistics(self.state, request.name or None, request.version or None)
            return json_format.ParseDict(doc, pb.ModelStatisticsResponse())
        return await self._call("ModelStatistics", context, stats)

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:  # noqa: N802
        async def index() -> Any:
            models = ext.repository_index(self.state, request.ready)
            return json_format.ParseDict({"models": models}, pb.RepositoryIndexResponse())
        return await self._call("RepositoryIndex", context, index)

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:  # noqa: N802
        async def load() -> Any:
            await ext.load(self.state, request.model_name, list(request.parameters))
            return pb.RepositoryModelLoadResponse()
        return await self._call("RepositoryModelLoad", context, load)

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:  # noqa: N802
        async def unload() -> Any:
            await ext.unload(self.state, request.model_name)
            return pb.RepositoryModelUnloadResponse()
        return await self._call("RepositoryModelUnload", context, unload)

    # ------------------------------------------------------------ inference

    async def _infer(self, request: Any, record: RequestRecord) -> Any:
        m = self.state.registry.get(request.model_name, "tensor", request.model_version or None)   # (_model's)
        pipe = self.state.pipelines[m.key]
        assert isinstance(pipe, TensorPipeline)
        # repeated fields read by index and slice: protobuf's containers have no __iter__, so a `for` over one
        # ends in an IndexError raised and caught (~1 µs a loop, PyErr_Format's message included: callgrind)
        inputs = request.inputs
        count = len(inputs)
        raw = request.raw_input_contents[:]
        if raw and len(raw) != count:
            raise InputError(f"{len(raw)} raw_input_contents for {count} inputs")
        if not raw:
            tensors = _typed_tensors(pipe, inputs, count)
        else:    # raw contents (what tritonclient sends): each header checked once per model's pipeline and
            held = self._headers.get(id(pipe))     # remembered by its bytes (a new version starts afresh)
            if held is None or held[0]() is not pipe:      # (an id may be reused once a pipeline is gone)
                if len(self._headers) >= HEADERS:
                    self._headers.clear()
                held = self._headers[id(pipe)] = (weakref.ref(pipe), {})
            seen = held[1]
            tensors = {}
            for i in range(count):
                t = inputs[i]
                key = t.SerializeToString()      # the header as the client sent it (name, datatype, shape)
                head = seen.get(key)
                if head is None:
                    head = _raw_header(pipe, t, i)
                    if head[1] is not None:      # a fixed size: checked once for every request that sends it
                        if len(seen) >= HEADERS:
                            seen.clear()
                        seen[key] = head
                name, dtype, shape, size = head
                if name in tensors:
                    raise InputError(f"input '{name}' is given twice", param=name)
                data = raw[i]
                if dtype is None or len(data) != size:  # BYTES, or the wrong size: decoded there, or its error
                    tensors[name] = codec.from_raw(name, t.datatype, shape, data)
                else:
                    tensors[name] = np.frombuffer(data, dtype).reshape(shape)  # read-only: ORT only reads it
        outputs = request.outputs
        result = await self.state.core.infer(record, m, pipe.plan, tensors,
                                             [o.name for o in outputs[:]] if outputs else None)
        return self._response(m, request.id, result.outputs)

    def _response(self, m: Any, rid: str, outputs: dict[str, Any]) -> Any:
        """The answer: a copy of the response made for the first answer of these outputs' names, datatypes and
        shapes (and this model), with the request's id and the outputs' bytes. Protobuf's constructor and `add()`
        cost ~26k instructions on add_one's answer, the copy with its id and bytes ~10k (callgrind)."""
        config = m.config      # its name and version: not the properties, a call each
        key: tuple[Any, ...] = (config.name, config.version)
        for name, arr in outputs.items():
            key += (name, arr.dtype, arr.shape)
        template = self._templates.get(key)
        if template is None:
            template = pb.ModelInferResponse(model_name=config.name, model_version=config.version or "1")
            for name, arr in outputs.items():
                template.outputs.add(name=name, datatype=codec.output_datatype(arr), shape=list(arr.shape))
            if len(self._templates) >= HEADERS:
                self._templates.clear()
            self._templates[key] = template
        response = pb.ModelInferResponse()
        response.CopyFrom(template)
        if rid:
            response.id = rid
        contents = response.raw_output_contents
        for arr in outputs.values():
            contents.append(codec.to_raw(arr))
        return response

    async def ModelInfer(self, request: Any, context: Any) -> Any:  # noqa: N802
        record = RequestRecord()      # (no body_bytes: upb's ByteSize() serializes the whole message to count it)
        return await self._call("ModelInfer", context, self._infer, request, record, record=record)

    async def ModelStreamInfer(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:  # noqa: N802
        """Each request answered in order on the stream; a failed one is an `error_message`, the stream goes on."""
        self._request_id(context)
        try:
            self._authorize(context)
        except Unauthenticated as exc:
            self.requests.labels("ModelStreamInfer", "UNAUTHENTICATED").inc()
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        async for request in request_iterator:
            t0 = time.perf_counter()
            code = grpc.StatusCode.OK
            try:
                response = await self._infer(request, RequestRecord())
                yield pb.ModelStreamInferResponse(infer_response=response)
            except asyncio.CancelledError:     # the client closed the stream while this request ran
                code = grpc.StatusCode.CANCELLED
                raise
            except Exception as exc:  # noqa: BLE001 - that request's error message; the stream goes on
                code, message = failure("ModelStreamInfer", exc)
                yield pb.ModelStreamInferResponse(error_message=message,
                                                  infer_response=pb.ModelInferResponse(id=request.id))
            finally:
                self._observe("ModelStreamInfer", code.name, time.perf_counter() - t0)


SERVICE = "inference.GRPCInferenceService"


class Health(grpc_health.aio.HealthServicer):
    """grpc.health.v1 whose Check also asks the server's readiness (worker processes: the engine and the other
    front ends), as /health does."""

    def __init__(self, state: ServerState) -> None:
        super().__init__()
        self.state = state

    async def Check(self, request: Any, context: Any) -> Any:  # noqa: N802 - the protocol's names
        if request.service in ("", SERVICE) and self.state.not_ready() is not None:
            return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.NOT_SERVING)
        return await super().Check(request, context)


class GrpcFront:
    """The started gRPC server and its health service: `stop(grace)` says NOT_SERVING first, then drains."""

    def __init__(self, server: grpc.aio.Server, health: Health) -> None:
        self.server = server
        self.health = health

    async def stop(self, grace: float | None) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)


async def start(state: ServerState, bind: str) -> GrpcFront:
    """The gRPC server on `bind` (host:port), started in the running loop."""
    from ...errors import ConfigError

    server = grpc.aio.server(options=[("grpc.max_receive_message_length", int(state.config.server.max_body_mb * 2**20)),
                                      ("grpc.max_send_message_length", int(state.config.server.max_body_mb * 2**20))])
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(KServeServicer(state), server)  # type: ignore[no-untyped-call]
    health = Health(state)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    try:
        port = server.add_insecure_port(bind)
    except RuntimeError as exc:
        raise ConfigError(f"cannot listen for gRPC on {bind}: {exc} (server.grpc_bind)") from None
    if port == 0:
        raise ConfigError(f"cannot listen for gRPC on {bind} (server.grpc_bind)")
    await server.start()
    for service in ("", SERVICE):
        await health.set(service, health_pb2.HealthCheckResponse.SERVING)
    return GrpcFront(server, health)
