"""Rerank and score: rs-infer/Jina/Cohere v1 (`/v1/rerank`, `/rerank`), TEI (`/rerank` with `texts`),
Cohere v2 (`/v2/rerank`) and vLLM (`/v1/score`)."""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from aiohttp import web
from msgspec import Meta

from ...errors import InputError, PayloadTooLarge
from ...pipelines.rerank import Reranker, ScoreResult, ranked
from ..errors import RequestValidationError
from ..schemas import ApiVersion, Direction, Model, NonNegativeInt, Op, PositiveInt, Request, Response, Usage
from .common import Call, begin, check_chars, json_response, truncation_direction, truncation_headers, usage

# ---------------------------------------------------------------- request and response bodies


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


class RerankResult(Response, omit_defaults=True, kw_only=True):
    index: int
    document: Annotated[dict[str, Any] | None, Meta(description="With return_documents: {text} or the record")] = None
    relevance_score: float


class RerankResponse(Response):
    id: str
    model: str
    results: list[RerankResult]
    usage: Usage


class TeiRankItem(Response, omit_defaults=True):
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


class BilledUnits(Response):
    search_units: int


class Tokens(Response):
    input_tokens: int
    output_tokens: int


class CohereMeta(Response):
    api_version: ApiVersion
    billed_units: BilledUnits
    tokens: Tokens


class CohereV2RerankResponse(Response):
    id: str
    results: list[RerankResult]
    meta: CohereMeta


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


OPS: tuple[Op, ...] = (   # the route table of this family (server/schemas.py), for /openapi.json
    Op(("/v1/rerank", "/rerank", "/models/{name}/rerank"), "POST",
       "Rerank (Cohere v1 / Jina; TEI's shape with `texts`)", "rerank",
       RerankRequest, RerankResponse | list[TeiRankItem]),
    Op(("/v2/rerank",), "POST", "Cohere v2 rerank", "rerank", CohereV2RerankRequest, CohereV2RerankResponse),
    Op(("/v1/score", "/score"), "POST", "vLLM score: 1:1, 1:N or N:N pairs", "rerank", ScoreRequest,
       ScoreResponse),
)


routes = web.RouteTableDef()
QUERY = "where is my refund"
BENCH = {
    "/v1/rerank": lambda texts: {"query": QUERY, "documents": texts},
    "/rerank": lambda texts: {"query": QUERY, "documents": texts},
    "/v2/rerank": lambda texts: {"query": QUERY, "documents": texts},
    "/v1/score": lambda texts: {"text_1": QUERY, "text_2": texts},
    "/score": lambda texts: {"text_1": QUERY, "text_2": texts},
}


def check_documents(n: int, key: str, max_docs: int) -> None:
    """The rerank rule for how many documents one request may score, on every route that reaches a rerank model
    (the Hugging Face `/models/{name}` one too): not none, at most the model's `max_rerank_documents` (else 413)."""
    if not n:
        raise InputError(f"`{key}` is empty", param=key)
    if n > max_docs:
        raise PayloadTooLarge(f"`{key}` has {n} documents; at most {max_docs} per request "
                              "(max_rerank_documents)", param=key)


def _documents(raw: list[Any] | None, rank_fields: list[str] | None, key: str,
               max_docs: int) -> tuple[list[str], list[Any]]:
    """Texts to score and what to echo back: strings, or objects with `text` (other fields echoed), or objects
    ranked on `rank_fields` (Cohere)."""
    if raw is None:
        raise RequestValidationError(f"`{key}` is required", param=key)
    check_documents(len(raw), key, max_docs)
    texts: list[str] = []
    for i, doc in enumerate(raw):
        if isinstance(doc, str):
            texts.append(doc)
        elif isinstance(doc, dict):
            if rank_fields:
                texts.append("\n".join(f"{f}: {doc[f]}" for f in rank_fields if f in doc))
            elif isinstance(doc.get("text"), str):
                texts.append(doc["text"])
            else:
                raise RequestValidationError(f"`{key}[{i}]` needs a string `text` field", param=f"{key}[{i}]")
        else:
            raise RequestValidationError(f"`{key}[{i}]` must be a string or an object with `text`",
                                         param=f"{key}[{i}]")
    return texts, raw


def _top_n(top_n: int | None, n: int) -> int:
    return n if top_n is None else top_n  # >= 0: the schema says so


def _echo(doc: Any) -> Any:
    return {"text": doc} if isinstance(doc, str) else doc


async def _score(call: Call[Any], query: str, texts: list[str], *, raw: bool = False,
                 max_tokens_per_doc: int | None = None, direction: str = "right",
                 truncate: bool | None = None) -> ScoreResult:
    check_chars(call, "query", query)
    check_chars(call, "documents", texts)
    return await call.infer(call.pipeline(Reranker).plan_rerank, query, texts, raw=raw, truncate=truncate,
                            direction=direction, max_tokens_per_doc=max_tokens_per_doc)


@routes.post("/v1/rerank")
@routes.post("/rerank")
@routes.post("/models/{name}/rerank")
async def rerank(request: web.Request) -> web.Response:
    call = await begin(request, "rerank", RerankRequest)
    req, model = call.req, call.model
    max_docs = call.pipeline(Reranker).max_documents
    if req.texts is not None and req.documents is None:
        return await _tei_rerank(call, max_docs)
    texts, docs = _documents(req.documents, req.rank_fields, "documents", max_docs)
    top_n = _top_n(req.top_n, len(texts))
    return_documents = req.return_documents is not False
    result = await _score(call, req.query, texts, truncate=req.truncate)
    results = [RerankResult(index=i, document=_echo(docs[i]) if return_documents else None,
                            relevance_score=float(result.scores[i])) for i in ranked(result.scores, top_n)]
    return json_response(RerankResponse(id=str(uuid.uuid4()), model=model.name, results=results,
                                        usage=usage(result.tokens)), truncation_headers(result.truncated))


async def _tei_rerank(call: Call[RerankRequest], max_docs: int) -> web.Response:
    req = call.req
    texts = req.texts or []
    if not texts:
        raise InputError("`texts` cannot be empty", param="texts")
    if len(texts) > max_docs:
        raise PayloadTooLarge(f"`texts` has {len(texts)} documents; at most {max_docs} per request "
                              "(max_rerank_documents)", param="texts")
    direction = truncation_direction(req.truncation_direction)
    return_text = bool(req.return_text)
    result = await _score(call, req.query, texts, raw=bool(req.raw_scores), direction=direction,
                          truncate=req.truncate)
    # top_n: the request field every rerank shape here takes (TEI's own shape has none; ignoring it was silent)
    out = [TeiRankItem(index=i, score=float(result.scores[i]), text=texts[i] if return_text else None)
           for i in ranked(result.scores, _top_n(req.top_n, len(texts)))]
    return json_response(out, truncation_headers(result.truncated))


@routes.post("/v2/rerank")
async def cohere_v2_rerank(request: web.Request) -> web.Response:
    call = await begin(request, "rerank", CohereV2RerankRequest)
    req = call.req
    texts, docs = _documents(req.documents, req.rank_fields, "documents",
                             call.pipeline(Reranker).max_documents)
    top_n = _top_n(req.top_n, len(texts))
    result = await _score(call, req.query, texts, max_tokens_per_doc=req.max_tokens_per_doc)
    results = [RerankResult(index=i, relevance_score=float(result.scores[i]),    # documents: earlier v2 clients
                            document=_echo(docs[i]) if req.return_documents else None)
               for i in ranked(result.scores, top_n)]
    meta = CohereMeta(api_version=ApiVersion(version="2"), billed_units=BilledUnits(search_units=1),
                      tokens=Tokens(input_tokens=result.tokens, output_tokens=0))
    return json_response(CohereV2RerankResponse(id=str(uuid.uuid4()), results=results, meta=meta),
                         truncation_headers(result.truncated))


SCORE_KEYS = (("text_1", "text_2"), ("queries", "documents"), ("queries", "items"), ("data_1", "data_2"))


@routes.post("/v1/score")
@routes.post("/score")
async def vllm_score(request: web.Request) -> web.Response:
    call = await begin(request, "rerank", ScoreRequest)
    req, model, limit = call.req, call.model, call.pipeline(Reranker).max_documents
    left_key, right_key = next((k for k in SCORE_KEYS if getattr(req, k[0]) is not None and
                                getattr(req, k[1]) is not None), SCORE_KEYS[0])
    left, right = getattr(req, left_key), getattr(req, right_key)
    for key, value in ((left_key, left), (right_key, right)):
        if value is None:
            raise RequestValidationError(f"`{key}` is required", param=key)
    lefts = [left] if isinstance(left, str) else left
    rights = [right] if isinstance(right, str) else right
    if not lefts or not rights:
        raise InputError(f"`{left_key}` and `{right_key}` must not be empty",
                         param=left_key if not lefts else right_key)
    if len(lefts) == 1:
        lefts = lefts * len(rights)
    elif len(lefts) != len(rights):
        raise InputError(f"input lengths must be 1:1, 1:N or N:N; got {len(lefts)}:{len(rights)}", param=right_key)
    if len(rights) > limit:
        raise PayloadTooLarge(f"`{right_key}` has {len(rights)} texts; at most {limit} per request", param=right_key)
    check_chars(call, left_key, lefts)
    check_chars(call, right_key, rights)
    result = await call.infer(call.pipeline(Reranker).plan_pairs, lefts, rights, truncate=req.truncate,
                              param=right_key)
    data = [ScoreItem(index=i, object="score", score=float(s)) for i, s in enumerate(result.scores)]
    return json_response(ScoreResponse(id=f"score-{uuid.uuid4().hex}", object="list", created=int(time.time()),
                                       model=model.name, data=data, usage=usage(result.tokens)),
                         truncation_headers(result.truncated))


async def hf_task(call: Call[Any], inputs: Any, params: dict[str, Any]) -> web.Response:
    """The Hugging Face Inference API for a rerank model: sentence-similarity, {source_sentence, sentences} →
    relevance scores in the sentences' order."""
    from ..schemas import SentencePair

    if not isinstance(inputs, SentencePair):
        raise RequestValidationError("a rerank model answers sentence-similarity: `inputs` must be "
                                     "{\"source_sentence\", \"sentences\"}", param="inputs")
    return await sentence_similarity(call, inputs)


async def sentence_similarity(call: Call[Any], inputs: Any, truncate: bool | None = None,
                              direction: str = "right") -> web.Response:
    """The Hugging Face sentence-similarity task on any Reranker (a cross-encoder, ColBERT's MaxSim, M3's
    m3_score): the source's score with each sentence, in the sentences' order, within max_documents."""
    pipe = call.pipeline(Reranker)
    source, sentences = inputs.source_sentence, inputs.sentences
    check_documents(len(sentences), "inputs.sentences", pipe.max_documents)
    check_chars(call, "inputs", [source, *sentences])
    scores = await call.infer(pipe.plan_rerank, source, sentences, truncate=truncate, direction=direction)
    return json_response([float(s) for s in scores.scores], truncation_headers(scores.truncated))
