"""`POST /logits`: {input: [texts], model?} → {object: "logits", data: [[logit, ...] per text], model, usage}."""

from __future__ import annotations

from typing import Literal

from aiohttp import web

from rsinfer_cli.errors import InputError
from rsinfer_cli.server.routes.common import begin, check_chars, check_count, json_response, usage
from rsinfer_cli.server.schemas import Model, Op, Request, Response, Usage

from .pipeline import LogitsPipeline


class LogitsRequest(Request):
    input: list[str]
    model: Model = None
    truncate: bool | None = None


class LogitsResponse(Response):
    object: Literal["logits"]
    data: list[list[float]]
    model: str
    usage: Usage


OPS = (Op(("/logits",), "POST", "Raw logits of a sequence classifier (example plug-in)", "logits", LogitsRequest,
          LogitsResponse),)
BENCH = {"/logits": lambda texts: {"input": texts}}
routes = web.RouteTableDef()


@routes.post("/logits")
async def logits(request: web.Request) -> web.Response:
    call = await begin(request, "logits", LogitsRequest)
    texts = call.req.input
    if not texts:
        raise InputError("`input` is empty", param="input")
    check_count(call, "input", len(texts))
    check_chars(call, "input", texts)
    res = await call.infer(call.pipeline(LogitsPipeline).plan, texts, call.req.truncate)
    return json_response(LogitsResponse(object="logits", data=res.rows, model=call.model.name,
                                        usage=usage(res.tokens)))
