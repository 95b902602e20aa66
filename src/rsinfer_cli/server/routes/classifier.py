"""Text classification (`kind: classifier`): TEI's `POST /predict`, infinity's `POST /classify` and the Hugging Face
`text-classification` task on `POST /models/{name}`. Every route reaches the model through `_plan`, so the limits
(`server.max_texts` texts, `max_text_chars` characters each) and the scores are the same on all three."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from aiohttp import web

from ...errors import InputError
from ...pipelines.classifier import Classified, ClassifierPipeline, check_function
from ..errors import RequestValidationError
from ..schemas import Direction, Model, Op, PositiveInt, Request, Response, Usage
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

# ---------------------------------------------------------------- request and response bodies

PredictInputs = str | list[str | list[str]]


class PredictRequest(Request):
    """TEI: a text; a pair `[a, b]`; or a batch of texts and `[a]` / `[a, b]` items (TEI reads a list of exactly two
    strings as one pair, and so does rsinfer)."""

    inputs: PredictInputs
    raw_scores: bool | None = None
    truncate: bool | None = None
    truncation_direction: Direction | None = None


class LabelScore(Response):
    label: str
    score: float


def label_scores(res: Classified) -> list[list[LabelScore]]:
    """Each text's labels, best first."""
    return [[LabelScore(label=label, score=score) for label, score in r] for r in res.results]


class ClassifyRequest(Request):
    """infinity: texts to classify."""

    input: str | list[str]
    model: Model = None
    raw_scores: bool | None = None
    truncate: bool | None = None
    top_k: PositiveInt | None = None


class ClassifyResponse(Response):
    object: Literal["classify"]
    data: list[list[LabelScore]]
    model: str
    usage: Usage
    id: str
    created: int


OPS: tuple[Op, ...] = (   # the route table of this family (server/schemas.py), for /openapi.json
    Op(("/predict", "/models/{name}/predict"), "POST",
       "TEI: sequence classification, every label by score (the default classifier)",
       "classifier", PredictRequest, list[LabelScore | list[LabelScore]]),
    Op(("/classify", "/v1/classify"), "POST", "infinity: text classification, every label by score", "classifier",
       ClassifyRequest, ClassifyResponse),
)

routes = web.RouteTableDef()
BENCH = {
    "/predict": lambda texts: {"inputs": [[t] for t in texts]},
    "/classify": lambda texts: {"input": texts},
}


def _items(value: PredictInputs) -> tuple[list[str], list[str] | None, bool]:
    """TEI's `inputs` → (texts, pairs or None, single)."""
    if isinstance(value, str):
        return [value], None, True
    if not value:
        raise InputError("`inputs` is empty", param="inputs")
    if len(value) == 2 and all(isinstance(v, str) for v in value):   # TEI: [a, b] is one pair
        return [str(value[0])], [str(value[1])], True
    firsts: list[str] = []
    seconds: list[str] = []
    for i, item in enumerate(value):
        parts = [item] if isinstance(item, str) else item
        if len(parts) not in (1, 2):
            raise RequestValidationError(f"`inputs[{i}]` must be a text, [text] or [text, text_pair]; got "
                                         f"{len(parts)} items", param=f"inputs[{i}]")
        firsts.append(parts[0])
        seconds.append(parts[1] if len(parts) == 2 else "")
    has_pairs = any(not isinstance(item, str) and len(item) == 2 for item in value)
    if has_pairs and not all(not isinstance(item, str) and len(item) == 2 for item in value):
        raise RequestValidationError("`inputs` mixes texts and text pairs; send one kind per request", param="inputs")
    return firsts, seconds if has_pairs else None, False


async def _plan(call: Call[Any], texts: list[str], pairs: list[str] | None, key: str, **kw: Any) -> Classified:
    """The family's one way in: the limits every route shares, then the model."""
    check_count(call, key, len(texts))
    check_chars(call, key, texts)
    if pairs is not None:
        check_chars(call, key, pairs)
    return await call.infer(call.pipeline(ClassifierPipeline).plan_classify, texts, pairs, param=key, **kw)


@routes.post("/predict")
@routes.post("/models/{name}/predict")
async def predict(request: web.Request) -> web.Response:
    call = await begin(request, "classifier", PredictRequest, named=False)
    req = call.req
    texts, pairs, single = _items(req.inputs)
    res = await _plan(call, texts, pairs, "inputs", raw=bool(req.raw_scores), truncate=req.truncate,
                      direction=truncation_direction(req.truncation_direction))
    out = label_scores(res)
    return json_response(out[0] if single else out, truncation_headers(res.truncated))


@routes.post("/classify")
@routes.post("/v1/classify")
async def classify(request: web.Request) -> web.Response:
    call = await begin(request, "classifier", ClassifyRequest)
    req = call.req
    texts = [req.input] if isinstance(req.input, str) else req.input
    if not texts:
        raise InputError("`input` is empty", param="input")
    res = await _plan(call, texts, None, "input", raw=bool(req.raw_scores), truncate=req.truncate, top_k=req.top_k)
    return json_response(ClassifyResponse(object="classify", data=label_scores(res), model=call.model.name,
                                          usage=usage(res.tokens), id=f"classify-{uuid.uuid4().hex}",
                                          created=int(time.time())), truncation_headers(res.truncated))


async def hf_task(call: Call[Any], inputs: Any, params: dict[str, Any]) -> web.Response:
    """The Hugging Face Inference API's text-classification (InferenceClient.text_classification): `inputs` a text,
    `parameters` top_k and function_to_apply → [[{label, score}, ...]] best first (every label without top_k)."""
    if not isinstance(inputs, str):
        raise RequestValidationError("a classifier answers text-classification: `inputs` must be a string",
                                     param="inputs")
    top_k = params.get("top_k")
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
        raise InputError(f"`parameters.top_k` must be an integer >= 1, got {top_k!r}", param="parameters.top_k")
    function = params.get("function_to_apply")
    if function is not None and not isinstance(function, str):
        raise RequestValidationError("`parameters.function_to_apply` must be a string",
                                     param="parameters.function_to_apply")
    function = check_function(function, "parameters.function_to_apply")
    res = await _plan(call, [inputs], None, "inputs", function=function, top_k=top_k)
    return json_response(label_scores(res), truncation_headers(res.truncated))
