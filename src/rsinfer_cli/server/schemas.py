"""The HTTP API as data: pydantic models of every request and response body, and the table that ties them to the
routes. `/openapi.json` (and `rsinfer openapi`) is generated from it; a test checks that every route the app
registers is in the table, so the document and the server cannot drift apart."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Inputs = str | list[str] | list[int] | list[list[int]]


class Strict(BaseModel):
    model_config = ConfigDict(extra="allow")  # clients send fields we do not use; they are ignored


# ---------------------------------------------------------------- errors and common parts


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: int


class OpenAIError(BaseModel):
    error: OpenAIErrorDetail


class KServeError(BaseModel):
    error: str


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


# ---------------------------------------------------------------- embeddings


class EmbeddingsRequest(Strict):
    input: Inputs = Field(description="A string, strings, token ids, or lists of token ids")
    model: str | None = Field(None, description="Model name (default: the default embedding model)")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1, description="Keep the first N dimensions, re-normalised")
    truncate: bool | None = None


class EmbeddingItem(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str


class EmbeddingsResponse(BaseModel):
    object: Literal["list"]
    data: list[EmbeddingItem]
    model: str
    usage: Usage


class TeiEmbedRequest(Strict):
    inputs: Inputs
    normalize: bool | None = None
    truncate: bool | None = None
    truncation_direction: Literal["right", "left", "Right", "Left"] = "right"
    dimensions: int | None = Field(None, ge=1)


class CohereEmbedRequest(Strict):
    texts: list[str]
    model: str | None = None
    input_type: Literal["search_document", "search_query", "classification", "clustering"] | None = None
    embedding_types: list[Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]] | None = None
    truncate: Literal["NONE", "START", "END"] = "END"
    output_dimension: int | None = Field(None, ge=1)


class CohereEmbedResponse(BaseModel):
    id: str
    response_type: Literal["embeddings_floats", "embeddings_by_type"]
    embeddings: list[list[float]] | dict[str, list[Any]]
    texts: list[str]
    meta: dict[str, Any]


class TokenizeRequest(Strict):
    inputs: str | list[str]
    add_special_tokens: bool = True


class Token(BaseModel):
    id: int
    text: str
    special: bool
    start: int
    stop: int


class DecodeRequest(Strict):
    ids: list[int] | list[list[int]]
    skip_special_tokens: bool = True


class SentencePair(BaseModel):
    source_sentence: str
    sentences: list[str]


class SimilarityRequest(Strict):
    inputs: SentencePair


# ---------------------------------------------------------------- rerank


class Document(BaseModel):
    model_config = ConfigDict(extra="allow")
    text: str


class RerankRequest(Strict):
    query: str
    documents: list[str | Document | dict[str, Any]] = Field(description="Strings, {text} objects, or objects "
                                                                          "ranked on `rank_fields`")
    model: str | None = None
    top_n: int | None = Field(None, ge=0)
    return_documents: bool = True
    rank_fields: list[str] | None = None
    truncate: bool | None = None


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: dict[str, Any] | None = None


class RerankResponse(BaseModel):
    id: str
    model: str
    results: list[RerankResult]
    usage: Usage


class TeiRerankRequest(Strict):
    query: str
    texts: list[str]
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool | None = None
    truncation_direction: Literal["right", "left", "Right", "Left"] = "right"


class CohereV2RerankRequest(Strict):
    query: str
    documents: list[str | Document | dict[str, Any]]
    model: str | None = None
    top_n: int | None = Field(None, ge=0)
    max_tokens_per_doc: int | None = Field(None, ge=1)


class CohereV2RerankResponse(BaseModel):
    id: str
    results: list[RerankResult]
    meta: dict[str, Any]


class ScoreRequest(Strict):
    text_1: str | list[str]
    text_2: str | list[str]
    model: str | None = None
    truncate: bool | None = None


class ScoreItem(BaseModel):
    index: int
    object: Literal["score"]
    score: float


class ScoreResponse(BaseModel):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[ScoreItem]
    usage: Usage


# ---------------------------------------------------------------- PII


class PiiRequest(Strict):
    text: str | None = Field(None, description="One text (or `texts`)")
    texts: list[str] | None = None
    model: str | None = None
    threshold: float | None = Field(None, ge=0, le=1)
    types: list[str] | None = Field(None, description="Entity types to keep; unknown types are a 400")


class RedactRequest(PiiRequest):
    mode: Literal["mask", "remove", "replace", "hash", ""] = "mask"
    mask_char: str = Field("*", min_length=1, max_length=1)
    replacement: str | None = Field(None, description="A template with {type}, e.g. <{type}>")


class Entity(BaseModel):
    entity_type: str
    text: str = Field(description="The value found (detect only; redaction never returns it)")
    score: float
    start: int
    end: int


class RedactedSpan(BaseModel):
    entity_type: str
    score: float
    start: int
    end: int
    replacement: str
    redacted_start: int
    redacted_end: int


class DetectResult(BaseModel):
    entities: list[Entity]
    text: str | None = None


class DetectResponse(BaseModel):
    object: Literal["pii.detection"]
    model: str
    results: list[DetectResult]
    usage: Usage


class RedactResult(BaseModel):
    text: str
    entities: list[RedactedSpan]


class RedactResponse(BaseModel):
    object: Literal["pii.redaction"]
    model: str
    results: list[RedactResult]
    usage: Usage


# ---------------------------------------------------------------- classification


class ZeroShotRequest(Strict):
    input: str | list[str]
    candidate_labels: list[str]
    model: str | None = None
    multi_label: bool = False
    hypothesis_template: str | None = Field(None, description="With {label} or {}")
    truncate: bool | None = None


class ZeroShotResponse(BaseModel):
    object: Literal["classification", "classification.list"]
    model: str
    labels: list[str] | None = None
    scores: list[float] | None = None
    results: list[dict[str, Any]] | None = None
    usage: Usage


class TrueFalseRequest(Strict):
    input: str | list[str]
    question: str | None = None
    assertion: str | None = None
    model: str | None = None
    threshold: float = Field(0.5, ge=0, le=1)
    truncate: bool | None = None


class TrueFalseResponse(BaseModel):
    model_config = ConfigDict(extra="allow")
    object: Literal["classification.true_false", "classification.true_false.list"]
    model: str
    usage: Usage


# ---------------------------------------------------------------- Hugging Face Inference API


class HfRequest(Strict):
    inputs: str | list[str] | SentencePair | list[int] | list[list[int]]
    parameters: dict[str, Any] | None = None
    normalize: bool | None = None
    truncate: bool | None = None
    truncation_direction: str | None = None


# ---------------------------------------------------------------- tensors (KServe v2, inferstack)


class KServeTensor(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    datatype: Literal["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16",
                      "FP32", "FP64", "BYTES", "BF16"]
    shape: list[int]
    parameters: dict[str, Any] | None = None
    data: list[Any] | None = None


class KServeOutputRequest(BaseModel):
    name: str
    parameters: dict[str, Any] | None = None


class KServeInferRequest(Strict):
    id: str | None = None
    parameters: dict[str, Any] | None = None
    inputs: list[KServeTensor]
    outputs: list[KServeOutputRequest] | None = None


class KServeInferResponse(BaseModel):
    model_name: str
    model_version: str | None = None
    id: str | None = None
    outputs: list[KServeTensor]


class KServeTensorMeta(BaseModel):
    name: str
    datatype: str
    shape: list[int]


class KServeModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[KServeTensorMeta]
    outputs: list[KServeTensorMeta]


class KServeServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class InferstackRequest(Strict):
    input: list[Any] | None = Field(None, description="Rows for the model's one input (legacy)")
    inputs: dict[str, list[Any]] | None = Field(None, description="Tensors by input name")
    model: str | None = None
    model_version: str | int | None = None


class InferstackResponse(BaseModel):
    output: list[Any]
    outputs: dict[str, Any] | list[dict[str, Any]]
    model_version: str


# ---------------------------------------------------------------- operations


class Health(BaseModel):
    status: Literal["ok"]
    cache: Literal["ok", "unavailable"] | None = None


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[dict[str, Any]]


# ---------------------------------------------------------------- the route table


@dataclass(frozen=True)
class Op:
    paths: tuple[str, ...]
    method: str
    summary: str
    tag: str
    request: type[BaseModel] | None = None
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
       RerankRequest, RerankResponse),
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
