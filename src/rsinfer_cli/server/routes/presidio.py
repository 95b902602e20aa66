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

from ...errors import InputError, PayloadTooLarge
from ...pipelines import cipher
from ...pipelines.pii import ADDRESS_PARTS, ANSWER_GROWTH, ANSWER_SLACK, Entity, PiiPipeline, answer_limit
from ...pipelines.pii_rules import MAX_PATTERNS, request_rules
from ...pipelines.replacer import MAX_REPLACEMENT_CHARS
from ..errors import RequestValidationError
from ..schemas import Model, Op, Request, Response
from .common import STATE, begin, check_chars, check_count, json_response

# rsinfer's entity type (a NATIONAL_ID by its scheme) → Presidio's
PRESIDIO = {"PHONE": "PHONE_NUMBER", "EMAIL": "EMAIL_ADDRESS", "CREDIT_CARD_NUMBER": "CREDIT_CARD",
            "IBAN": "IBAN_CODE", "IP_ADDRESS": "IP_ADDRESS", "URL": "URL", "SSN": "US_SSN",
            "GIVEN_NAME": "PERSON", "SURNAME": "PERSON", "PERSON": "PERSON", "NAME": "PERSON",
            "DRIVERS_LICENSE": "US_DRIVER_LICENSE", "PASSPORT": "US_PASSPORT", "BANK_ACCOUNT": "US_BANK_NUMBER",
            "ROUTING_NUMBER": "ABA_ROUTING_NUMBER", "TAX_ID": "US_ITIN", "DATE": "DATE_TIME", "DATE_TIME": "DATE_TIME",
            "GB_NHS": "UK_NHS", "IT_CF": "IT_FISCAL_CODE", "ES_DNI": "ES_NIF", "ES_NIE": "ES_NIE",
            "IN_AADHAAR": "IN_AADHAAR", "PL_PESEL": "PL_PESEL", **dict.fromkeys(ADDRESS_PARTS, "LOCATION")}
OPERATORS = ("replace", "redact", "mask", "hash", "keep", "encrypt", "pseudonym")
LISTED = ["hash", "mask", "redact", "replace", "encrypt", "custom"]   # Presidio's GET /anonymizers, as it answers
RE_FLAGS = {2: "i", 8: "m", 16: "s"}     # Python's re.IGNORECASE, MULTILINE, DOTALL as RE2 inline flags
DEFAULT_FLAGS = 2 | 8 | 16               # Presidio's default regex_flags: IGNORECASE | MULTILINE | DOTALL


def presidio_type(e: Entity) -> str:
    return PRESIDIO.get(e.scheme or "", PRESIDIO.get(e.entity_type, e.entity_type))


# ---------------------------------------------------------------- request and response bodies


class AnalyzeRequest(Request):
    text: Annotated[str | list[str], Meta(description="A text, or a list of texts (Presidio's batch form: one "
                                                      "result list per text)")]
    language: Annotated[str, Meta(description="One of the model's pii_languages (default en); another is a 400")]
    entities: Annotated[list[str] | None, Meta(description=(
        "Presidio entity types to return; empty or absent: all; a type no recognizer finds is ignored, except on "
        "an open-label (GLiNER) model, which is also asked for it as a label (at most 64 labels in all)"))] = None
    score_threshold: Annotated[float, Meta(ge=0, le=1)] | None = None
    return_decision_process: bool | int = False
    ad_hoc_recognizers: list[dict[str, Any]] | None = None
    context: Annotated[list[str] | None, Meta(description="Words that raise the score of the ad-hoc recognizers' "
                                                          "matches near them")] = None
    allow_list: list[str] | None = None
    allow_list_match: Literal["exact", "regex"] = "exact"
    regex_flags: Annotated[int | None, Meta(description="re.IGNORECASE (2), MULTILINE (8), DOTALL (16) for the "
                                                        "ad-hoc recognizers and a regex allow list (default 26: all "
                                                        "three, as Presidio)")] = None
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
    salt: Annotated[str | None, Meta(description="hash: at least 16 bytes (default: the model's salt)")] = None
    key: Annotated[str | None, Meta(description="encrypt / decrypt: the AES key, 16, 24 or 32 bytes")] = None


class AnonymizeRequest(Request):
    text: str
    analyzer_results: list[AnalyzerResult]
    anonymizers: Annotated[dict[str, OperatorConfig] | None, Meta(description="By entity type, or DEFAULT")] = None


class DeanonymizeRequest(Request):
    text: str = ""
    deanonymizers: Annotated[dict[str, OperatorConfig] | None, Meta(description="decrypt, by entity type or "
                                                                                "DEFAULT")] = None
    anonymizer_results: list[AnalyzerResult] = []


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
    Op(("/analyze",), "POST", "Presidio analyzer: the PII spans of a text, or of each of a list of texts "
       "(Presidio's entity names)", "pii", AnalyzeRequest, list[AnalyzeResult | list[AnalyzeResult]],
       errors="kserve"),
    Op(("/anonymize",), "POST", "Presidio anonymizer: replace, redact, mask, hash or keep the given spans", "pii",
       AnonymizeRequest, AnonymizeResponse, errors="kserve"),
    Op(("/deanonymize",), "POST", "Presidio: decrypt the spans `encrypt` made, with the key the request gives",
       "pii", DeanonymizeRequest, AnonymizeResponse, errors="kserve"),
    Op(("/anonymizers",), "GET", "Presidio: the anonymizers /anonymize lists", "pii", response=list[str],
       errors="kserve"),
    Op(("/deanonymizers",), "GET", "Presidio: the deanonymizers /deanonymize runs", "pii", response=list[str],
       errors="kserve"),
    Op(("/supportedentities",), "GET", "Presidio: the entity types /analyze can return", "pii",
       response=list[str], errors="kserve"),
    Op(("/recognizers",), "GET", "Presidio: the recognizers /analyze runs", "pii", response=list[str],
       errors="kserve"),
)

routes = web.RouteTableDef()


# ---------------------------------------------------------------- /analyze


def _flags(regex_flags: int | None) -> str:
    """Python's re flags of a Presidio request as RE2's inline flags ("(?i)"); a flag RE2 has not is a 400. None:
    Presidio's default, IGNORECASE | MULTILINE | DOTALL."""
    if regex_flags is None:
        regex_flags = DEFAULT_FLAGS
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
    """How a result was found and scored: a pattern's name and expression, and the context word that raised it."""
    f = e.found
    if f is None or f.regex is None:
        return AnalysisExplanation(recognizer=e.source, pattern_name=None, pattern=None, original_score=e.score,
                                   score=e.score, textual_explanation=f"found by {e.source}",
                                   score_context_improvement=0, supportive_context_word="", validation_result=None,
                                   regex_flags=None)
    original = f.original_score if f.original_score is not None else e.score
    pattern = re.sub(r"^\(\?[ims]+\)", "", f.regex)       # the request's expression, without the flags we added
    return AnalysisExplanation(recognizer=e.source, pattern_name=e.source, pattern=pattern, original_score=original,
                               score=e.score, textual_explanation=f"Detected by `{e.source}` using pattern "
                               f"`{e.source}`", score_context_improvement=e.score - original,
                               supportive_context_word=f.context_word, validation_result=None, regex_flags=None)


def _check_language(pipe: PiiPipeline, language: str | None) -> None:
    """A language the model is not configured for is a 400 (Presidio answers it with a 500)."""
    if language is not None and language not in pipe.languages:
        raise InputError(f"language '{language}' is not supported: this model serves {', '.join(pipe.languages)} "
                         "(its pii_languages)", param="language")


@routes.post("/analyze")
async def analyze(request: web.Request) -> web.Response:
    """One text, or Presidio's batch form (a list of texts: one result list each), through one model request."""
    call = await begin(request, "pii", AnalyzeRequest)
    req = call.req
    texts = req.text if isinstance(req.text, list) else [req.text]
    check_count(call, "text", len(texts))
    check_chars(call, "text", texts)
    pipe = call.pipeline(PiiPipeline)
    _check_language(pipe, req.language)
    patterns, deny = _ad_hoc(req)
    allow = req.allow_list
    if allow and req.allow_list_match == "regex":
        allow = [_flags(req.regex_flags) + a for a in allow]
    rules = request_rules(patterns, allow, req.allow_list_match, deny)
    wanted = set(req.entities) if req.entities else None     # [] is every entity, as in Presidio
    floor = req.score_threshold or 0.0
    # an open-label model is also asked for each entity none of its labels answers as (Presidio's GLiNERRecognizer)
    labels = pipe.open_labels(req.entities, lambda t: PRESIDIO.get(t, t)) if req.entities else None
    det = await call.infer(pipe.plan_detect, texts, None, None, rules, floor, labels)
    explain = bool(req.return_decision_process)
    out = [[AnalyzeResult(entity_type=presidio_type(e), start=e.start, end=e.end, score=e.score,
                          analysis_explanation=_explanation(e) if explain else None)
            for e in _joined(text, ents) if e.score >= floor and (wanted is None or presidio_type(e) in wanted)]
           for text, ents in zip(texts, det.entities, strict=True)]
    return json_response(out if isinstance(req.text, list) else out[0])


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
    pipe = default_pipeline(request)
    _check_language(pipe, request.query.get("language"))
    return json_response(sorted(supported(pipe)))


@routes.get("/recognizers")
async def recognizers(request: web.Request) -> web.Response:
    pipe = default_pipeline(request)
    _check_language(pipe, request.query.get("language"))
    return json_response(["model", *pipe.recognizers, *(p.name for p in pipe.rules.patterns),
                          *(["deny_list"] if pipe.rules.deny else [])])


# ---------------------------------------------------------------- /anonymize and /deanonymize
#
# Presidio's anonymizer semantics, as its engine documents them: results of one type that intersect become one
# (their union, the higher score); a result inside another is dropped (of equal ones the higher score stays, the
# later on a tie); results of one type with only spaces between them become one; then the operators run from the
# last result to the first, each on its whole original value, each replacing the text from its start to where the
# result after it began - so of two overlapping results neither leaves a character readable unless it is `keep`.


class Span:
    __slots__ = ("start", "end", "entity_type", "score")

    def __init__(self, start: int, end: int, entity_type: str, score: float) -> None:
        self.start, self.end, self.entity_type, self.score = start, end, entity_type, score


def _merge_same_type(spans: list[Span]) -> list[Span]:
    by_type: dict[str, list[tuple[int, Span]]] = {}
    for pos, sp in enumerate(spans):
        by_type.setdefault(sp.entity_type, []).append((pos, sp))
    kept: list[tuple[int, Span]] = []
    for group in by_type.values():
        group.sort(key=lambda item: (item[1].start, item[1].end))
        pos, cur = group[0]
        for nxt_pos, nxt in group[1:]:
            if cur.end < nxt.start or nxt.end < cur.start or min(cur.end, nxt.end) - max(cur.start, nxt.start) == 0:
                kept.append((pos, cur))
                pos, cur = nxt_pos, nxt
                continue
            cur.start, cur.end = min(cur.start, nxt.start), max(cur.end, nxt.end)
            cur.score, pos = max(cur.score, nxt.score), max(pos, nxt_pos)
        kept.append((pos, cur))
    kept.sort(key=lambda item: item[0])
    return [sp for _, sp in kept]


def _drop_contained(spans: list[Span]) -> list[Span]:
    order = sorted(range(len(spans)), key=lambda i: (spans[i].start, -spans[i].end))
    dropped: set[int] = set()
    furthest: int | None = None
    g = 0
    while g < len(order):
        first = spans[order[g]]
        h = g
        while h < len(order) and (spans[order[h]].start, spans[order[h]].end) == (first.start, first.end):
            h += 1
        group = order[g:h]
        if furthest is not None and furthest >= first.end:
            dropped.update(group)
        else:
            best = max(group, key=lambda i: (spans[i].score, i))
            dropped.update(i for i in group if i != best)
        furthest = first.end if furthest is None else max(furthest, first.end)
        g = h
    return [sp for i, sp in enumerate(spans) if i not in dropped]


def _merge_spaced(text: str, spans: list[Span]) -> list[Span]:
    out: list[Span] = []
    prev: Span | None = None
    for sp in spans:
        gap = text[prev.end:sp.start] if prev is not None else ""
        if prev is not None and prev.entity_type == sp.entity_type and gap and not gap.strip(" "):
            out.remove(prev)
            sp.start = prev.start
        out.append(sp)
        prev = sp
    return out


def resolve(text: str, spans: list[Span]) -> list[Span]:
    spans.sort(key=lambda sp: (sp.start, sp.end))
    return _merge_spaced(text, _drop_contained(_merge_same_type(spans)))


def operate(text: str, spans: list[Span], new_value: Any) -> tuple[str, list[tuple[Span, str, int]]]:
    """The operators run from the last span to the first, each replacing the text from its start to where the span
    after it began: (the new text, each span with its new value and where that ends, counted from the text's end).
    Built once from its pieces (linear in the text and the spans, where replacing in place is quadratic)."""
    pieces: list[str] = []            # the new text, from its end
    tail = 0                          # the length of what is built
    last = len(text)
    done: list[tuple[Span, str, int]] = []
    limit = answer_limit(text)
    for sp in sorted(spans, key=lambda sp: sp.start, reverse=True):
        kept = text[min(sp.end, last):last]
        new = new_value(sp, text[sp.start:sp.end])
        pieces += (kept, new)
        tail += len(kept) + len(new)
        last = sp.start
        done.append((sp, new, tail))
        if sp.start + tail > limit:
            raise PayloadTooLarge(f"the anonymized text would be longer than {limit} characters ({ANSWER_GROWTH}x "
                                  f"its input of {len(text)}, plus {ANSWER_SLACK}): the new values are longer than "
                                  "the spans they stand in for; use shorter `anonymizers` values, or mask",
                                  param="anonymizers")
    pieces.append(text[:last])
    return "".join(reversed(pieces)), done


def _checked(cfg: OperatorConfig, etype: str, kinds: tuple[str, ...] = OPERATORS) -> OperatorConfig:
    """An operator's settings, checked (a 400 naming the entity type and what is wrong)."""
    kind = cfg.type
    if kind == "custom":      # Presidio's REST API refuses it too: a custom operator is a Python lambda
        raise InputError("Custom type anonymizer is not supported", param="anonymizers")
    # the operators' parameter errors are Presidio's InvalidParamError: a 422
    if kind not in kinds:
        raise RequestValidationError(f"Invalid operator type '{kind}' for {etype}: one of {', '.join(kinds)}",
                         param="anonymizers")
    if kind == "mask" and (cfg.masking_char is None or len(cfg.masking_char) != 1 or cfg.chars_to_mask is None):
        raise RequestValidationError(f"anonymizers.{etype}: mask needs `masking_char` (one character) and "
                                     "`chars_to_mask`", param="anonymizers")
    if cfg.new_value is not None and len(cfg.new_value) > MAX_REPLACEMENT_CHARS:
        raise InputError(f"anonymizers.{etype}.new_value has {len(cfg.new_value)} characters; at most "
                         f"{MAX_REPLACEMENT_CHARS}", param="anonymizers")
    if kind == "hash" and (cfg.hash_type or "sha256") not in ("sha256", "sha512"):
        raise RequestValidationError(f"anonymizers.{etype}.hash_type must be sha256 or sha512", param="anonymizers")
    if kind == "hash" and cfg.salt is not None and len(cfg.salt.encode()) < 16:
        raise RequestValidationError("Salt must be at least 16 bytes (128 bits). Provided salt is "
                                     f"{len(cfg.salt.encode())} bytes.", param="anonymizers")
    if kind in ("encrypt", "decrypt") and (cfg.key is None or len(cfg.key.encode()) * 8 not in (128, 192, 256)):
        raise RequestValidationError("Invalid input, key must be of length 128, 192 or 256 bits", param="anonymizers")
    return cfg


def _apply(cfg: OperatorConfig, value: str, etype: str, pipe: PiiPipeline) -> str:
    kind = cfg.type
    if kind == "replace":
        return cfg.new_value or f"<{etype}>"
    if kind in ("redact", "keep"):
        return "" if kind == "redact" else value
    if kind == "hash":
        algo = hashlib.sha512 if cfg.hash_type == "sha512" else hashlib.sha256
        return algo(value.encode("utf-8") + (cfg.salt.encode() if cfg.salt else pipe.salt)).hexdigest()
    if kind == "encrypt":
        return cipher.encrypt((cfg.key or "").encode(), value)
    if kind == "decrypt":
        try:
            return cipher.decrypt((cfg.key or "").encode(), value)
        except ValueError:
            raise InputError(f"{etype}: the text at this span does not decrypt with the key given",
                             param="deanonymizers") from None
    if kind == "pseudonym":
        return pipe.replacer("pseudonym")(etype, value)
    n = max(min(cfg.chars_to_mask or 0, len(value)), 0)                # mask
    char = cfg.masking_char or "*"
    return value[:len(value) - n] + char * n if cfg.from_end else char * n + value[n:]


def _spans(text: str, results: list[AnalyzerResult]) -> list[Span]:
    spans = []
    for i, r in enumerate(results):
        if not 0 <= r.start <= r.end <= len(text):
            raise InputError(f"analyzer_results[{i}]: start {r.start} and end {r.end} do not lie in the text "
                             f"({len(text)} characters)", param="analyzer_results")
        if not re.fullmatch(r"[A-Za-z][\w-]*", r.entity_type):
            raise InputError(f"analyzer_results[{i}].entity_type '{r.entity_type}' is not an entity type",
                             param="analyzer_results")
        spans.append(Span(r.start, r.end, r.entity_type, r.score))
    return spans


def _answer(text: str, spans: list[Span], operators: dict[str, OperatorConfig], default: OperatorConfig | None,
            pipe: PiiPipeline) -> web.Response:
    def op(sp: Span) -> OperatorConfig:
        cfg = operators.get(sp.entity_type, default)
        if cfg is None:
            raise InputError(f"no operator for {sp.entity_type} and no DEFAULT", param="deanonymizers")
        return cfg

    out, done = operate(text, spans, lambda sp, value: _apply(op(sp), value, sp.entity_type, pipe))
    items = [AnonymizeItem(start=len(out) - from_end, end=len(out) - from_end + len(new), entity_type=sp.entity_type,
                           text=new, operator=op(sp).type) for sp, new, from_end in done]
    return json_response(AnonymizeResponse(text=out, items=items))


@routes.post("/anonymize")
async def anonymize(request: web.Request) -> web.Response:
    """Presidio's anonymizer over the spans the client sends: no model runs."""
    call = await begin(request, "pii", AnonymizeRequest, named=False)
    req = call.req
    check_chars(call, "text", [req.text])
    operators = {k: _checked(v, k) for k, v in (req.anonymizers or {}).items()}
    default = operators.get("DEFAULT", OperatorConfig(type="replace"))
    spans = resolve(req.text, _spans(req.text, req.analyzer_results))
    return _answer(req.text, spans, operators, default, call.pipeline(PiiPipeline))


@routes.post("/deanonymize")
async def deanonymize(request: web.Request) -> web.Response:
    """Presidio's deanonymizer: `decrypt` with the key in the request (no key store); the spans as given."""
    body = await request.read()
    if not body.strip() or body.strip() in (b"{}", b"{ }"):
        raise InputError("Invalid request json", param="text")
    call = await begin(request, "pii", DeanonymizeRequest, named=False)
    req = call.req
    check_chars(call, "text", [req.text])
    operators = {k: _checked(v, k, ("decrypt",)) for k, v in (req.deanonymizers or {}).items()}
    spans = _spans(req.text, req.anonymizer_results)
    return _answer(req.text, spans, operators, operators.get("DEFAULT"), call.pipeline(PiiPipeline))


@routes.get("/anonymizers")
async def anonymizers(request: web.Request) -> web.Response:
    """Presidio's list as Presidio answers it (`keep` and rsinfer's `pseudonym` are accepted too)."""
    return json_response(LISTED)


@routes.get("/deanonymizers")
async def deanonymizers(request: web.Request) -> web.Response:
    return json_response(["decrypt"])
