"""NLI classification: `POST /classify/zero-shot`, `POST /classify/true-false` and their `/v1/` aliases."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from aiohttp import web
from msgspec import Meta

from ...errors import InputError
from ...pipelines.pii import check_threshold
from ...pipelines.zeroshot import TrueFalse, ZeroShotPipeline, assertion_for
from ..errors import RequestValidationError
from ..schemas import Model, Op, Probability, Request, Response, Usage
from .common import Call, begin, check_chars, check_copied, check_count, json_response, usage

# ---------------------------------------------------------------- request and response bodies


class ZeroShotRequest(Request):
    input: str | list[str]
    candidate_labels: list[str]
    model: Model = None
    multi_label: bool | None = None
    hypothesis_template: Annotated[str | None, Meta(description="With {label} or {}")] = None
    truncate: bool | None = None


class Scored(Response):
    labels: Annotated[list[str], Meta(description="Best first")]
    scores: list[float]


class ZeroShotResponse(Response, omit_defaults=True, kw_only=True):
    """One input: `labels` and `scores`; a list of inputs: `results`, one per input."""

    object: Literal["classification", "classification.list"]
    model: str
    labels: list[str] | None = None
    scores: list[float] | None = None
    results: list[Scored] | None = None
    usage: Usage


class TrueFalseRequest(Request):
    input: str | list[str]
    question: str | None = None
    assertion: str | None = None
    model: Model = None
    threshold: Probability | None = None
    truncate: bool | None = None


class Judged(Response):
    label: Literal["true", "false"]
    is_true: bool
    true_probability: float
    assertion: str

    @classmethod
    def of(cls, r: TrueFalse) -> Judged:
        return cls(label="true" if r.is_true else "false", is_true=r.is_true, true_probability=r.true_probability,
                   assertion=r.assertion)


class TrueFalseResponse(Response, omit_defaults=True, kw_only=True):
    """One input: its judgement's fields; a list of inputs: `results`, one per input."""

    object: Literal["classification.true_false", "classification.true_false.list"]
    model: str
    label: Literal["true", "false"] | None = None
    is_true: bool | None = None
    true_probability: float | None = None
    assertion: str | None = None
    results: list[Judged] | None = None
    usage: Usage


class HfLabel(Response):
    label: str
    score: float


OPS: tuple[Op, ...] = (   # the route table of this family (server/schemas.py), for /openapi.json
    Op(("/classify/zero-shot", "/v1/classify/zero-shot"), "POST", "Zero-shot classification over NLI", "zeroshot",
       ZeroShotRequest, ZeroShotResponse),
    Op(("/classify/true-false", "/v1/classify/true-false"), "POST", "Is an assertion true of each text",
       "zeroshot", TrueFalseRequest, TrueFalseResponse),
)


routes = web.RouteTableDef()
LABELS = ["billing", "shipping", "refund", "other"]
BENCH = {
    "/classify/zero-shot": lambda texts: {"input": texts, "candidate_labels": LABELS},
    "/v1/classify/zero-shot": lambda texts: {"input": texts, "candidate_labels": LABELS},
    "/classify/true-false": lambda texts: {"input": texts, "assertion": "This is about a refund."},
    "/v1/classify/true-false": lambda texts: {"input": texts, "assertion": "This is about a refund."},
}


def _input(call: Call[Any], value: str | list[str]) -> tuple[list[str], bool]:
    if isinstance(value, str):
        check_chars(call, "input", value)
        return [value], True
    if not value:
        raise InputError("`input` is empty", param="input")
    check_count(call, "input", len(value))
    check_chars(call, "input", value)
    return value, False


def check_labels(labels: list[str], key: str, limit: int) -> None:
    """The zero-shot rule for candidate labels, on every route that reaches a zero-shot model (the Hugging Face
    `/models/{name}` one too): not none, at most the model's `max_candidate_labels`, none blank, no duplicates."""
    if not labels:
        raise InputError(f"`{key}` is empty", param=key)
    if len(labels) > limit:
        raise InputError(f"`{key}` has {len(labels)} labels; at most {limit} (max_candidate_labels)",
                         param=key)
    for i, label in enumerate(labels):
        if not label.strip():
            raise InputError(f"`{key}[{i}]` is blank", param=f"{key}[{i}]")
    if len(set(labels)) != len(labels):
        raise InputError(f"`{key}` has duplicates", param=key)


def check_hypotheses(call: Call[Any], labels: list[str], template: str | None, key: str, texts: int) -> None:
    """Each label with its template is a hypothesis paired with every text: each one a text under max_text_chars, and
    all of them, copied onto the texts, within the body's size (check_copied); 413 naming the key."""
    check_chars(call, key, labels)
    extra = len(template or "")
    if extra:
        check_chars(call, key.replace("candidate_labels", "hypothesis_template"), template)
    check_copied(call, key, sum(map(len, labels)) + extra * len(labels), texts)


def check_template(template: str | None, key: str) -> None:
    if template is not None and "{label}" not in template and "{}" not in template:
        raise InputError(f"`{key}` must contain {{label}} or {{}}, e.g. \"This text is about {{label}}.\"",
                         param=key)


@routes.post("/classify/zero-shot")
@routes.post("/v1/classify/zero-shot")
async def zero_shot(request: web.Request) -> web.Response:
    call = await begin(request, "zeroshot", ZeroShotRequest)
    req, model = call.req, call.model
    texts, single = _input(call, req.input)
    labels = req.candidate_labels
    check_labels(labels, "candidate_labels", call.pipeline(ZeroShotPipeline).max_labels)
    template = req.hypothesis_template
    check_template(template, "hypothesis_template")
    check_hypotheses(call, labels, template, "candidate_labels", len(texts))
    res = await call.infer(call.pipeline(ZeroShotPipeline).plan_classify, texts, labels, bool(req.multi_label),
                           template, req.truncate)
    if single:
        (r,) = res.results
        return json_response(ZeroShotResponse(object="classification", model=model.name, labels=r.labels,
                                              scores=r.scores, usage=usage(res.tokens)))
    return json_response(ZeroShotResponse(object="classification.list", model=model.name,
                                          results=[Scored(labels=r.labels, scores=r.scores) for r in res.results],
                                          usage=usage(res.tokens)))


@routes.post("/classify/true-false")
@routes.post("/v1/classify/true-false")
async def true_false(request: web.Request) -> web.Response:
    tcall = await begin(request, "zeroshot", TrueFalseRequest)
    req, model = tcall.req, tcall.model
    texts, single = _input(tcall, req.input)
    question, given = req.question, req.assertion
    if question is None and given is None:
        raise RequestValidationError("`question` or `assertion` is required", param="question")
    check_chars(tcall, "question" if given is None else "assertion", given if given is not None else question)
    assertion = assertion_for(question, given)
    check_copied(tcall, "question" if given is None else "assertion", len(assertion), len(texts))
    threshold = 0.5 if req.threshold is None else req.threshold
    check_threshold(threshold)
    tf = await tcall.infer(tcall.pipeline(ZeroShotPipeline).plan_true_false, texts, assertion, threshold,
                           req.truncate)
    if single:
        j = Judged.of(tf.results[0])
        return json_response(TrueFalseResponse(object="classification.true_false", model=model.name, label=j.label,
                                               is_true=j.is_true, true_probability=j.true_probability,
                                               assertion=j.assertion, usage=usage(tf.tokens)))
    return json_response(TrueFalseResponse(object="classification.true_false.list", model=model.name,
                                           results=[Judged.of(r) for r in tf.results], usage=usage(tf.tokens)))


async def hf_task(call: Call[Any], inputs: Any, params: dict[str, Any]) -> web.Response:
    """The Hugging Face Inference API for an NLI model: zero-shot-classification (`parameters`: candidate_labels,
    multi_label, hypothesis_template) → [{label, score}] best first, under /classify/zero-shot's own rules."""
    if not isinstance(inputs, str):
        raise RequestValidationError("`inputs` must be a string", param="inputs")
    check_chars(call, "inputs", inputs)
    labels = params.get("candidate_labels")
    if isinstance(labels, str):
        labels = [x.strip() for x in labels.split(",") if x.strip()]
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
        raise RequestValidationError("`parameters.candidate_labels` must be an array of labels",
                                     param="parameters.candidate_labels")
    check_labels(labels, "parameters.candidate_labels", call.pipeline(ZeroShotPipeline).max_labels)
    template = params.get("hypothesis_template")
    if template is not None and not isinstance(template, str):
        raise RequestValidationError("`parameters.hypothesis_template` must be a string",
                                     param="parameters.hypothesis_template")
    check_template(template, "parameters.hypothesis_template")
    check_hypotheses(call, labels, template, "parameters.candidate_labels", 1)
    res = await call.infer(call.pipeline(ZeroShotPipeline).plan_classify, [inputs], labels,
                           bool(params.get("multi_label", False)), template)
    r = res.results[0]
    return json_response([HfLabel(label=label, score=s) for label, s in zip(r.labels, r.scores, strict=True)])
