"""The HTTP API as data: msgspec Structs of the request and response bodies every family shares, and the table that
ties routes to them. Each family keeps its own bodies and its rows of the table (`OPS`) in its routes module, and
`all_ops()` joins them through the registry. A request body is decoded once into its Struct (`routes/common.begin`),
and `/openapi.json` (and `rsinfer openapi`) is generated from the same Structs; a test checks that every route the
app registers is in the table, so the document and the server cannot drift apart.

msgspec, not pydantic: it decodes these bodies 2.5-8x faster than the hand-written reader it replaced, where
pydantic was up to 2.8x slower (benchmarks/parsing.py). Optional fields are `T | None = None` (a client's explicit
null means "the default", as before) and the route applies the default. Unknown fields are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, cast

from msgspec import UNSET, Meta, Struct, UnsetType

# OpenAI's untagged `input`: a string, strings, token ids or lists of token ids. msgspec takes one list type per
# union, so the items are checked by hand after decoding (request.text_or_token_input).
Inputs = Annotated[str | list[str | int | list[int]], Meta(description="A string, strings, token ids, or lists of "
                                                                          "token ids")]
Model = Annotated[str | None, Meta(description="Model name (default: the kind's default model)")]
PositiveInt = Annotated[int, Meta(ge=1)]
NonNegativeInt = Annotated[int, Meta(ge=0)]
Probability = Annotated[float, Meta(ge=0, le=1)]
Direction = Literal["right", "left", "Right", "Left"]
Texts = Annotated[str | list[str], Meta(description="A text or texts")]
PromptName = Annotated[str | None, Meta(description="A prompt of the model (sentence-transformers' `prompts`, e.g. "
                                                    "query); default: the model's default prompt")]
PromptText = Annotated[str | None, Meta(description="Text put before each input instead of a named prompt "
                                                    "(sentence-transformers' `prompt`; \"\" for none)")]


class Request(Struct, kw_only=True):
    """A request body; unknown fields are ignored."""


class TextOptions(Request):
    """How texts are read, as TEI's routes and Hugging Face's task parameters name it: truncation and the prompt
    (the fields of each family's request that carries them)."""

    truncate: bool | None = None
    truncation_direction: Direction | None = None
    prompt_name: PromptName = None


class Response(Struct, kw_only=True):
    """A response body: the routes build these and `json_response` encodes them (numpy arrays inside are written by
    orjson: jsonio.encode), so what a route answers is what /openapi.json documents."""


# ---------------------------------------------------------------- errors and common parts


class OpenAIErrorDetail(Response):
    message: str
    type: str
    param: str | None
    code: int


class OpenAIError(Response):
    error: OpenAIErrorDetail


class KServeError(Response):
    error: str


class Usage(Response):
    prompt_tokens: int
    total_tokens: int


class ApiVersion(Response):
    """Cohere's `meta.api_version`."""

    version: str


# ---------------------------------------------------------------- embeddings
class SentencePair(Struct):
    source_sentence: str
    sentences: list[str]


# ---------------------------------------------------------------- Hugging Face Inference API


class HfRequest(Request):
    inputs: str | list[str | int | list[int]] | SentencePair
    parameters: dict[str, Any] | None = None
    normalize: bool | None = None
    truncate: bool | None = None
    truncation_direction: str | None = None
    prompt_name: str | None = None        # feature-extraction: a prompt of the model
    prompt: str | None = None             # feature-extraction: text put before each input instead
    dimensions: Annotated[int, Meta(ge=1)] | None = None   # feature-extraction: keep the first N dimensions


# ---------------------------------------------------------------- operations


class Health(Response):
    status: Literal["ok"]
    models_loaded: int                        # every model (each version its own) loaded and checked
    redis_connected: bool | None = None       # the Redis row cache answers; null without one
    cache: Literal["ok", "unavailable"] | UnsetType = UNSET   # absent without a cache


class NotReady(Response):
    status: Literal["unavailable"]
    reason: str


class Info(Response):
    """TEI's `/info` for the one model (or the default embedding / rerank model)."""

    model_id: str
    model_sha: str | None
    model_dtype: str
    kind: str
    model_type: dict[str, dict[str, Any]]
    max_input_length: int | None
    max_concurrent_requests: int
    max_batch_tokens: int
    max_batch_requests: None
    max_client_batch_size: int
    max_batch_rows: int
    auto_truncate: bool
    tokenization_workers: int
    version: str


class ModelList(Response):
    object: Literal["list"]
    data: list[dict[str, Any]]


# ---------------------------------------------------------------- the route table


@dataclass(frozen=True)
class Op:
    paths: tuple[str, ...]
    method: str
    summary: str
    tag: str
    request: type[Struct] | None = None
    response: Any = None              # a model, a list[...] type, or "text" / "empty"
    errors: str = "openai"            # or "kserve"
    open: bool = False                # no API key needed
    more: tuple[tuple[str, str], ...] = ()   # error statuses of this route beside the common ones: (status, why)


OPS: tuple[Op, ...] = (
    Op(("/health",), "GET", "Ready once every model is loaded", "operations", response=Health, open=True),
    Op(("/health",), "POST", "Ready once every model is loaded", "operations", response=Health, open=True),
    Op(("/v1/models",), "GET", "The served models: kind, source, pipeline, versions", "operations",
       response=ModelList),
    Op(("/metrics",), "GET", "Prometheus metrics", "operations", response="text"),
    Op(("/openapi.json",), "GET", "This document (OpenAPI 3.1)", "operations", response=dict[str, Any], open=True),
    Op(("/docs",), "GET", "The API reference in a browser (no CDN: assets ship with rsinfer)", "operations",
       response="html", open=True),
    Op(("/info", "/models/{name}/info"), "GET", "TEI: the model (the one the path names), its kind and limits",
       "operations", response=Info),
    Op(("/models/{name}/health",), "GET", "One model's health under its per-model base URL (huggingface_hub's "
       "health_check): 200 while it serves, 503 while not loaded", "operations", response=Health),
    Op(("/models/{name}",), "POST", "Hugging Face Inference API: the task of the model's kind", "huggingface",
       HfRequest, Any),
    Op(("/",), "POST", "Hugging Face Inference API for the one model of a single-model config", "huggingface",
       HfRequest, Any),
)


def all_ops() -> tuple[Op, ...]:
    """The whole route table: the operations and Hugging Face routes above, and every family's own (`OPS` in its
    routes module, declared in the registry)."""
    from .. import families

    ops = families.all_ops()
    for op in ops:
        if not isinstance(op, Op):
            raise TypeError(f"a family's OPS holds a {type(op).__name__}, not a server.schemas.Op: {op!r}")
    return OPS + cast("tuple[Op, ...]", ops)
