"""Presidio's REST surface, for teams whose clients call `presidio-analyzer` and `presidio-anonymizer`: `POST
/analyze` (the default PII model, its recognizers and rules, a request's `ad_hoc_recognizers` and `allow_list`),
`POST /anonymize` (Presidio's operators over the results a client sends), `GET /supportedentities` and `GET
/recognizers`. Errors are Presidio's body, `{"error": "..."}`.

rsinfer's entity types answer under Presidio's names (`PRESIDIO`): PHONE is PHONE_NUMBER, an address (or one of
its parts) is LOCATION, a given name or surname is PERSON; a type Presidio has no name for keeps rsinfer's. The
no-echo rule holds: `/anonymize` returns the anonymised text and, per item, what now stands there - never a
removed value."""

from __future__ import annotations

import hashlib
import re
from typing import Annotated, Any, Literal

from aiohttp import web
from msgspec import Meta, Struct

from ...errors import InputError
from ...pipelines.pii import ADDRESS_PARTS, Entity, PiiPipeline, rewrite
from ...pipelines.pii_rules import MAX_PATTERNS, request_rules
from ...pipelines.replacer import MAX_REPLACEMENT_CHARS
from ..schemas import Model, Op, Request, Response
from .common import STATE, begin, check_chars, json_response

# rsinfer's entity type (a NATIONAL_ID by its scheme) → Presidio's
PRESIDIO = {"PHONE": "PHONE_NUMBER", "EMAIL": "EMAIL_ADDRESS", "CREDIT_CARD_NUMBER": "CREDIT_CARD",
            "IBAN": "IBAN_CODE", "IP_ADDRESS": "IP_ADDRESS", "URL": "URL", "SSN": "US_SSN",
            "GIVEN_NAME": "PERSON", "SURNAME": "PERSON", "PERSON": "PERSON", "NAME": "PERSON",
            "DRIVERS_LICENSE": "US_DRIVER_LICENSE", "PASSPORT": "US_PASSPORT", "BANK_ACCOUNT": "US_BANK_NUMBER",
            "ROUTING_NUMBER": "ABA_ROUTING_NUMBER", "TAX_ID": "US_ITIN", "DATE": "DATE_TIME", "DATE_TIME": "DATE_TIME",
            "GB_NHS": "UK_NHS", "IT_CF": "IT_FISCAL_CODE", "ES_DNI": "ES_NIF", "ES_NIE": "ES_NIE",
            "IN_AADHAAR": "IN_AADHAAR", "PL_PESEL": "PL_PESEL", **dict.fromkeys(ADDRESS_PARTS, "LOCATION")}
OPERATORS = ("replace", "redact", "mask", "hash", "keep")
RE_FLAGS = {2: "i", 8: "m", 16: "s"}     # Python's re.IGNORECASE, MULTILINE, DOTALL as RE2 inline flags


def presidio_type(e: Entity) -> str:
    return PRESIDIO.get(e.scheme or "", PRESIDIO.get(e.entity_type, e.entity_type))


# ---------------------------------------------------------------- request and response bodies


class AnalyzeRequest(Request):
    text: str
    language: Annotated[str, Meta(description="Accepted as sent; the model and recognizers are language-agnostic "
                                              "as configured")]
    entities: Annotated[list[str] | None, Meta(description="Presidio entity types to return; unknown ones are a "
                                                           "400")] = None
    score_threshold: Annotated[float, Meta(ge=0, le=1)] | None = None
    return_decision_process: bool = False
    ad_hoc_recognizers: list[dict[str, Any]] | None = None
    context: Annotated[list[str] | None, Meta(description="Words that raise the score of the ad-hoc recognizers' "
                                                          "matches near them")] = None
    allow_list: list[str] | None = None
    allow_list_match: Literal["exact", "regex"] = "exact"
    regex_flags: Annotated[int | None, Meta(description="re.IGNORECASE (2), MULTILINE (8), DOTALL (16) for the "
                                                        "ad-hoc recognizers")] = None
    correlation_id: str | None = None
    model: Model = None


class RecognitionMetadata(Response):
    recognizer_name: str
    recognizer_identifier: str


class AnalysisExplanation(Response):
    recognizer: str
    pattern_name: str | None
    pattern: str | None
    original_score: float
    score: float
    textual_explanation: str | None
    score_context_improvement: float
    supportive_context_word: str
    validation_result: bool | None
    regex_flags: int | None


class AnalyzeResult(Response):
    entity_type: str
    start: int
    end: int
    score: float
    analysis_explanation: AnalysisExplanation | None
    recognition_metadata: RecognitionMetadata


class AnalyzerResult(Struct, kw_only=True):
    start: int
    end: int
    entity_type: str
    score: float = 0.0


class OperatorConfig(Struct, kw_only=True):
    type: str
    new_value: str | None = None
    masking_char: str | None = None
    chars_to_mask: int | None = None
    from_end: bool = False
    hash_type: str | None = None


class AnonymizeRequest(Request):
    text: str
    analyzer_results: list[AnalyzerResult]
    anonymizers: Annotated[dict[str, OperatorConfig] | None, Meta(description="By entity type, or DEFAULT")] = None


class AnonymizeItem(Response):
    start: int
    end: int
    entity_type: str
    text: Annotated[str, Meta(description="What stands there now (never the removed value)")]
    operator: str


class AnonymizeResponse(Response):
    text: str
    items: list[AnonymizeItem]


OPS: tuple[Op, ...] = (   # Presidio's error body is KServe's shape too: {"error": "..."}
    Op(("/analyze",), "POST", "Presidio analyzer: the PII spans of a text (Presidio's entity names)", "pii",
       AnalyzeRequest, list[AnalyzeResult], errors="kserve"),
    Op(("/anonymize",), "POST", "Presidio anonymizer: replace, redact, mask, hash or keep the given spans", "pii",
       AnonymizeRequest, AnonymizeResponse, errors="kserve"),
    Op(("/supportedentities",), "GET", "Presidio: the entity types /analyze can return", "pii",
       response=list[str], errors="kserve"),
    Op(("/recognizers",), "GET", "Presidio: the recognizers /analyze runs", "pii", response=list[str],
       errors="kserve"),
)

routes = web.RouteTableDef()


# ---------------------------------------------------------------- /analyze


def _flags(regex_flags: int | None) -> str:
    """Python's re flags of a Presidio request as RE2's inline flags ("(?i)"); a flag RE2 has not is a 400."""
    if not regex_flags:
        return ""
    if regex_flags & ~sum(RE_FLAGS):
        raise InputError(f"regex_flags {regex_flags}: only re.IGNORECASE (2), re.MULTILINE (8) and re.DOTALL (16) "
                         "have RE2 equivalents", param="regex_flags")
    return "(?" + "".join(f for bit, f in RE_FLAGS.items() if regex_flags & bit) + ")"


def _ad_hoc(req: AnalyzeRequest) -> tuple[list[dict[str, Any]] | None, dict[str, list[str]] | None]:
    """The ad-hoc recognizers as the request's patterns (with its context words and regex flags applied) and deny
    lists (Presidio's deny-list recognizer: `supported_entity` and `deny_list`)."""
    flags = _flags(req.regex_flags)
    patterns: list[dict[str, Any]] = []
    _check_count(len(req.ad_hoc_recognizers or ()))
    deny: dict[str, list[str]] = {}
    for i, raw in enumerate(req.ad_hoc_recognizers or ()):
        values = raw.get("deny_list")
        if values is not None:
            etype = raw.get("supported_entity")
            if not isinstance(etype, str) or not isinstance(values, list) or \
                    not all(isinstance(v, str) for v in values):
                raise InputError(f"ad_hoc_recognizers[{i}]: a deny-list recognizer needs `supported_entity` and "
                                 "`deny_list` (a list of strings)", param="ad_hoc_recognizers")
            deny.setdefault(etype, []).extend(values)
            if not raw.get("patterns"):
                continue
        _check_context(raw.get("context") or [], i)
        item = dict(raw)
        if flags and isinstance(item.get("patterns"), list):
            item["patterns"] = [{**p, "regex": flags + p["regex"]} if isinstance(p, dict) and
                                isinstance(p.get("regex"), str) else p for p in item["patterns"]]
        item["context"] = [*(item.get("context") or []), *(req.context or [])]
        patterns.append(item)
    return patterns or None, deny or None


def _check_count(n: int) -> None:
    if n > MAX_PATTERNS:
        raise InputError(f"{n} ad_hoc_recognizers; at most {MAX_PATTERNS} a request", param="ad_hoc_recognizers")


def _check_context(context: Any, i: int) -> None:
    """An ad-hoc recognizer's `context`: a list of words (a string, a number or a mapping is a 400)."""
    if not isinstance(context, list) or not all(isinstance(w, str) for w in context):
        raise InputError(f"ad_hoc_recognizers[{i}].context: a list of words (strings)", param="ad_hoc_recognizers")


def _joined(text: str, entities: list[Entity]) -> list[Entity]:
    """Spans that name one thing in Presidio and stand next to each other (a given name and a surname, separated
    by spaces only) as one: Presidio's NER returns "Jane Roe" as one PERSON. The score is the lower one's."""
    out: list[Entity] = []
    for e in entities:
        last = out[-1] if out else None
        if last is not None and presidio_type(last) == presidio_type(e) == "PERSON" and \
                last.end <= e.start and not text[last.end:e.start].strip():
            out[-1] = Entity("PERSON", text[last.start:e.end], min(last.score, e.score), last.start, e.end,
                             source=last.source)
            continue
        out.append(e)
    return out


def _explanation(e: Entity) -> AnalysisExplanation:
    return AnalysisExplanation(recognizer=e.source, pattern_name=None, pattern=None, original_score=e.score,
                               score=e.score, textual_explanation=f"found by {e.source}", score_context_improvement=0,
                               supportive_context_word="", validation_result=None, regex_flags=None)


@routes.post("/analyze")
async def analyze(request: web.Request) -> web.Response:
    call = await begin(request, "pii", AnalyzeRequest)
    req = call.req
    check_chars(call, "text", [req.text])
    pipe = call.pipeline(PiiPipeline)
    patterns, deny = _ad_hoc(req)
    rules = request_rules(patterns, req.allow_list, req.allow_list_match, deny)
    known = supported(pipe) | set(rules.types if rules is not None else ())
    if req.entities is not None:
        unknown = [t for t in req.entities if t not in known]
        if unknown:
            raise InputError(f"unknown entities {', '.join(unknown)}; /supportedentities lists "
                             f"{', '.join(sorted(known))}", param="entities")
    det = await call.infer(pipe.plan_detect, [req.text], None, None, rules)
    floor = req.score_threshold or 0.0
    out = [AnalyzeResult(entity_type=presidio_type(e), start=e.start, end=e.end, score=e.score,
                         analysis_explanation=_explanation(e) if req.return_decision_process else None,
                         recognition_metadata=RecognitionMetadata(recognizer_name=e.source,
                                                                  recognizer_identifier=f"rsinfer-{e.source}"))
           for e in _joined(req.text, det.entities[0])
           if e.score >= floor and (req.entities is None or presidio_type(e) in req.entities)]
    return json_response(out)


def supported(pipe: PiiPipeline) -> set[str]:
    out = {PRESIDIO.get(t, t) for t in pipe.types}
    if "NATIONAL_ID" in pipe.types:
        out |= {PRESIDIO[s] for s in ("GB_NHS", "IT_CF", "ES_DNI", "ES_NIE", "IN_AADHAAR", "PL_PESEL")}
    return out


def default_pipeline(request: web.Request) -> PiiPipeline:
    """The default PII model's pipeline (Presidio's requests name no model)."""
    state = request.app[STATE]
    pipe = state.pipelines[state.registry.get(None, "pii").key]
    assert isinstance(pipe, PiiPipeline)
    return pipe


@routes.get("/supportedentities")
async def supported_entities(request: web.Request) -> web.Response:
    return json_response(sorted(supported(default_pipeline(request))))


@routes.get("/recognizers")
async def recognizers(request: web.Request) -> web.Response:
    pipe = default_pipeline(request)
    return json_response(["model", *pipe.recognizers, *(p.name for p in pipe.rules.patterns),
                          *(["deny_list"] if pipe.rules.deny else [])])


# ---------------------------------------------------------------- /anonymize


def _checked(cfg: OperatorConfig, etype: str) -> OperatorConfig:
    """An anonymizer's settings, checked (a 400 naming the entity type and what is wrong)."""
    kind = cfg.type
    if kind not in OPERATORS:
        why = "encrypt and decrypt need a key store rsinfer does not keep" if kind in ("encrypt", "decrypt") else \
            f"one of {', '.join(OPERATORS)}"
        raise InputError(f"anonymizers.{etype}.type '{kind}' is not supported: {why}", param="anonymizers")
    if kind == "mask":
        if cfg.masking_char is None or len(cfg.masking_char) != 1:
            raise InputError(f"anonymizers.{etype}: mask needs `masking_char`, one character", param="anonymizers")
        if cfg.chars_to_mask is None or cfg.chars_to_mask < 0:
            raise InputError(f"anonymizers.{etype}: mask needs `chars_to_mask` >= 0", param="anonymizers")
    if cfg.new_value is not None and len(cfg.new_value) > MAX_REPLACEMENT_CHARS:
        raise InputError(f"anonymizers.{etype}.new_value has {len(cfg.new_value)} characters; at most "
                         f"{MAX_REPLACEMENT_CHARS}", param="anonymizers")
    if kind == "hash" and (cfg.hash_type or "sha256") not in ("sha256", "sha512"):
        raise InputError(f"anonymizers.{etype}.hash_type must be sha256 or sha512", param="anonymizers")
    return cfg


def _apply(cfg: OperatorConfig, value: str, etype: str, salt: bytes) -> str:
    kind = cfg.type
    if kind == "replace":
        return cfg.new_value if cfg.new_value is not None else f"<{etype}>"
    if kind == "redact":
        return ""
    if kind == "keep":
        return value
    if kind == "hash":
        algo = hashlib.sha512 if cfg.hash_type == "sha512" else hashlib.sha256
        return algo(salt + value.encode("utf-8")).hexdigest()
    n = min(cfg.chars_to_mask or 0, len(value))                     # mask
    char = cfg.masking_char or "*"
    return value[:len(value) - n] + char * n if cfg.from_end else char * n + value[n:]


@routes.post("/anonymize")
async def anonymize(request: web.Request) -> web.Response:
    """Presidio's anonymizer over the spans the client sends: no model runs. Overlapping spans: one inside a longer
    one is covered by it; otherwise the first by start wins."""
    call = await begin(request, "pii", AnonymizeRequest, named=False)
    req = call.req
    text = req.text
    check_chars(call, "text", [text])
    operators = {k: _checked(v, k) for k, v in (req.anonymizers or {}).items()}
    default = operators.get("DEFAULT", OperatorConfig(type="replace"))
    spans = []
    for i, r in enumerate(req.analyzer_results):
        if not 0 <= r.start < r.end <= len(text):
            raise InputError(f"analyzer_results[{i}]: start {r.start} and end {r.end} do not lie in the text "
                             f"({len(text)} characters)", param="analyzer_results")
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", r.entity_type):
            raise InputError(f"analyzer_results[{i}].entity_type '{r.entity_type}' is not an entity type",
                             param="analyzer_results")
        spans.append(Entity(r.entity_type, "", r.score, r.start, r.end))
    salt = call.pipeline(PiiPipeline).salt

    def new_value(e: Entity, value: str) -> str:
        return _apply(operators.get(e.entity_type, default), value, e.entity_type, salt)

    out, done = rewrite(text, spans, new_value, "anonymizers")
    items = [AnonymizeItem(start=a, end=b, entity_type=e.entity_type, text=new,
                           operator=operators.get(e.entity_type, default).type) for e, new, a, b in done]
    return json_response(AnonymizeResponse(text=out, items=items))
