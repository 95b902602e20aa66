"""PII detection and redaction: `POST /pii/detect`, `POST /pii/redact` and their `/v1/pii/*` aliases.

Neither the texts nor the spans are ever logged."""

from __future__ import annotations

from aiohttp import web

from ...errors import InputError, PayloadTooLarge
from ..request import Body
from .common import begin, json_response

routes = web.RouteTableDef()
MAX_TEXTS = 1024


def _texts(body: Body) -> tuple[list[str], bool]:
    text = body.str("text", None)
    texts = body.str_list("texts", None)
    if (text is None) == (not texts):
        raise InputError("provide exactly one of `text` or non-empty `texts`", param="text" if texts else "texts")
    if texts and len(texts) > MAX_TEXTS:
        raise PayloadTooLarge(f"`texts` has {len(texts)} items; at most {MAX_TEXTS} per request", param="texts")
    return ([text], False) if text is not None else (texts, True)


def _options(body: Body) -> dict:
    threshold = body.number("threshold", None)
    types = body.str_list("types", None)
    return {"threshold": threshold, "types": types}


@routes.post("/pii/detect")
@routes.post("/v1/pii/detect")
async def detect(request: web.Request) -> web.Response:
    call = await begin(request, "pii")
    body, model = call.body, call.model
    texts, many = _texts(body)
    det = await call.infer(call.pipe.plan_detect, texts, **_options(body))
    results = []
    for text, ents in zip(texts, det.entities, strict=True):
        item: dict = {"entities": [e.to_json() for e in ents]}
        if many:
            item["text"] = text
        results.append(item)
    return json_response({"object": "pii.detection", "model": model.name, "results": results,
                          "usage": {"prompt_tokens": det.tokens, "total_tokens": det.tokens}})


@routes.post("/pii/redact")
@routes.post("/v1/pii/redact")
async def redact(request: web.Request) -> web.Response:
    call = await begin(request, "pii")
    body, model = call.body, call.model
    texts, _ = _texts(body)
    mode = body.str("mode", "mask") or "mask"
    mask_char = body.str("mask_char", "*")
    replacement = body.str("replacement", None)
    if replacement is not None and "{type}" not in replacement:
        raise InputError("`replacement` must contain {type}, e.g. \"<{type}>\"", param="replacement")
    res = await call.infer(call.pipe.plan_redact, texts, mode=mode, mask_char=mask_char,
                           replacement=replacement, **_options(body))
    det = res.detection
    results = [{"text": r, "entities": [e.to_json() for e in ents]}
               for r, ents in zip(res.texts, det.entities, strict=True)]
    return json_response({"object": "pii.redaction", "model": model.name, "results": results,
                          "usage": {"prompt_tokens": det.tokens, "total_tokens": det.tokens}})
