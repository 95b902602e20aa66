"""Sparse embeddings (`kind: sparse`, SPLADE): TEI's `POST /embed_sparse` (`[[{index, value}]]`), rsinfer's
`POST /v1/embeddings/sparse` (`indices` and `values` per text, tokens on request) and the Hugging Face
feature-extraction and sentence-similarity tasks on `POST /models/{name}`. Every route reaches the model through
`_plan`, so limits (`server.max_texts`, `max_text_chars`), prompts and `top_k` are the same on all of them."""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

from aiohttp import web
from msgspec import UNSET, Meta, UnsetType

from ...errors import InputError
from ...pipelines.sparse import SparseEncoder, SparseResult
from ..errors import RequestValidationError
from ..schemas import (
    Direction,
    Model,
    Op,
    PositiveInt,
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

# ---------------------------------------------------------------- request and response bodies

TopK = Annotated[PositiveInt | None, Meta(description="Keep the K largest weights of each text (at most the model's "
                                                      "max_active_dims)")]


class TeiSparseRequest(TextOptions, kw_only=True):
    """TEI's /embed_sparse."""

    inputs: Texts


class SparseValue(Response):
    index: int
    value: float


class SparseRequest(Request):
    """rsinfer's sparse embeddings, in the OpenAI embeddings envelope."""

    input: Texts
    model: Model = None
    top_k: TopK = None
    return_tokens: Annotated[bool | None, Meta(description="Add each index's vocabulary token")] = None
    truncate: bool | None = None
    truncation_direction: Direction | None = None
    prompt_name: PromptName = None
    prompt: PromptText = None


class SparseItem(Response, omit_defaults=True):
    object: Literal["sparse_embedding"]
    index: int
    indices: Annotated[list[int], Meta(description="Vocabulary ids of the non-zero weights, ascending")]
    values: Annotated[list[float], Meta(description="The weights, in the order of `indices`")]
    tokens: Annotated[list[str] | UnsetType, Meta(description="With return_tokens: each index's token")] = UNSET


class SparseResponse(Response):
    object: Literal["list"]
    data: list[SparseItem]
    model: str
    usage: Usage


OPS: tuple[Op, ...] = (   # the route table of this family (server/schemas.py), for /openapi.json
    Op(("/embed_sparse", "/models/{name}/embed_sparse"), "POST",
       "TEI: SPLADE sparse embeddings, the non-zero weights by vocabulary id "
       "(the default sparse model)", "sparse", TeiSparseRequest, list[list[SparseValue]]),
    Op(("/v1/embeddings/sparse",), "POST", "Sparse embeddings: indices and values per text, tokens on request",
       "sparse", SparseRequest, SparseResponse),
)

routes = web.RouteTableDef()
BENCH = {
    "/embed_sparse": lambda texts: {"inputs": texts},
    "/v1/embeddings/sparse": lambda texts: {"input": texts},
}


async def _plan(call: Call[Any], value: str | list[str], key: str, **kw: Any) -> tuple[SparseResult, bool]:
    """The family's one way in: the limits every route shares, then the model; (result, whether one text came)."""
    texts = texts_of(call, value, key)
    check_prompt(call, kw.get("prompt"), texts)
    res = await call.infer(call.pipeline(SparseEncoder).plan_sparse, texts, param=key, **kw)
    return res, isinstance(value, str)


@routes.post("/embed_sparse")
@routes.post("/models/{name}/embed_sparse")
async def tei_embed_sparse(request: web.Request) -> web.Response:
    call = await begin(request, "sparse", TeiSparseRequest, named=False)
    req = call.req
    res, _ = await _plan(call, req.inputs, "inputs", truncate=req.truncate,
                         direction=truncation_direction(req.truncation_direction), prompt_name=req.prompt_name)
    out = [[SparseValue(index=i, value=v) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
           for ids, values in res.rows]
    return json_response(out, truncation_headers(res.truncated))


@routes.post("/v1/embeddings/sparse")
async def sparse_embeddings(request: web.Request) -> web.Response:
    call = await begin(request, "sparse", SparseRequest)
    req = call.req
    res, _ = await _plan(call, req.input, "input", top_k=req.top_k, truncate=req.truncate,
                         direction=truncation_direction(req.truncation_direction), prompt_name=req.prompt_name,
                         prompt=req.prompt)
    # indices and values are numpy arrays: the encoder writes them through orjson, no Python number is made
    data = [SparseItem(object="sparse_embedding", index=i, indices=cast(list[int], ids),
                       values=cast(list[float], values),
                       tokens=res.token_names(i) if req.return_tokens else UNSET)
            for i, (ids, values) in enumerate(res.rows)]
    return json_response(SparseResponse(object="list", data=data, model=call.model.name, usage=usage(res.tokens)),
                         truncation_headers(res.truncated))


class HfSparseParameters(TextOptions):
    top_k: PositiveInt | None = None


async def hf_task(call: Call[Any], inputs: Any, params: dict[str, Any]) -> web.Response:
    """The Hugging Face Inference API for a sparse model: feature-extraction (`inputs` a text or texts) → each
    text's whole vocabulary vector, [n, vocab] as the embedding family answers (SparseEncoder.encode with
    convert_to_sparse_tensor=False); sentence-similarity ({source_sentence, sentences}) → the dot product of the
    source's vector with each sentence's (SparseEncoder's similarity). `truncate`, `truncation_direction`,
    `prompt_name` at the top level or in `parameters`."""
    opts = hf_parameters(call, params, HfSparseParameters)
    kw: dict[str, Any] = {"truncate": opts.truncate, "prompt_name": opts.prompt_name, "top_k": opts.top_k,
                          "direction": truncation_direction(opts.truncation_direction)}
    if isinstance(inputs, SentencePair):
        if not inputs.sentences:
            raise InputError("`inputs.sentences` is empty", param="inputs.sentences")
        res, _ = await _plan(call, [inputs.source_sentence, *inputs.sentences], "inputs", **kw)
        vecs = res.dense(call.pipeline(SparseEncoder).vocab_size)
        return json_response([float(x) for x in vecs[1:] @ vecs[0]], truncation_headers(res.truncated))
    if not (isinstance(inputs, str) or (isinstance(inputs, list) and all(isinstance(t, str) for t in inputs))):
        raise RequestValidationError("a sparse model answers feature-extraction (`inputs`: a text or texts) and "
                                     "sentence-similarity", param="inputs")
    res, _ = await _plan(call, inputs, "inputs", **kw)
    return json_response(res.dense(call.pipeline(SparseEncoder).vocab_size), truncation_headers(res.truncated))
