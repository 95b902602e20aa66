"""Late interaction (`kind: late_interaction`, ColBERT): token vectors per text on TEI's `POST /embed_all` and
`POST /v1/embeddings/tokens` (`is_query` chooses query or document encoding), the Hugging Face feature-extraction
and sentence-similarity tasks on `POST /models/{name}`. Reranking by MaxSim needs no route of its own: the family
serves the rerank routes (Cohere v1/v2, Jina, TEI /rerank, vLLM /v1/score), whose limits and shapes apply as to a
cross-encoder. Every route here reaches the model through `_plan`."""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

from aiohttp import web
from msgspec import Meta

from ...pipelines.late_interaction import TokenVectorizer, TokenVectors
from ..errors import RequestValidationError
from ..schemas import (
    Model,
    Op,
    PromptName,
    PromptText,
    Request,
    Response,
    SentencePair,
    TextOptions,
    Texts,
    Usage,
)
from .common import (
    Call,
    begin,
    check_prompt,
    hf_parameters,
    json_response,
    texts_of,
    truncation_direction,
    truncation_headers,
    usage,
)
from .rerank import sentence_similarity

# ---------------------------------------------------------------- request and response bodies

IsQuery = Annotated[bool | None, Meta(description="Encode as queries ([Q] prefix, [MASK] expansion to the query "
                                                  "length) instead of documents ([D] prefix, punctuation dropped); "
                                                  "default false")]


class TeiEmbedAllRequest(TextOptions, kw_only=True):
    """TEI's /embed_all, with rsinfer's `is_query`."""

    inputs: Texts
    is_query: IsQuery = None


class TokenEmbeddingsRequest(Request):
    input: Texts
    model: Model = None
    is_query: IsQuery = None
    truncate: bool | None = None
    prompt_name: PromptName = None
    prompt: PromptText = None


class TokenEmbedding(Response):
    object: Literal["token_embeddings"]
    index: int
    embedding: Annotated[list[list[float]], Meta(description="One unit vector per kept token")]


class TokenEmbeddingsResponse(Response):
    object: Literal["list"]
    data: list[TokenEmbedding]
    model: str
    usage: Usage


OPS: tuple[Op, ...] = (   # the route table of this family (server/schemas.py), for /openapi.json
    Op(("/embed_all", "/models/{name}/embed_all"), "POST",
       "TEI: every kept token's vector, per text (the default late-interaction model)",
       "late_interaction", TeiEmbedAllRequest, list[list[list[float]]]),
    Op(("/v1/embeddings/tokens",), "POST", "ColBERT token vectors per text, as queries or documents",
       "late_interaction", TokenEmbeddingsRequest, TokenEmbeddingsResponse),
)

routes = web.RouteTableDef()
BENCH = {
    "/embed_all": lambda texts: {"inputs": texts},
    "/v1/embeddings/tokens": lambda texts: {"input": texts},
}


async def _plan(call: Call[Any], value: str | list[str], key: str, **kw: Any) -> TokenVectors:
    """The family's one way in: the limits every route shares, then the model."""
    texts = texts_of(call, value, key)
    check_prompt(call, kw.get("prompt"), texts)
    return await call.infer(call.pipeline(TokenVectorizer).plan_vectors, texts, param=key, **kw)


@routes.post("/embed_all")
@routes.post("/models/{name}/embed_all")
async def tei_embed_all(request: web.Request) -> web.Response:
    call = await begin(request, "late_interaction", TeiEmbedAllRequest, named=False)
    req = call.req
    res = await _plan(call, req.inputs, "inputs", is_query=bool(req.is_query), truncate=req.truncate,
                      direction=truncation_direction(req.truncation_direction), prompt_name=req.prompt_name)
    return json_response(res.vectors, truncation_headers(res.truncated))


@routes.post("/v1/embeddings/tokens")
async def token_embeddings(request: web.Request) -> web.Response:
    call = await begin(request, "late_interaction", TokenEmbeddingsRequest)
    req = call.req
    res = await _plan(call, req.input, "input", is_query=bool(req.is_query), truncate=req.truncate,
                      prompt_name=req.prompt_name, prompt=req.prompt)
    # each text's vectors are a numpy array: the encoder writes them through orjson, no Python float is made
    data = [TokenEmbedding(object="token_embeddings", index=i, embedding=cast(list[list[float]], v))
            for i, v in enumerate(res.vectors)]
    return json_response(TokenEmbeddingsResponse(object="list", data=data, model=call.model.name,
                                                 usage=usage(res.tokens)), truncation_headers(res.truncated))


class HfParameters(TextOptions):
    is_query: bool | None = None


async def hf_task(call: Call[Any], inputs: Any, params: dict[str, Any]) -> web.Response:
    """The Hugging Face Inference API for a ColBERT model: feature-extraction (`inputs` a text or texts; `is_query`)
    → each text's token vectors; sentence-similarity ({source_sentence, sentences}) → the MaxSim of the source as a
    query with each sentence as a document, in the sentences' order (the rerank score)."""
    opts = hf_parameters(call, params, HfParameters)
    direction = truncation_direction(opts.truncation_direction)
    if isinstance(inputs, SentencePair):
        return await sentence_similarity(call, inputs, opts.truncate, direction)
    if not (isinstance(inputs, str) or (isinstance(inputs, list) and all(isinstance(t, str) for t in inputs))):
        raise RequestValidationError("a late-interaction model answers feature-extraction (`inputs`: a text or "
                                     "texts) and sentence-similarity", param="inputs")
    res = await _plan(call, inputs, "inputs", is_query=bool(opts.is_query), truncate=opts.truncate,
                      direction=direction, prompt_name=opts.prompt_name)
    return json_response(res.vectors, truncation_headers(res.truncated))
