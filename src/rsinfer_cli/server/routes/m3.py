"""BGE-M3 models (`kind: m3`): `POST /v1/embeddings/m3`, any subset of dense vectors, lexical weights and ColBERT
vectors from one forward (FlagEmbedding's `encode` with `return_dense`, `return_sparse`, `return_colbert_vecs`), and
`POST /v1/m3/score`, every score of FlagEmbedding's `compute_score` for query-passage pairs. An M3 model also
answers the embedding, sparse, token-vector and rerank routes (its family serves them), and the Hugging Face
feature-extraction (dense) and sentence-similarity (its m3_score) tasks on `POST /models/{name}`."""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

from aiohttp import web
from msgspec import UNSET, Meta, UnsetType

from ...errors import InputError
from ...pipelines.m3 import M3Pipeline
from ..errors import RequestValidationError
from ..schemas import Direction, Model, Op, Request, Response, SentencePair, TextOptions, Texts, Usage
from .common import (
    Call,
    begin,
    check_chars,
    check_count,
    hf_parameters,
    json_response,
    texts_of,
    truncation_direction,
    truncation_headers,
    usage,
)
from .rerank import sentence_similarity

# ---------------------------------------------------------------- request and response bodies


class M3Request(Request):
    """FlagEmbedding's encode, in the OpenAI embeddings envelope."""

    input: Texts
    model: Model = None
    return_dense: Annotated[bool, Meta(description="The dense vector (CLS, normalised)")] = True
    return_sparse: Annotated[bool, Meta(description="The lexical weights, by token id")] = False
    return_colbert_vecs: Annotated[bool, Meta(description="The ColBERT vectors (one per token after <s>)")] = False
    return_tokens: Annotated[bool, Meta(description=(
        "With return_sparse: also `lexical_tokens`, FlagEmbedding's convert_id_to_token (each id re-keyed by the "
        "tokenizer's decoding of it; ids that decode alike collapse)"))] = False
    truncate: bool | None = None
    truncation_direction: Direction | None = None


class M3Item(Response, omit_defaults=True):
    object: Literal["m3_embedding"]
    index: int
    dense_vecs: Annotated[list[float] | UnsetType, Meta(description="With return_dense")] = UNSET
    lexical_weights: Annotated[dict[str, float] | UnsetType, Meta(description=(
        "With return_sparse: weight by token id (decimal string keys, as FlagEmbedding)"))] = UNSET
    lexical_tokens: Annotated[dict[str, float] | UnsetType, Meta(description="With return_tokens")] = UNSET
    colbert_vecs: Annotated[list[list[float]] | UnsetType, Meta(description="With return_colbert_vecs")] = UNSET


class M3Response(Response):
    object: Literal["list"]
    data: list[M3Item]
    model: str
    usage: Usage


class M3ScoreRequest(Request):
    """FlagEmbedding's compute_score over [query, passage] pairs."""

    pairs: Annotated[list[Annotated[list[str], Meta(min_length=2, max_length=2)]], Meta(
        description="[query, passage] pairs")]
    model: Model = None
    weights: Annotated[list[float] | None, Meta(description=(
        "weights_for_different_modes [dense, sparse, colbert] (default: the model's m3_weights)"))] = None
    truncate: bool | None = None


class M3ScoreResponse(Response):
    dense: list[float]
    sparse: list[float]
    colbert: list[float]
    sparse_dense: Annotated[list[float], Meta(description="(w1*sparse + w0*dense) / (w0 + w1)")]
    colbert_sparse_dense: Annotated[list[float], Meta(description=(
        "(w2*colbert + w1*sparse + w0*dense) / (w0 + w1 + w2)"))]
    model: str
    usage: Usage


OPS: tuple[Op, ...] = (
    Op(("/v1/embeddings/m3",), "POST", "BGE-M3: dense vectors, lexical weights and ColBERT vectors, any of them from "
       "one forward", "m3", M3Request, M3Response),
    Op(("/v1/m3/score",), "POST", "BGE-M3: FlagEmbedding's compute_score (dense, sparse, colbert and the weighted "
       "sums) of query-passage pairs", "m3", M3ScoreRequest, M3ScoreResponse),
)

routes = web.RouteTableDef()
BENCH = {
    "/v1/embeddings/m3": lambda texts: {"input": texts, "return_sparse": True, "return_colbert_vecs": True},
}


@routes.post("/v1/embeddings/m3")
async def m3_embeddings(request: web.Request) -> web.Response:
    call = await begin(request, "m3", M3Request)
    req = call.req
    if not (req.return_dense or req.return_sparse or req.return_colbert_vecs):
        raise InputError("ask for at least one of return_dense, return_sparse, return_colbert_vecs",
                         param="return_dense")
    texts = texts_of(call, req.input, "input")
    pipe = call.pipeline(M3Pipeline)
    res = await call.infer(pipe.plan_m3, texts, dense=req.return_dense, sparse=req.return_sparse,
                           colbert=req.return_colbert_vecs, truncate=req.truncate,
                           direction=truncation_direction(req.truncation_direction))
    data = []
    for i in range(len(texts)):
        item = M3Item(object="m3_embedding", index=i)
        if res.dense is not None:     # numpy rows: the encoder writes them through orjson
            item.dense_vecs = cast(list[float], res.dense[i])
        if res.lexical is not None:
            ids, weights = res.lexical[i]
            item.lexical_weights = dict(zip(map(str, ids.tolist()), weights.tolist(), strict=True))
            if req.return_tokens:
                item.lexical_tokens = pipe.convert_id_to_token(ids, weights)
        if res.colbert is not None:
            item.colbert_vecs = cast(list[list[float]], res.colbert[i])
        data.append(item)
    return json_response(M3Response(object="list", data=data, model=call.model.name, usage=usage(res.tokens)),
                         truncation_headers(res.truncated))


@routes.post("/v1/m3/score")
async def m3_score(request: web.Request) -> web.Response:
    call = await begin(request, "m3", M3ScoreRequest)
    req = call.req
    check_count(call, "pairs", len(req.pairs))
    queries, passages = [p[0] for p in req.pairs], [p[1] for p in req.pairs]
    check_chars(call, "pairs", [*queries, *passages])
    pipe = call.pipeline(M3Pipeline)
    res = await call.infer(pipe.plan_scores, queries, passages, weights=req.weights, truncate=req.truncate)
    s = res.scores
    return json_response(M3ScoreResponse(dense=s["dense"], sparse=s["sparse"], colbert=s["colbert"],
                                         sparse_dense=s["sparse+dense"],
                                         colbert_sparse_dense=s["colbert+sparse+dense"], model=call.model.name,
                                         usage=usage(res.tokens)), truncation_headers(res.truncated))


async def hf_task(call: Call[Any], inputs: Any, params: dict[str, Any]) -> web.Response:
    """The Hugging Face Inference API for an M3 model: feature-extraction (`inputs` a text or texts) → dense vectors;
    sentence-similarity ({source_sentence, sentences}) → the model's m3_score of the source with each sentence."""
    opts = hf_parameters(call, params, TextOptions)
    direction = truncation_direction(opts.truncation_direction)
    pipe = call.pipeline(M3Pipeline)
    if isinstance(inputs, SentencePair):
        return await sentence_similarity(call, inputs, opts.truncate, direction)
    if not (isinstance(inputs, str) or (isinstance(inputs, list) and all(isinstance(t, str) for t in inputs))):
        raise RequestValidationError("an M3 model answers feature-extraction (`inputs`: a text or texts) and "
                                     "sentence-similarity", param="inputs")
    texts = texts_of(call, inputs, "inputs")
    res = await call.infer(pipe.plan, texts, truncate=opts.truncate, direction=direction, param="inputs")
    return json_response(res.vectors if isinstance(inputs, list) else res.vectors[0],
                         truncation_headers(res.truncated))
