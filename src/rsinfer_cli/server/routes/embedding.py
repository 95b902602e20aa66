"""Embeddings in the OpenAI/vLLM shape (`POST /v1/embeddings`) and the TEI shape (`POST /embed`)."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from aiohttp import web
from msgspec import Meta, Struct

from ...errors import InputError
from ...jsonio import dumps
from ...pipelines.embedding import Embedder, EmbeddingPipeline
from ...pipelines.outtypes import as_json, by_type, packed_base64, quantize
from ..errors import RequestValidationError
from ..request import text_or_token_input
from ..schemas import (
    ApiVersion,
    Direction,
    Inputs,
    Model,
    Op,
    PositiveInt,
    PromptName,
    PromptText,
    Request,
    Response,
    SentencePair,
    TextOptions,
    Usage,
)
from .common import (
    Call,
    begin,
    check_chars,
    check_count,
    check_inputs,
    check_prompt,
    decode,
    json_response,
    truncation_direction,
    truncation_headers,
    usage,
    vectors,
)

# ---------------------------------------------------------------- request and response bodies



class InputItem(Struct, kw_only=True):
    """Jina's item: a text or an image (base64 or a data URI)."""

    text: str | None = None
    image: str | None = None


class ImageUrl(Struct, kw_only=True):
    url: str


class ContentPart(Struct, kw_only=True):
    """An OpenAI chat content part: {type: text, text} or {type: image_url, image_url: {url}}."""

    type: str
    text: str | None = None
    image_url: ImageUrl | None = None


class ChatMessage(Struct, kw_only=True):
    role: str = "user"
    content: str | list[ContentPart]


class EmbeddingsRequest(Request):
    input: Annotated[str | list[str | int | list[int] | InputItem] | None, Meta(description=(
        "A string, strings, token ids, lists of token ids, or Jina's items ({text} or {image})"))] = None
    messages: Annotated[list[ChatMessage] | None, Meta(description=(
        "vLLM's chat form instead of `input`: one vector for the message's one text or image_url part"))] = None
    model: Model = None
    encoding_format: Literal["float", "base64"] | None = None
    modality: Annotated[Literal["text", "image"] | None, Meta(description=(
        "infinity's: image makes `input` images (base64 or data URIs) for an image_text model"))] = None
    embedding_type: Annotated[Literal["float", "int8", "uint8", "binary", "ubinary"] | None, Meta(description=(
        "rsinfer's extension (extra_body in the OpenAI SDK): int8, uint8, binary or ubinary vectors as "
        "sentence-transformers' quantize_embeddings makes them; with encoding_format base64, the packed bytes"))] = None
    dimensions: Annotated[PositiveInt | None, Meta(description="Keep the first N dimensions, re-normalised")] = None
    truncate: bool | None = None
    prompt_name: PromptName = None       # OpenAI has no prompts: an extra body field (`extra_body=` in its SDK)
    prompt: PromptText = None


class EmbeddingItem(Response):
    object: Literal["embedding"]
    index: int
    embedding: Annotated[list[float] | str, Meta(description=(
        "Floats (the integers of embedding_type are numbers here too), or base64 of little-endian float32 (or of the "
        "packed bytes)"))]


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
    prompt_name: PromptName = None
    prompt: PromptText = None


class CohereInput(Struct, kw_only=True):
    """Cohere v2's mixed input: its content parts (one text or one image_url a vector here)."""

    content: list[ContentPart]


class CohereEmbedRequest(Request):
    texts: list[str] | None = None
    images: Annotated[list[str] | None, Meta(description="Cohere v2: images as data URIs (an image_text model)")] = None
    inputs: Annotated[list[CohereInput] | None, Meta(description=(
        "Cohere v2: items of content parts, one text or one image_url each"))] = None
    model: Model = None
    input_type: Annotated[Literal["search_document", "search_query", "classification", "clustering", "image"] | None,
                          Meta(description="Picks the model's prompt: search_query → query, search_document → "
                                           "document, passage or corpus (per model: input_type_prompts)")] = None
    embedding_types: list[Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]] | None = None
    truncate: Literal["NONE", "START", "END", "none", "start", "end"] | None = None
    output_dimension: PositiveInt | None = None


class BilledTokens(Response):
    input_tokens: int


class CohereEmbedMeta(Response):
    api_version: ApiVersion
    billed_units: BilledTokens


class CohereEmbedResponse(Response):
    id: str
    texts: list[str]
    meta: CohereEmbedMeta
    response_type: Literal["embeddings_floats", "embeddings_by_type"]
    embeddings: list[list[float]] | dict[str, list[Any]]


class TokenizeRequest(Request):
    inputs: str | list[str]
    add_special_tokens: bool | None = None
    prompt_name: PromptName = None       # the tokens of the prompt and the text, as /embed would embed them


class Token(Response):
    id: int
    text: str
    special: bool
    start: int
    stop: int


class DecodeRequest(Request):
    ids: list[int | list[int]]
    skip_special_tokens: bool | None = None


class SimilarityParameters(TextOptions):
    """TEI /similarity's parameters."""


class SimilarityRequest(Request):
    inputs: SentencePair
    parameters: SimilarityParameters | None = None


OPS: tuple[Op, ...] = (   # the route table of this family (server/schemas.py), for /openapi.json
    Op(("/v1/embeddings", "/embeddings"), "POST", "OpenAI / vLLM embeddings (and infinity's own path, without /v1)",
       "embedding", EmbeddingsRequest,
       EmbeddingsResponse),
    Op(("/embed", "/models/{name}/embed"), "POST", "TEI embeddings (the default embedding model, or the one the "
       "path names)", "embedding", TeiEmbedRequest,
       list[list[float]]),
    Op(("/v1/embed", "/v2/embed"), "POST", "Cohere embed", "embedding", CohereEmbedRequest, CohereEmbedResponse),
    Op(("/tokenize", "/models/{name}/tokenize"), "POST",
       "TEI: tokens with offsets", "embedding", TokenizeRequest, list[list[Token]]),
    Op(("/decode",), "POST", "TEI: token ids back to text", "embedding", DecodeRequest, list[str]),
    Op(("/similarity",), "POST", "TEI: cosine similarity of sentences", "embedding", SimilarityRequest,
       list[float]),
)


routes = web.RouteTableDef()
# `rsinfer bench --url`: a request body for each route, from texts
BENCH = {"/v1/embeddings": lambda texts: {"input": texts}, "/embed": lambda texts: {"inputs": texts},
         "/v2/embed": lambda texts: {"texts": texts, "input_type": "search_query", "embedding_types": ["float"]}}


def _inputs(call: Call[Any], key: str, value: Any) -> tuple[list[Any] | None, list[list[int]] | None, bool]:
    """The request's items (a string or strings, or token ids), each as its model's family reads it (its InputKind:
    texts here, whatever another family that serves these routes declares) and within its limits."""
    texts, ids, single = text_or_token_input(value, key)  # the untagged union's items, checked by hand
    if texts is None:
        check_count(call, key, len(ids or []))
        return None, ids, single
    return check_inputs(call, key, texts), ids, single


def _image(item: str, where: str) -> bytes | str:
    """An image item as its bytes, or an http(s) URL the model fetches if its entry allows the host."""
    from ...pipelines import imageprep as ip

    try:
        return ip.image_item(item, ip.Limits())
    except ip.ImageInputError as exc:
        raise InputError(f"{where}: {exc}", param=where) from None


def _mixed(call: Call[Any], req: EmbeddingsRequest) -> list[tuple[str, Any]] | None:
    """Jina's items or vLLM's messages as ("text", str) / ("image", bytes) items; None: a plain `input`."""
    if req.messages is not None:
        if req.input is not None:
            raise InputError("give `input` or `messages`, not both", param="messages")
        parts = [p if isinstance(p, ContentPart) else ContentPart(type="text", text=p)
                 for m in req.messages for p in (m.content if isinstance(m.content, list) else [m.content])]
        if len(parts) != 1:
            raise InputError(f"`messages` holds {len(parts)} content parts; one text or one image_url makes one "
                             "vector", param="messages")
        return [_part(parts[0], "messages[0].content")]
    if req.input is None:          # the required field missing: 422, as a body that does not validate
        raise RequestValidationError("`input` is required (or vLLM's `messages`)", param="input")
    if not isinstance(req.input, list) or not any(isinstance(x, InputItem) for x in req.input):
        return None
    out = []
    for i, x in enumerate(req.input):
        if not isinstance(x, InputItem) or (x.text is None) == (x.image is None):
            raise InputError(f"input[{i}]: an item is {{\"text\": ...}} or {{\"image\": ...}}", param=f"input[{i}]")
        out.append(("text", x.text) if x.text is not None else ("image", _image(x.image or "", f"input[{i}]")))
    check_count(call, "input", len(out))
    return out


def _cohere_items(call: Call[Any], req: CohereEmbedRequest) -> list[tuple[str, Any]] | None:
    """Cohere's `images` or `inputs` as ("text", str) / ("image", bytes) items; None: `texts`. Exactly one of the
    three."""
    given = [k for k in ("texts", "images", "inputs") if getattr(req, k) is not None]
    if not given:        # the required field missing: 422, as a body that does not validate
        raise RequestValidationError("`texts` is required (or Cohere v2's `images` or `inputs`)", param="texts")
    if len(given) > 1:
        raise InputError(f"give one of `texts`, `images`, `inputs`, not {' and '.join(given)}", param=given[1])
    key = given[0]
    if not getattr(req, key):
        raise InputError(f"`{key}` is empty", param=key)
    if key == "texts":
        return None
    check_count(call, key, len(getattr(req, key)))
    if req.images is not None:
        return [("image", _image(x, f"images[{i}]")) for i, x in enumerate(req.images)]
    out = []
    for i, item in enumerate(req.inputs or []):
        if len(item.content) != 1:
            raise InputError(f"inputs[{i}]: {len(item.content)} content parts; one text or one image_url makes one "
                             "vector", param=f"inputs[{i}]")
        out.append(_part(item.content[0], f"inputs[{i}].content[0]"))
    return out


def _part(part: ContentPart, where: str) -> tuple[str, Any]:
    if part.type == "text" and part.text is not None:
        return "text", part.text
    if part.type == "image_url" and part.image_url is not None:
        return "image", _image(part.image_url.url, where)
    raise InputError(f"{where}: a part is {{type: text, text}} or {{type: image_url, image_url: {{url}}}}",
                     param=where)


def _images(call: Call[Any], value: Any) -> list[bytes | str]:
    """`input` as images (modality: image): base64 strings or data URIs, decoded (InputError naming the item)."""
    from ...pipelines import imageprep as ip

    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
        raise InputError("with modality image, `input` is an image or a list of them (base64 or data URIs)",
                         param="input")
    check_count(call, "input", len(items))
    out = []
    for i, item in enumerate(items):
        try:
            out.append(ip.image_item(item, ip.Limits()))
        except ip.ImageInputError as exc:
            raise InputError(f"input[{i}]: {exc}", param=f"input[{i}]") from None
    return out


@routes.post("/v1/embeddings")
@routes.post("/embeddings")           # infinity's path: litellm's infinity/ provider with a root base URL
async def openai_embeddings(request: web.Request) -> web.Response:
    call = await begin(request, "embedding", EmbeddingsRequest)
    req, model, pipe = call.req, call.model, call.pipeline(Embedder)
    mixed = _mixed(call, req)
    if mixed is not None:
        result = await call.infer(pipe.plan_items, mixed, param="input")
    elif req.modality == "image":
        result = await call.infer(pipe.plan_images, _images(call, req.input), param="input")
    else:
        texts, ids, _ = _inputs(call, "input", req.input)
        check_prompt(call, req.prompt, texts)
        result = await call.infer(pipe.plan, texts, ids, dimensions=req.dimensions, truncate=req.truncate,
                                  prompt_name=req.prompt_name, prompt=req.prompt)
    vecs = quantize(result.vectors, req.embedding_type or "float", pipe.ranges)
    if req.encoding_format == "base64":
        items: list[Any] = packed_base64(vecs)
    else:
        items = as_json(vecs)
    # a vector is its numpy row: the encoder writes it at float32 precision, with no Python floats made
    data = [EmbeddingItem(object="embedding", index=i, embedding=e) for i, e in enumerate(items)]
    return json_response(EmbeddingsResponse(object="list", data=data, model=model.name, usage=usage(result.tokens)),
                         truncation_headers(result.truncated))


@routes.post("/embed")
@routes.post("/models/{name}/embed")
async def tei_embed(request: web.Request) -> web.Response:
    call = await begin(request, "embedding", TeiEmbedRequest, named=False)
    req, pipe = call.req, call.pipeline(Embedder)
    texts, ids, _ = _inputs(call, "inputs", req.inputs)
    check_prompt(call, req.prompt, texts)
    result = await call.infer(pipe.plan, texts, ids, dimensions=req.dimensions, normalize=req.normalize,
                              truncate=req.truncate, direction=truncation_direction(req.truncation_direction),
                              param="inputs", prompt_name=req.prompt_name, prompt=req.prompt)
    return json_response(result.vectors, truncation_headers(result.truncated))


@routes.post("/v1/embed")
@routes.post("/v2/embed")
async def cohere_embed(request: web.Request) -> web.Response:
    """Cohere embed: `texts`, `input_type` (the model's prompt for it: search_query → query, search_document →
    document, passage or corpus, classification and clustering → a prompt of that name; `input_type_prompts` in the
    model entry maps them), `embedding_types`, `truncate` (NONE | START | END) and `output_dimension`."""
    call = await begin(request, "embedding", CohereEmbedRequest)
    req, pipe = call.req, call.pipeline(Embedder)
    v2 = request.path.startswith("/v2/")
    types = req.embedding_types
    items = _cohere_items(call, req)
    if items is not None:
        result = await call.infer(pipe.plan_items, items, param="inputs" if req.inputs is not None else "images")
    else:
        texts = check_inputs(call, "texts", req.texts or [])
        truncate = (req.truncate or "END").upper()
        result = await call.infer(pipe.plan, texts, None, dimensions=req.output_dimension,
                                  truncate=truncate != "NONE", direction="left" if truncate == "START" else "right",
                                  param="texts", prompt_name=pipe.prompt_for_input_type(req.input_type))
    meta = CohereEmbedMeta(api_version=ApiVersion(version="2" if v2 else "1"),
                           billed_units=BilledTokens(input_tokens=result.tokens))
    if types is None and not v2:  # v1 without embedding_types: plain float lists
        return json_response(CohereEmbedResponse(id=str(uuid.uuid4()), texts=req.texts or [], meta=meta,
                                                 response_type="embeddings_floats", embeddings=vectors(result.vectors)),
                             truncation_headers(result.truncated))
    return json_response(CohereEmbedResponse(id=str(uuid.uuid4()), texts=req.texts or [], meta=meta,
                                             response_type="embeddings_by_type",
                                             embeddings=by_type(result.vectors, types or ["float"], pipe.ranges)),
                         truncation_headers(result.truncated))


# ---------------------------------------------------------------- TEI extras


@routes.post("/tokenize")
@routes.post("/models/{name}/tokenize")
async def tei_tokenize(request: web.Request) -> web.Response:
    """TEI: each input's tokens as `{id, text, special, start, stop}` (character offsets)."""
    call = await begin(request, "embedding", TokenizeRequest, named=False)
    req, pipe = call.req, call.pipeline(EmbeddingPipeline)
    texts = [req.inputs] if isinstance(req.inputs, str) else req.inputs
    check_count(call, "inputs", len(texts))
    check_chars(call, "inputs", texts)
    prefix = pipe.prompt_text(req.prompt_name) if req.prompt_name is not None else ""
    texts = [prefix + t for t in texts] if prefix else texts
    special = req.add_special_tokens is not False
    tok = pipe.encoder.tokenizer
    out = [[Token(id=i, text=t, special=bool(m), start=a, stop=b)
            for i, t, m, (a, b) in zip(enc.ids, enc.tokens, enc.special_tokens_mask, enc.offsets, strict=True)]
           for enc in tok.encode_batch(list(texts), add_special_tokens=special)]
    return json_response(out)


@routes.post("/decode")
async def tei_decode(request: web.Request) -> web.Response:
    """TEI: token ids (one list, or a list of lists) back to text."""
    call = await begin(request, "embedding", DecodeRequest, named=False)
    req, pipe = call.req, call.pipeline(EmbeddingPipeline)
    _, rows, _ = text_or_token_input(req.ids, "ids")
    if rows is None:
        raise RequestValidationError("`ids` must be token ids: a list of integers, or a list of such lists",
                                     param="ids")
    skip = req.skip_special_tokens is not False
    vocab = pipe.vocab_size
    for i, row in enumerate(rows):
        bad = next((t for t in row if not 0 <= t < vocab), None)
        if bad is not None:
            raise InputError(f"`ids[{i}]` has token id {bad} outside the vocabulary (0..{vocab - 1})", param="ids")
    return json_response([pipe.encoder.tokenizer.decode(row, skip_special_tokens=skip) for row in rows])


@routes.post("/similarity")
async def tei_similarity(request: web.Request) -> web.Response:
    """TEI / sentence-transformers: cosine similarity of `source_sentence` to each of `sentences`."""
    call = await begin(request, "embedding", SimilarityRequest, named=False)
    return await similarity(call, call.req.inputs, call.req.parameters or SimilarityParameters())


async def similarity(call: Call[Any], pair: SentencePair, params: SimilarityParameters) -> web.Response:
    """Cosine similarity of `source_sentence` to each of `sentences` (TEI's /similarity, and Hugging Face's
    sentence-similarity task on an embedding model), every sentence with the prompt `prompt_name` names (else the
    model's default)."""
    source, sentences = pair.source_sentence, pair.sentences
    if not sentences:
        raise InputError("`inputs.sentences` is empty", param="inputs.sentences")
    rows = check_inputs(call, "inputs.sentences", [source, *sentences])
    result = await call.infer(call.pipeline(Embedder).plan, rows, None, normalize=True,
                              param="inputs", truncate=params.truncate, prompt_name=params.prompt_name,
                              direction=truncation_direction(params.truncation_direction))
    v = result.vectors
    return json_response([float(x) for x in v[1:] @ v[0]], truncation_headers(result.truncated))


async def hf_task(call: Call[Any], inputs: Any, params: dict[str, Any]) -> web.Response:
    """The Hugging Face Inference API for an embedding model: feature-extraction (`inputs`: a text or texts,
    `normalize`, `prompt_name`, `dimensions`, `truncate`, `truncation_direction` - at the top level, as
    huggingface_hub sends them, or in `parameters`), or sentence-similarity (`inputs`: {source_sentence,
    sentences})."""
    if isinstance(inputs, SentencePair):
        return await similarity(call, inputs, decode(dumps(params), SimilarityParameters))
    req = call.req
    pipe = call.pipeline(Embedder)
    texts, ids, _ = _inputs(call, "inputs", inputs)

    def given(key: str, kind: type) -> Any:
        value = getattr(req, key)
        value = params.get(key) if value is None else value
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool) is not (kind is bool)):
            want = {bool: "a boolean", int: "an integer", str: "a string"}[kind]
            raise RequestValidationError(f"`{key}` must be {want}", param=key)
        return value

    dims = given("dimensions", int)
    direction = str(given("truncation_direction", str) or "right")
    if direction.lower() not in ("right", "left"):
        raise RequestValidationError(f"`truncation_direction` must be right or left, got {direction!r}",
                                     param="truncation_direction")
    check_prompt(call, given("prompt", str), texts)
    res = await call.infer(pipe.plan, texts, ids, normalize=given("normalize", bool),
                           truncate=given("truncate", bool), direction=truncation_direction(direction),
                           param="inputs", dimensions=dims, prompt_name=given("prompt_name", str),
                           prompt=given("prompt", str))
    return json_response(res.vectors, truncation_headers(res.truncated))
