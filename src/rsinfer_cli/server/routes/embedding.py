"""Embeddings in the OpenAI/vLLM shape (`POST /v1/embeddings`) and the TEI shape (`POST /embed`)."""

from __future__ import annotations

import base64
import uuid
from typing import Any

import numpy as np
from aiohttp import web

from ...errors import InputError
from ...pipelines.embedding import EMBEDDING_TYPES, EmbeddingPipeline, embedding_types
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
BENCH = {"/v1/embeddings": lambda texts: {"input": texts}, "/embed": lambda texts: {"inputs": texts},
         "/v2/embed": lambda texts: {"texts": texts, "input_type": "search_query", "embedding_types": ["float"]}}
INPUT_TYPES = ("search_document", "search_query", "classification", "clustering")


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


@routes.post("/v1/embed")
@routes.post("/v2/embed")
async def cohere_embed(request: web.Request) -> web.Response:
    """Cohere embed: `texts`, `input_type` (accepted; rsinfer embeds the text as given: add a model's own prefixes
    yourself), `embedding_types`, `truncate` (NONE | START | END) and `output_dimension`."""
    call = await begin(request, "embedding")
    body, pipe = call.body, call.pipeline(EmbeddingPipeline)
    texts = body.str_list("texts")
    if not texts:
        raise InputError("`texts` is empty", param="texts")
    check_count(call, "texts", len(texts))
    check_chars(call, "texts", texts)
    input_type = body.str("input_type", None)
    if input_type is not None and input_type not in INPUT_TYPES:
        raise InputError(f"`input_type` must be one of {', '.join(INPUT_TYPES)}, got {input_type!r}",
                         param="input_type")
    v2 = request.path.startswith("/v2/")
    types = body.str_list("embedding_types", None)
    for t in types or []:
        if t not in EMBEDDING_TYPES:
            raise InputError(f"unknown embedding type '{t}' (one of {', '.join(EMBEDDING_TYPES)})",
                             param="embedding_types")
    truncate = body.str("truncate", "END").upper()
    if truncate not in ("NONE", "START", "END"):
        raise InputError(f"`truncate` must be NONE, START or END, got {truncate!r}", param="truncate")
    dims = body.int("output_dimension", None)
    pipe.check_dimensions(dims)
    result = await call.infer(pipe.plan, texts, None, dimensions=dims, truncate=truncate != "NONE",
                              direction="left" if truncate == "START" else "right", param="texts")
    meta = {"api_version": {"version": "2" if v2 else "1"}, "billed_units": {"input_tokens": result.tokens}}
    head: dict[str, Any] = {"id": str(uuid.uuid4()), "texts": texts, "meta": meta}
    if types is None and not v2:  # v1 without embedding_types: plain float lists
        return json_response({**head, "response_type": "embeddings_floats", "embeddings": result.vectors},
                             truncation_headers(result.truncated))
    return json_response({**head, "response_type": "embeddings_by_type",
                          "embeddings": embedding_types(result.vectors, types or ["float"])},
                         truncation_headers(result.truncated))


# ---------------------------------------------------------------- TEI extras


@routes.post("/tokenize")
async def tei_tokenize(request: web.Request) -> web.Response:
    """TEI: each input's tokens as `{id, text, special, start, stop}` (character offsets)."""
    call = await begin(request, "embedding", named=False)
    body, pipe = call.body, call.pipeline(EmbeddingPipeline)
    if "inputs" not in body.data:
        raise RequestValidationError("`inputs` is required", param="inputs")
    inputs = body.str_list("inputs", allow_str=True)
    texts = [inputs] if isinstance(inputs, str) else inputs
    check_count(call, "inputs", len(texts))
    check_chars(call, "inputs", texts)
    special = body.bool("add_special_tokens", True)
    tok = pipe.encoder.tokenizer
    out = []
    for enc in tok.encode_batch(list(texts), add_special_tokens=special):
        out.append([{"id": i, "text": t, "special": bool(m), "start": a, "stop": b}
                    for i, t, m, (a, b) in zip(enc.ids, enc.tokens, enc.special_tokens_mask, enc.offsets,
                                               strict=True)])
    return json_response(out)


@routes.post("/decode")
async def tei_decode(request: web.Request) -> web.Response:
    """TEI: token ids (one list, or a list of lists) back to text."""
    call = await begin(request, "embedding", named=False)
    body, pipe = call.body, call.pipeline(EmbeddingPipeline)
    if "ids" not in body.data:
        raise RequestValidationError("`ids` is required", param="ids")
    _, rows, _ = text_or_token_input(body.data["ids"], "ids")
    if rows is None:
        raise RequestValidationError("`ids` must be token ids: a list of integers, or a list of such lists",
                                     param="ids")
    skip = body.bool("skip_special_tokens", True)
    vocab = pipe.vocab_size
    for i, row in enumerate(rows):
        bad = next((t for t in row if not 0 <= t < vocab), None)
        if bad is not None:
            raise InputError(f"`ids[{i}]` has token id {bad} outside the vocabulary (0..{vocab - 1})", param="ids")
    return json_response([pipe.encoder.tokenizer.decode(row, skip_special_tokens=skip) for row in rows])


@routes.post("/similarity")
async def tei_similarity(request: web.Request) -> web.Response:
    """TEI / sentence-transformers: cosine similarity of `source_sentence` to each of `sentences`."""
    call = await begin(request, "embedding", named=False)
    body, pipe = call.body, call.pipeline(EmbeddingPipeline)
    inputs = body.data.get("inputs")
    if not isinstance(inputs, dict):
        raise RequestValidationError("`inputs` must be an object with `source_sentence` and `sentences`",
                                     param="inputs")
    source, sentences = inputs.get("source_sentence"), inputs.get("sentences")
    if not isinstance(source, str) or not isinstance(sentences, list) or \
            not all(isinstance(x, str) for x in sentences):
        raise RequestValidationError("`inputs.source_sentence` must be a string and `inputs.sentences` an array "
                                     "of strings", param="inputs")
    if not sentences:
        raise InputError("`inputs.sentences` is empty", param="inputs.sentences")
    check_count(call, "inputs.sentences", len(sentences) + 1)
    check_chars(call, "inputs.sentences", [source, *sentences])
    result = await call.infer(pipe.plan, [source, *sentences], None, normalize=True, param="inputs")
    v = result.vectors
    return json_response([float(x) for x in v[1:] @ v[0]], truncation_headers(result.truncated))
