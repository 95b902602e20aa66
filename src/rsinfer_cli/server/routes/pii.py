"""PII detection and redaction: `POST /pii/detect`, `POST /pii/redact` and their `/v1/pii/*` aliases.

Neither the texts nor the spans are ever logged."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ...errors import InputError
from ...pipelines.pii import PiiPipeline
from ..request import Body
from .common import Call, begin, check_count, json_response, usage

routes = web.RouteTableDef()
BENCH = {route: (lambda texts: {"texts": texts}) for route in
         ("/pii/detect", "/pii/redact", "/v1/pii/detect", "/v1/pii/redact")}


def _texts(call: Call) -> tuple[list[str], bool]:
    body = call.body
    text = body.str("text", None)
    texts = body.str_list("texts", None)
    if (text is None) == (not texts):
        raise InputError("provide exactly one of `text` or non-empty `texts`", param="text" if texts else "texts")
    if texts:
        check_count(call, "texts", len(texts))
    return ([text], False) if text is not None else (texts, True)


def _options(body: Body) -> dict[str, Any]:
    threshold = body.number("threshold", None)
    types = body.str_list("types", None)
    return {"threshold": threshold, "types": types}


@routes.post("/pii/detect")
@routes.post("/v1/pii/detect")
async def detect(request: web.Request) -> web.Response:
    call = await begin(request, "pii")
    body, model = call.body, call.model
    texts, many = _texts(call)
    det = await call.infer(call.pipeline(PiiPipeline).plan_detect, texts, **_options(body))
    results = []
    for text, ents in zip(texts, det.entities, strict=True):
        item: dict[str, Any] = {"entities": [e.to_json() for e in ents]}
        if many:
            item["text"] = text
        results.append(item)
    return json_response({"object": "pii.detection", "model": model.name, "results": results,
                          "usage": usage(det.tokens)})


@routes.post("/pii/redact")
@routes.post("/v1/pii/redact")
async def redact(request: web.Request) -> web.Response:
    call = await begin(request, "pii")
    body, model = call.body, call.model
    texts, _ = _texts(call)
    mode = body.str("mode", "mask") or "mask"
    mask_char = body.str("mask_char", "*")
    replacement = body.str("replacement", None)
    if replacement is not None and "{type}" not in replacement:
        raise InputError("`replacement` must contain {type}, e.g. \"<{type}>\"", param="replacement")
    res = await call.infer(call.pipeline(PiiPipeline).plan_redact, texts, mode=mode, mask_char=mask_char,
                           replacement=replacement, **_options(body))
    det = res.detection
    results = [{"text": r, "entities": [e.to_json() for e in ents]}
               for r, ents in zip(res.texts, det.entities, strict=True)]
    return json_response({"object": "pii.redaction", "model": model.name, "results": results,
                          "usage": usage(det.tokens)})
