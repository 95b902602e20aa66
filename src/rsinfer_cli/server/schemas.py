"""The HTTP API as data: msgspec Structs of every request and response body, and the table that ties them to the
routes. A request body is decoded once into its Struct (`routes/common.begin`), and `/openapi.json` (and `rsinfer
openapi`) is generated from the same Structs; a test checks that every route the app registers is in the table, so
the document and the server cannot drift apart.

msgspec, not pydantic: it decodes these bodies 2.5-8x faster than the hand-written reader it replaced, where pydantic
was up to 2.8x slower (benchmarks/parsing.py). Optional fields are `T | None = None` (a client's explicit null means
"the default", as before) and the route applies the default. Unknown fields are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

# OpenAI's untagged `input`: a string, strings, token ids or lists of token ids. msgspec takes one list type per
# union, so the items are checked by hand after decoding (request.text_or_token_input).
Inputs = Annotated[str | list[str | int | list[int]], Meta(description="A string, strings, token ids, or lists of "
                                                                          "token ids")]
Model = Annotated[str | None, Meta(description="Model name (default: the kind's default model)")]
PositiveInt = Annotated[int, Meta(ge=1)]
NonNegativeInt = Annotated[int, Meta(ge=0)]
Probability = Annotated[float, Meta(ge=0, le=1)]
Direction = Literal["right", "left", "Right", "Left"]


class Request(Struct, kw_only=True):
    """A request body; unknown fields are ignored."""


class Response(Struct, kw_only=True):
    """A response body (documented; the routes build them as dicts)."""


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


# ---------------------------------------------------------------- embeddings


class EmbeddingsRequest(Request):
    input: Inputs
    model: Model = None
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Annotated[PositiveInt | None, Meta(description="Keep the first N dimensions, re-normalised")] = None
    truncate: bool | None = None


class EmbeddingItem(Response):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str


class EmbeddingsResponse(Response):
    object: Literal["list"]
    data: list[EmbeddingItem]
    model: str
    usage: Usage


class TeiEmbedRequest(Request):
    inputs: Inputs
    normalize: bool | None = None
    truncate: bool | None = None
    truncation_direction: Direction | None = None
    dimensions: PositiveInt | None = None


class CohereEmbedRequest(Request):
    texts: list[str]
    model: Model = None
    input_type: Literal["search_document", "search_query", "classification", "clustering"] | None = None
    embedding_types: list[Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]] | None = None
    truncate: Literal["NONE", "START", "END", "none", "start", "end"] | None = None
    output_dimension: PositiveInt | None = None


class CohereEmbedResponse(Response):
    id: str
    response_type: Literal["embeddings_floats", "embeddings_by_type"]
    embeddings: list[list[float]] | dict[str, list[Any]]
    texts: list[str]
    meta: dict[str, Any]


class TokenizeRequest(Request):
    inputs: str | list[str]
    add_special_tokens: bool | None = None


class Token(Response):
    id: int
    text: str
    special: bool
    start: int
    stop: int


class DecodeRequest(Request):
    ids: list[int | list[int]]
    skip_special_tokens: bool | None = None


class SentencePair(Struct):
    source_sentence: str
    sentences: list[str]


class SimilarityRequest(Request):
    inputs: SentencePair


# ---------------------------------------------------------------- rerank

Documents = Annotated[list[str | dict[str, Any]], Meta(description="Strings, {text} objects, or objects ranked on "
                                                                    "`rank_fields`")]


class RerankRequest(Request):
    """Cohere v1 / Jina `documents`, or TEI's `texts` (with `raw_scores`, `return_text`)."""

    query: str
    documents: Documents | None = None
    texts: list[str] | None = None
    model: Model = None
    top_n: NonNegativeInt | None = None
    return_documents: bool | None = None
    rank_fields: list[str] | None = None
    truncate: bool | None = None
    raw_scores: bool | None = None
    return_text: bool | None = None
    truncation_direction: Direction | None = None


class RerankResult(Response):
    index: int
    relevance_score: float
    document: dict[str, Any] | None = None


class RerankResponse(Response):
    id: str
    model: str
    results: list[RerankResult]
    usage: Usage


class TeiRankItem(Response):
    index: int
    score: float
    text: str | None = None


class CohereV2RerankRequest(Request):
    query: str
    documents: Documents
    model: Model = None
    top_n: NonNegativeInt | None = None
    max_tokens_per_doc: PositiveInt | None = None
    return_documents: bool | None = None
    rank_fields: list[str] | None = None


class CohereV2RerankResponse(Response):
    id: str
    results: list[RerankResult]
    meta: dict[str, Any]


TextOrTexts = str | list[str]


class ScoreRequest(Request):
    """vLLM: `text_1`/`text_2` (or `queries` with `documents` or `items`, or `data_1`/`data_2`)."""

    text_1: TextOrTexts | None = None
    text_2: TextOrTexts | None = None
    queries: TextOrTexts | None = None
    documents: TextOrTexts | None = None
    items: TextOrTexts | None = None
    data_1: TextOrTexts | None = None
    data_2: TextOrTexts | None = None
    model: Model = None
    truncate: bool | None = None


class ScoreItem(Response):
    index: int
    object: Literal["score"]
    score: float


class ScoreResponse(Response):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[ScoreItem]
    usage: Usage


# ---------------------------------------------------------------- PII


class PiiRequest(Request):
    text: Annotated[str | None, Meta(description="One text (or `texts`)")] = None
    texts: list[str] | None = None
    model: Model = None
    threshold: Probability | None = None
    types: Annotated[list[str] | None, Meta(description="Entity types to keep; unknown types are a 400")] = None


class RedactRequest(PiiRequest):
    mode: Literal["mask", "remove", "replace", "hash", ""] | None = None
    mask_char: Annotated[str, Meta(min_length=1, max_length=1)] | None = None
    replacement: Annotated[str | None, Meta(description="A template with {type}, e.g. <{type}>")] = None


class Entity(Response):
    entity_type: str
    text: Annotated[str, Meta(description="The value found (detect only; redaction never returns it)")]
    score: float
    start: int
    end: int


class RedactedSpan(Response):
    entity_type: str
    score: float
    start: int
    end: int
    replacement: str
    redacted_start: int
    redacted_end: int


class DetectResult(Response):
    entities: list[Entity]
    text: str | None = None


class DetectResponse(Response):
    object: Literal["pii.detection"]
    model: str
    results: list[DetectResult]
    usage: Usage


class RedactResult(Response):
    text: str
    entities: list[RedactedSpan]


class RedactResponse(Response):
    object: Literal["pii.redaction"]
    model: str
    results: list[RedactResult]
    usage: Usage


# ---------------------------------------------------------------- classification


class ZeroShotRequest(Request):
    input: str | list[str]
    candidate_labels: list[str]
    model: Model = None
    multi_label: bool | None = None
    hypothesis_template: Annotated[str | None, Meta(description="With {label} or {}")] = None
    truncate: bool | None = None


class ZeroShotResponse(Response):
    object: Literal["classification", "classification.list"]
    model: str
    usage: Usage
    labels: list[str] | None = None
    scores: list[float] | None = None
    results: list[dict[str, Any]] | None = None


class TrueFalseRequest(Request):
    input: str | list[str]
    question: str | None = None
    assertion: str | None = None
    model: Model = None
    threshold: Probability | None = None
    truncate: bool | None = None


class TrueFalseResponse(Response):
    object: Literal["classification.true_false", "classification.true_false.list"]
    model: str
    usage: Usage
    label: str | None = None
    is_true: bool | None = None
    true_probability: float | None = None
    assertion: str | None = None
    results: list[dict[str, Any]] | None = None


# ---------------------------------------------------------------- Hugging Face Inference API


class HfRequest(Request):
    inputs: str | list[str | int | list[int]] | SentencePair
    parameters: dict[str, Any] | None = None
    normalize: bool | None = None
    truncate: bool | None = None
    truncation_direction: str | None = None


# ---------------------------------------------------------------- tensors (KServe v2, inferstack)

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


class KServeInferResponse(Response):
    model_name: str
    outputs: list[KServeTensor]
    model_version: str | None = None
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


class KServeServerMetadata(Response):
    name: str
    version: str
    extensions: list[str]


class InferstackRequest(Request):
    input: Annotated[list[Any] | None, Meta(description="Rows for the model's one input (legacy)")] = None
    inputs: Annotated[dict[str, list[Any]] | None, Meta(description="Tensors by input name")] = None
    model: Model = None
    model_version: str | int | None = None


class InferstackResponse(Response):
    output: list[Any]
    outputs: dict[str, Any] | list[dict[str, Any]]
    model_version: str


# ---------------------------------------------------------------- operations


class Health(Response):
    status: Literal["ok"]
    models_loaded: int                        # every model (each version its own) loaded and checked
    redis_connected: bool | None = None       # the Redis row cache answers; null without one
    cache: Literal["ok", "unavailable"] | None = None


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


OPS: tuple[Op, ...] = (
    Op(("/health",), "GET", "Ready once every model is loaded", "operations", response=Health, open=True),
    Op(("/health",), "POST", "Ready once every model is loaded", "operations", response=Health, open=True),
    Op(("/v1/models",), "GET", "The served models: kind, source, pipeline, versions", "operations",
       response=ModelList),
    Op(("/metrics",), "GET", "Prometheus metrics", "operations", response="text"),
    Op(("/openapi.json",), "GET", "This document (OpenAPI 3.1)", "operations", response=dict[str, Any], open=True),
    Op(("/docs",), "GET", "The API reference in a browser (no CDN: assets ship with rsinfer)", "operations",
       response="html", open=True),
    Op(("/info",), "GET", "TEI: the model, its kind and limits", "operations", response=dict[str, Any]),
    Op(("/v1/embeddings",), "POST", "OpenAI / vLLM embeddings", "embedding", EmbeddingsRequest,
       EmbeddingsResponse),
    Op(("/embed",), "POST", "TEI embeddings (the default embedding model)", "embedding", TeiEmbedRequest,
       list[list[float]]),
    Op(("/v1/embed", "/v2/embed"), "POST", "Cohere embed", "embedding", CohereEmbedRequest, CohereEmbedResponse),
    Op(("/tokenize",), "POST", "TEI: tokens with offsets", "embedding", TokenizeRequest, list[list[Token]]),
    Op(("/decode",), "POST", "TEI: token ids back to text", "embedding", DecodeRequest, list[str]),
    Op(("/similarity",), "POST", "TEI: cosine similarity of sentences", "embedding", SimilarityRequest,
       list[float]),
    Op(("/v1/rerank", "/rerank"), "POST", "Rerank (Cohere v1 / Jina; TEI's shape with `texts`)", "rerank",
       RerankRequest, RerankResponse | list[TeiRankItem]),
    Op(("/v2/rerank",), "POST", "Cohere v2 rerank", "rerank", CohereV2RerankRequest, CohereV2RerankResponse),
    Op(("/v1/score", "/score"), "POST", "vLLM score: 1:1, 1:N or N:N pairs", "rerank", ScoreRequest,
       ScoreResponse),
    Op(("/pii/detect", "/v1/pii/detect"), "POST", "Find PII (returns the values)", "pii", PiiRequest,
       DetectResponse),
    Op(("/pii/redact", "/v1/pii/redact"), "POST", "Redact PII (never returns a removed value)", "pii",
       RedactRequest, RedactResponse),
    Op(("/classify/zero-shot", "/v1/classify/zero-shot"), "POST", "Zero-shot classification over NLI", "zeroshot",
       ZeroShotRequest, ZeroShotResponse),
    Op(("/classify/true-false", "/v1/classify/true-false"), "POST", "Is an assertion true of each text",
       "zeroshot", TrueFalseRequest, TrueFalseResponse),
    Op(("/models/{name}",), "POST", "Hugging Face Inference API: the task of the model's kind", "huggingface",
       HfRequest, Any),
    Op(("/",), "POST", "Hugging Face Inference API for the one model of a single-model config", "huggingface",
       HfRequest, Any),
    Op(("/v2",), "GET", "KServe v2 server metadata", "tensor", response=KServeServerMetadata, errors="kserve"),
    Op(("/v2/health/live", "/v2/health/ready"), "GET", "KServe v2 health (200 = true)", "tensor",
       response="empty", errors="kserve", open=True),
    Op(("/v2/models/{model}", "/v2/models/{model}/versions/{version}"), "GET", "KServe v2 model metadata",
       "tensor", response=KServeModelMetadata, errors="kserve"),
    Op(("/v2/models/{model}/ready", "/v2/models/{model}/versions/{version}/ready"), "GET",
       "KServe v2 model readiness (200 = ready)", "tensor", response="empty", errors="kserve"),
    Op(("/v2/models/{model}/infer", "/v2/models/{model}/versions/{version}/infer"), "POST",
       "KServe v2 inference (JSON tensors, or the binary tensor data extension)", "tensor", KServeInferRequest,
       KServeInferResponse, errors="kserve"),
    Op(("/infer",), "POST", "inferstack-rs inference", "tensor", InferstackRequest, InferstackResponse,
       errors="kserve"),
    Op(("/batch",), "POST", "inferstack-rs batch: one row per item", "tensor", InferstackRequest,
       InferstackResponse, errors="kserve"),
    Op(("/models",), "GET", "inferstack-rs: every model, its versions and their tensors", "tensor",
       response=dict[str, Any], errors="kserve"),
)
