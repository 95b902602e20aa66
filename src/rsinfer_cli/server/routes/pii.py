"""PII detection and redaction: `POST /pii/detect`, `POST /pii/redact` and their `/v1/pii/*` aliases.

Neither the texts nor the spans are ever logged."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from aiohttp import web
from msgspec import Meta

from ...errors import ConfigError, InputError
from ...pipelines import pii
from ...pipelines.pii import PiiPipeline
from ...pipelines.pii_rules import request_rules
from ...pipelines.records import Policy
from ..errors import RequestValidationError
from ..schemas import Model, Op, Probability, Request, Response, Usage
from . import presidio
from .common import Call, begin, check_chars, check_count, json_response, usage

# ---------------------------------------------------------------- request and response bodies


class PiiRequest(Request):
    text: Annotated[str | None, Meta(description="One text (or `texts`)")] = None
    texts: list[str] | None = None
    model: Model = None
    threshold: Probability | None = None
    types: Annotated[list[str] | None, Meta(description="Entity types to keep; unknown types are a 400")] = None
    patterns: Annotated[list[dict[str, Any]] | None, Meta(description=(
        "This request's own pattern recognizers (at most 32): {entity_type, regex (RE2; a string or a list), name, "
        "validator (luhn | iban | stdnum.<module>), context, score}; Presidio's ad-hoc recognizer shape too"))] = None
    allow_list: Annotated[list[str] | None, Meta(description="Values never redacted nor reported (NFKC, any case)"
                                                 )] = None
    allow_list_match: Literal["exact", "regex"] = "exact"
    deny_list: Annotated[dict[str, list[str]] | None, Meta(description="{ENTITY_TYPE: [values]}: always found, as "
                                                            "whole words in any case")] = None
    labels: Annotated[list[str] | None, Meta(description=(
        "An open-label (GLiNER) model: the labels to find instead of its configured ones, as text (at most 64, "
        "1-100 characters each); each answers as its pii_labels type, else as itself written UPPER_SNAKE"))] = None


class RedactRequest(PiiRequest):
    mode: Literal["mask", "remove", "replace", "hash", "pseudonym", "numbered", ""] | None = None
    mask_char: Annotated[str, Meta(min_length=1, max_length=1)] | None = None
    replacement: Annotated[str | None, Meta(description="A template: replace <{type}>, pseudonym <{type}_{hash}>, "
                                                        "numbered <{type}_{n}>")] = None
    records: Annotated[list[dict[str, Any]] | None, Meta(description=(
        "JSON records redacted by `policy` (instead of `text`/`texts`): each answered under `records`"))] = None
    policy: Annotated[dict[str, Any] | None, Meta(description=(
        "A record policy: {default: keep|scan, fields: {path: keep|scan|drop|{action, type, types, threshold, "
        "required}}} (docs: Redacting records)"))] = None


class Entity(Response, omit_defaults=True):
    entity_type: str
    text: Annotated[str, Meta(description="The value found (detect only; redaction never returns it)")]
    score: float
    start: int
    end: int
    scheme: Annotated[str | None, Meta(description="A NATIONAL_ID's scheme (DE_IDNR, FR_NIR, ...)")] = None

    @classmethod
    def of(cls, e: pii.Entity) -> Entity:
        return cls(entity_type=e.entity_type, text=e.text, score=e.score, start=e.start, end=e.end, scheme=e.scheme)


class RedactedSpan(Response):
    entity_type: str
    score: float
    start: int
    end: int
    replacement: str
    redacted_start: int
    redacted_end: int

    @classmethod
    def of(cls, r: pii.Redacted) -> RedactedSpan:
        return cls(entity_type=r.entity_type, score=r.score, start=r.start, end=r.end, replacement=r.replacement,
                   redacted_start=r.redacted_start, redacted_end=r.redacted_end)


class DetectResult(Response, omit_defaults=True):
    entities: list[Entity]
    text: str | None = None


class DetectResponse(Response):
    object: Literal["pii.detection"]
    model: str
    results: list[DetectResult]
    usage: Usage


class RedactResult(Response):
    text: str
    entities: list[RedactedSpan]


class HfEntity(Response):
    """The Hugging Face Inference API's token-classification span (aggregation "simple")."""

    entity_group: str
    score: float
    word: str
    start: int
    end: int


class RecordResult(Response):
    record: dict[str, Any]
    entities: Annotated[dict[str, list[RedactedSpan]], Meta(description="Per changed path (`messages[0].content`)")]


class RedactResponse(Response, omit_defaults=True):
    object: Literal["pii.redaction"]
    model: str
    results: list[RedactResult]
    usage: Usage
    records: list[RecordResult] | None = None


OPS: tuple[Op, ...] = (   # the route table of this family (server/schemas.py), for /openapi.json
    Op(("/pii/detect", "/v1/pii/detect"), "POST", "Find PII (returns the values)", "pii", PiiRequest,
       DetectResponse),
    Op(("/pii/redact", "/v1/pii/redact"), "POST", "Redact PII (never returns a removed value)", "pii",
       RedactRequest, RedactResponse),
    *presidio.OPS,
)


routes = web.RouteTableDef()
for _route in presidio.routes:            # Presidio's REST surface (presidio.py) is this family's too
    assert isinstance(_route, web.RouteDef)
    routes.route(_route.method, _route.path)(_route.handler)
BENCH = {route: (lambda texts: {"texts": texts}) for route in
         ("/pii/detect", "/pii/redact", "/v1/pii/detect", "/v1/pii/redact")}


def _texts(call: Call[PiiRequest]) -> tuple[list[str], bool]:
    text, texts = call.req.text, call.req.texts
    if text is None and texts is None:
        raise RequestValidationError("`text` or `texts` is required", param="text")
    if text is not None and texts is not None:
        raise InputError("provide one of `text` or `texts`, not both", param="texts")
    if texts is not None and not texts:
        raise InputError("`texts` is empty", param="texts")
    if texts:
        check_count(call, "texts", len(texts))
    check_chars(call, "text" if text is not None else "texts", text if text is not None else texts)
    return ([text], False) if text is not None else (texts or [], True)


def _options(call: Call[PiiRequest], texts: list[str]) -> dict[str, Any]:
    """`threshold`, `types` and the request's own rules (patterns, allow and deny lists), checked and compiled now (a
    400 before any work): a typo in `types` must never mean "redact nothing"."""
    req = call.req
    rules = request_rules(req.patterns, req.allow_list, req.allow_list_match, req.deny_list)
    call.pipeline(PiiPipeline).check_options(req.threshold, req.types, rules, texts, req.labels)
    return {"threshold": req.threshold, "types": req.types, "rules": rules, "labels": req.labels}


@routes.post("/pii/detect")
@routes.post("/v1/pii/detect")
async def detect(request: web.Request) -> web.Response:
    call = await begin(request, "pii", PiiRequest)
    model = call.model
    texts, many = _texts(call)
    det = await call.infer(call.pipeline(PiiPipeline).plan_detect, texts, **_options(call, texts))
    results = [DetectResult(entities=[Entity.of(e) for e in ents], text=text if many else None)
               for text, ents in zip(texts, det.entities, strict=True)]
    return json_response(DetectResponse(object="pii.detection", model=model.name, results=results,
                                        usage=usage(det.tokens)))


@routes.post("/pii/redact")
@routes.post("/v1/pii/redact")
async def redact(request: web.Request) -> web.Response:
    rcall = await begin(request, "pii", RedactRequest)
    req, model = rcall.req, rcall.model
    if req.records is not None or req.policy is not None:
        return await _redact_records(rcall)
    call: Call[PiiRequest] = rcall  # type: ignore[assignment]  # a RedactRequest is a PiiRequest
    texts, _ = _texts(call)
    mode = req.mode or "mask"
    mask_char = req.mask_char or "*"
    replacement = req.replacement
    if replacement is not None and mode == "replace" and "{type}" not in replacement:
        raise InputError("`replacement` must contain {type}, e.g. \"<{type}>\"", param="replacement")
    res = await call.infer(call.pipeline(PiiPipeline).plan_redact, texts, mode=mode, mask_char=mask_char,
                           replacement=replacement, **_options(call, texts))
    # never the removed values: each span says where it was and what stands there now
    results = [RedactResult(text=r, entities=[RedactedSpan.of(e) for e in spans])
               for r, spans in zip(res.texts, res.spans, strict=True)]
    return json_response(RedactResponse(object="pii.redaction", model=model.name, results=results,
                                        usage=usage(res.detection.tokens)))


def _check_records(req: RedactRequest) -> None:
    """A records request holds `records` and `policy`, and neither `text`/`texts` nor `labels`."""
    if req.records is None or req.policy is None:
        raise RequestValidationError("`records` and `policy` go together", param="records" if req.records is None
                                     else "policy")
    if req.text is not None or req.texts is not None:
        raise InputError("provide `records` or `text`/`texts`, not both", param="records")
    if req.labels is not None:
        raise InputError("`labels` applies to `text`/`texts`; a record policy's fields are scanned for the model's "
                         "configured labels (pii_labels)", param="labels")


async def _redact_records(rcall: Call[RedactRequest]) -> web.Response:
    """`records` redacted by `policy`: one model request for every field the policy scans."""
    req = rcall.req
    call: Call[PiiRequest] = rcall  # type: ignore[assignment]
    _check_records(req)
    assert req.records is not None
    check_count(call, "records", len(req.records))
    pipe = call.pipeline(PiiPipeline)
    opts = _options(call, [])
    try:
        policy = Policy.of(req.policy, "policy")
        policy.check_types([*pipe.types, *(opts["rules"].types if opts["rules"] is not None else ())])
    except ConfigError as exc:
        raise InputError(exc.message, param="policy") from None
    replacer = pipe.replacer(req.mode or "mask", req.mask_char or "*", req.replacement)
    planned = policy.plan(req.records, lambda i: f"records[{i}]")
    groups = list(planned.texts.items())
    check_chars(call, "records", [t for _, texts in groups for t in texts])
    found: dict[Any, list[list[pii.Entity]]] = {}
    tokens = 0
    if groups:
        asked = [(texts, opts["threshold"] if g[1] is None else g[1], g[0] or opts["types"]) for g, texts in groups]
        det = await call.infer(pipe.plan_detect_groups, asked, opts["rules"])
        at = 0
        for g, texts in groups:
            found[g] = det.entities[at:at + len(texts)]
            at += len(texts)
        tokens = det.tokens
    out = [RecordResult(record=r, entities={p: [RedactedSpan.of(e) for e in spans] for p, spans in s.items()})
           for r, s in planned.redact(found, replacer)]
    return json_response(RedactResponse(object="pii.redaction", model=rcall.model.name, results=[],
                                        usage=usage(tokens), records=out))


async def hf_task(call: Call[Any], inputs: Any, params: dict[str, Any]) -> web.Response:
    """The Hugging Face Inference API for a PII model: token-classification, whole-word spans (aggregation
    "simple"); `parameters.ignore_labels` drops types."""
    if not isinstance(inputs, str):
        raise RequestValidationError("`inputs` must be a string", param="inputs")
    check_chars(call, "inputs", inputs)
    pipe = call.pipeline(PiiPipeline)
    ignore = params.get("ignore_labels")
    types = None
    if isinstance(ignore, list):
        types = [t for t in pipe.types if t not in ignore and f"B-{t}" not in ignore and f"I-{t}" not in ignore]
    det = await call.infer(pipe.plan_detect, [inputs], None, types)
    return json_response([HfEntity(entity_group=e.entity_type, score=e.score, word=e.text, start=e.start, end=e.end)
                          for e in det.entities[0]])
