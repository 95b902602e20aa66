"""Rerank and score: rs-infer/Jina/Cohere v1 (`/v1/rerank`, `/rerank`), TEI (`/rerank` with `texts`),
Cohere v2 (`/v2/rerank`) and vLLM (`/v1/score`)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from aiohttp import web

from ...errors import InputError, PayloadTooLarge
from ...pipelines.rerank import RerankPipeline, ScoreResult, ranked
from ..errors import RequestValidationError
from ..request import Body
from .common import Call, begin, check_chars, json_response, truncation_direction, truncation_headers, usage

routes = web.RouteTableDef()
QUERY = "where is my refund"
BENCH = {
    "/v1/rerank": lambda texts: {"query": QUERY, "documents": texts},
    "/rerank": lambda texts: {"query": QUERY, "documents": texts},
    "/v2/rerank": lambda texts: {"query": QUERY, "documents": texts},
    "/v1/score": lambda texts: {"text_1": QUERY, "text_2": texts},
    "/score": lambda texts: {"text_1": QUERY, "text_2": texts},
}


def _documents(body: Body, key: str, max_docs: int) -> tuple[list[str], list[Any]]:
    """Texts to score and what to echo back: strings, or objects with `text` (other fields echoed), or objects
    ranked on `rank_fields` (Cohere)."""
    raw = body.data.get(key)
    if raw is None:
        raise RequestValidationError(f"`{key}` is required", param=key)
    if not isinstance(raw, list):
        raise RequestValidationError(f"`{key}` must be an array of strings or {{\"text\": ...}} objects", param=key)
    if not raw:
        raise InputError(f"`{key}` is empty", param=key)
    if len(raw) > max_docs:
        raise PayloadTooLarge(f"`{key}` has {len(raw)} documents; at most {max_docs} per request "
                              "(server.max_rerank_documents)", param=key)
    rank_fields = body.str_list("rank_fields", None)
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


def _top_n(body: Body, n: int) -> int:
    top_n = body.int("top_n", None)
    if top_n is None:
        return n
    if top_n < 0:
        raise InputError(f"`top_n` must be >= 0, got {top_n}", param="top_n")
    return top_n


def _echo(doc: Any) -> Any:
    return {"text": doc} if isinstance(doc, str) else doc


async def _score(call: Call, texts: list[str], *, raw: bool = False, max_tokens_per_doc: int | None = None,
                 direction: str = "right") -> ScoreResult:
    body = call.body
    query = body.str("query")
    check_chars(call, "query", query)
    check_chars(call, "documents", texts)
    return await call.infer(call.pipeline(RerankPipeline).plan_rerank, query, texts, raw=raw,
                            truncate=body.bool("truncate", None), direction=direction,
                            max_tokens_per_doc=max_tokens_per_doc)


@routes.post("/v1/rerank")
@routes.post("/rerank")
async def rerank(request: web.Request) -> web.Response:
    call = await begin(request, "rerank")
    body, model = call.body, call.model
    max_docs = call.state.config.server.max_rerank_documents
    if "texts" in body.data and "documents" not in body.data:
        return await _tei_rerank(call, max_docs)
    texts, docs = _documents(body, "documents", max_docs)
    top_n = _top_n(body, len(texts))
    return_documents = body.bool("return_documents", True)
    result = await _score(call, texts)
    results = []
    for i in ranked(result.scores, top_n):
        item: dict[str, Any] = {"index": i}
        if return_documents:
            item["document"] = _echo(docs[i])
        item["relevance_score"] = float(result.scores[i])
        results.append(item)
    return json_response({"id": str(uuid.uuid4()), "model": model.name, "results": results,
                          "usage": usage(result.tokens)},
                         truncation_headers(result.truncated))


async def _tei_rerank(call: Call, max_docs: int) -> web.Response:
    body = call.body
    texts = body.str_list("texts")
    if not texts:
        raise InputError("`texts` cannot be empty", param="texts")
    if len(texts) > max_docs:
        raise PayloadTooLarge(f"`texts` has {len(texts)} documents; at most {max_docs} per request "
                              "(server.max_rerank_documents)", param="texts")
    direction = truncation_direction(body)
    return_text = body.bool("return_text", False)
    result = await _score(call, texts, raw=body.bool("raw_scores", False), direction=direction)
    out = []
    for i in ranked(result.scores):
        item: dict[str, Any] = {"index": i, "score": float(result.scores[i])}
        if return_text:
            item["text"] = texts[i]
        out.append(item)
    return json_response(out, truncation_headers(result.truncated))


@routes.post("/v2/rerank")
async def cohere_v2_rerank(request: web.Request) -> web.Response:
    call = await begin(request, "rerank")
    body = call.body
    texts, docs = _documents(body, "documents", call.state.config.server.max_rerank_documents)
    top_n = _top_n(body, len(texts))
    max_tokens = body.int("max_tokens_per_doc", None)
    if max_tokens is not None and max_tokens < 1:
        raise InputError(f"`max_tokens_per_doc` must be >= 1, got {max_tokens}", param="max_tokens_per_doc")
    result = await _score(call, texts, max_tokens_per_doc=max_tokens)
    results = [{"index": i, "relevance_score": float(result.scores[i])} for i in ranked(result.scores, top_n)]
    if body.bool("return_documents", False):  # earlier v2 clients
        for r in results:
            r["document"] = _echo(docs[r["index"]])
    meta = {"api_version": {"version": "2"}, "billed_units": {"search_units": 1},
            "tokens": {"input_tokens": result.tokens, "output_tokens": 0}}
    return json_response({"id": str(uuid.uuid4()), "results": results, "meta": meta},
                         truncation_headers(result.truncated))


SCORE_KEYS = (("text_1", "text_2"), ("queries", "documents"), ("queries", "items"), ("data_1", "data_2"))


@routes.post("/v1/score")
@routes.post("/score")
async def vllm_score(request: web.Request) -> web.Response:
    call = await begin(request, "rerank")
    body, model, limit = call.body, call.model, call.state.config.server.max_rerank_documents
    left_key, right_key = next((k for k in SCORE_KEYS if k[0] in body.data), SCORE_KEYS[0])
    left = body.str_list(left_key, allow_str=True)
    right = body.str_list(right_key, allow_str=True)
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
    result = await call.infer(call.pipeline(RerankPipeline).plan_pairs, lefts, rights,
                              truncate=body.bool("truncate", None), param=right_key)
    data = [{"index": i, "object": "score", "score": float(s)} for i, s in enumerate(result.scores)]
    return json_response({"id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                          "model": model.name, "data": data,
                          "usage": usage(result.tokens)},
                         truncation_headers(result.truncated))
