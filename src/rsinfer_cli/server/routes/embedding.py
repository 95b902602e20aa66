"""Embeddings in the OpenAI/vLLM shape (`POST /v1/embeddings`) and the TEI shape (`POST /embed`)."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
from aiohttp import web

from ...errors import InputError
from ...pipelines.embedding import EmbeddingPipeline
from ..errors import RequestValidationError
from ..request import text_or_token_input
from .common import (
    Call,
    begin,
    check_chars,
    check_count,
    json_response,
    truncation_direction,
    truncation_headers,
    usage,
)

routes = web.RouteTableDef()
# `rsinfer bench --url`: a request body for each route, from texts
BENCH = {"/v1/embeddings": lambda texts: {"input": texts}, "/embed": lambda texts: {"inputs": texts}}


def _inputs(call: Call, key: str) -> tuple[list[str] | None, list[list[int]] | None, bool]:
    texts, ids, single = text_or_token_input(call.body.data.get(key), key)
    check_count(call, key, len(texts if texts is not None else ids or []))
    check_chars(call, key, texts)
    return texts, ids, single


@routes.post("/v1/embeddings")
async def openai_embeddings(request: web.Request) -> web.Response:
    call = await begin(request, "embedding")
    body, model, pipe = call.body, call.model, call.pipeline(EmbeddingPipeline)
    if "input" not in body.data:
        raise RequestValidationError("`input` is required", param="input")
    texts, ids, _ = _inputs(call, "input")
    fmt = body.str("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise InputError(f"`encoding_format` must be \"float\" or \"base64\", got {fmt!r}", param="encoding_format")
    dims = body.int("dimensions", None)
    pipe.check_dimensions(dims)
    result = await call.infer(pipe.plan, texts, ids, dimensions=dims, truncate=body.bool("truncate", None))
    vectors = result.vectors
    if fmt == "base64":
        le = vectors.astype("<f4", copy=False)
        items: list[Any] = [base64.b64encode(le[i].tobytes()).decode("ascii") for i in range(len(le))]
    else:
        items = list(vectors)
    data = [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(items)]
    return json_response({"object": "list", "data": data, "model": model.name,
                          "usage": usage(result.tokens)},
                         truncation_headers(result.truncated))


@routes.post("/embed")
async def tei_embed(request: web.Request) -> web.Response:
    call = await begin(request, "embedding", named=False)
    body, pipe = call.body, call.pipeline(EmbeddingPipeline)
    if "inputs" not in body.data:
        raise RequestValidationError("`inputs` is required", param="inputs")
    texts, ids, _ = _inputs(call, "inputs")
    direction = truncation_direction(body)
    dims = body.int("dimensions", None)
    pipe.check_dimensions(dims)
    result = await call.infer(pipe.plan, texts, ids, dimensions=dims, normalize=body.bool("normalize", None),
                              truncate=body.bool("truncate", None), direction=direction, param="inputs")
    return json_response(np.asarray(result.vectors), truncation_headers(result.truncated))
