"""Embeddings in the OpenAI/vLLM shape (`POST /v1/embeddings`) and the TEI shape (`POST /embed`)."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
from aiohttp import web

from ...errors import InputError, PayloadTooLarge
from ...jsonio import dumps
from ..request import Body, json_body, text_or_token_input
from ..state import STATE

routes = web.RouteTableDef()
MAX_INPUTS = 2048  # per request, as OpenAI documents


def json_response(data: Any, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=dumps(data), content_type="application/json", headers=headers)


def truncation_headers(truncated: int) -> dict[str, str] | None:
    return {"x-rsinfer-truncated": str(truncated)} if truncated else None


def _inputs(body: Body, key: str) -> tuple[list[str] | None, list[list[int]] | None, bool]:
    texts, ids, single = text_or_token_input(body.data.get(key), key)
    n = len(texts if texts is not None else ids or [])
    if n > MAX_INPUTS:
        raise PayloadTooLarge(f"`{key}` has {n} items; at most {MAX_INPUTS} per request", param=key)
    return texts, ids, single


@routes.post("/v1/embeddings")
async def openai_embeddings(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body = Body(await json_body(request))
    model = state.registry.get(body.str("model", None), "embedding")
    pipe = state.pipelines[model.name]
    if "input" not in body.data:
        raise InputError("`input` is required", param="input")
    texts, ids, _ = _inputs(body, "input")
    fmt = body.str("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise InputError(f"`encoding_format` must be \"float\" or \"base64\", got {fmt!r}", param="encoding_format")
    dims = body.int("dimensions", None)
    pipe.check_dimensions(dims)
    result = await state.infer(model, pipe.plan, texts, ids, dimensions=dims, truncate=body.bool("truncate", None))
    vectors = result.vectors
    if fmt == "base64":
        le = vectors.astype("<f4", copy=False)
        items: list[Any] = [base64.b64encode(le[i].tobytes()).decode("ascii") for i in range(len(le))]
    else:
        items = list(vectors)
    data = [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(items)]
    return json_response({"object": "list", "data": data, "model": model.name,
                          "usage": {"prompt_tokens": result.tokens, "total_tokens": result.tokens}},
                         truncation_headers(result.truncated))


@routes.post("/embed")
async def tei_embed(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body = Body(await json_body(request))
    model = state.registry.get(None, "embedding")
    pipe = state.pipelines[model.name]
    if "inputs" not in body.data:
        raise InputError("`inputs` is required", param="inputs")
    texts, ids, _ = _inputs(body, "inputs")
    direction = body.str("truncation_direction", "right").lower()
    if direction not in ("right", "left"):
        raise InputError(f"`truncation_direction` must be \"right\" or \"left\", got {direction!r}",
                         param="truncation_direction")
    dims = body.int("dimensions", None)
    pipe.check_dimensions(dims)
    result = await state.infer(model, pipe.plan, texts, ids, dimensions=dims, normalize=body.bool("normalize", None),
                             truncate=body.bool("truncate", None), direction=direction, param="inputs")
    return json_response(np.asarray(result.vectors), truncation_headers(result.truncated))
