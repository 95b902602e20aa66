"""Zero-shot and true/false classification over an encoder-only NLI model.

Zero-shot (`zeroshot_scoring: hf`, the transformers pipeline exactly): one (text, hypothesis) pair per label;
with several labels and `multi_label` off, softmax of the entailment logits across labels; with `multi_label`
(or a single label), per label softmax([contradiction, entailment])[1]. `nli_margin` is rs-infer's formula:
d = entailment - contradiction, softmax(d) across labels, or sigmoid(d) per label.
True/false: P(entailment) against contradiction only, for an assertion (given, or inverted from a question).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import opt
from ..engine.model import LoadedModel
from ..errors import InputError, ModelLoadError, TokenizeError
from .base import LOGIT_OUTPUTS, Array, Timed, Timing, Work, id2label, pick_output, sigmoid, softmax, stack
from .text import Encoded, TextPipeline

AUXILIARIES = frozenset("is are was were do does did can could will would should may might must has have had".split())


def invert_question(question: str) -> str | None:
    """A yes/no question as an assertion ("Is this email important?" → "This email is important."), or None.

    rs-infer's rules: the first word must be an auxiliary; the subject is the next word when two words follow
    it, else the next two; at least one word must remain for the predicate. Unicode-safe."""
    words = question.strip().rstrip("?.!").split()
    if len(words) < 3 or words[0].lower() not in AUXILIARIES:
        return None
    rest = words[1:]
    subject = rest[:1] if len(rest) == 2 else rest[:2]
    predicate = rest[len(subject):]
    if not predicate:
        return None
    head = " ".join(subject)
    return f"{head[:1].upper()}{head[1:]} {words[0].lower()} {' '.join(predicate)}."


def hypothesis(template: str, label: str) -> str:
    return template.replace("{label}", label).replace("{}", label)


def find_label(labels: Sequence[str], wanted: str) -> int | None:
    """Index of the label equal to `wanted` (case-insensitive), else the first containing it."""
    low = [label.lower() for label in labels]
    w = wanted.lower()
    if w in low:
        return low.index(w)
    return next((i for i, label in enumerate(low) if w in label), None)


@dataclass
class ZeroShot:
    labels: list[str]       # sorted by score, highest first (ties in input order)
    scores: list[float]


@dataclass
class ZeroShotResult(Timed):
    results: list[ZeroShot]
    timing: Timing


@dataclass
class TrueFalse:
    assertion: str
    true_probability: float
    is_true: bool

    @property
    def label(self) -> str:
        return "true" if self.is_true else "false"

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "is_true": self.is_true, "true_probability": self.true_probability,
                "assertion": self.assertion}


@dataclass
class TrueFalseResult(Timed):
    results: list[TrueFalse]
    timing: Timing


@dataclass(frozen=True)
class ZeroShotOptions:
    """The zeroshot family's model keys."""

    # each candidate label becomes this hypothesis ({label} or {})
    hypothesis_template: str = "The text is about {label}."
    # the label of config.json's id2label that means entailment
    entailment_label: str = "entailment"
    # the label that means contradiction
    contradiction_label: str = "contradiction"
    # hf: the transformers pipeline's scores; nli_margin: entailment vs contradiction margin
    zeroshot_scoring: str = opt("hf", choices=("hf", "nli_margin"))
    # candidate labels per request; more → 400 (was server.max_candidate_labels)
    max_candidate_labels: int = opt(64, gt=0)

    def check(self) -> list[tuple[str, str]]:
        tpl = self.hypothesis_template
        if "{label}" not in tpl and "{}" not in tpl:
            return [("hypothesis_template", f"must contain {{label}} or {{}}, got {tpl!r}")]
        return []


class ZeroShotPipeline(TextPipeline):
    kind = "zeroshot"

    def __init__(self, model: LoadedModel) -> None:
        super().__init__(model)
        cfg = model.config
        opts = cfg.own(ZeroShotOptions)
        self.max_labels = opts.max_candidate_labels     # per request, on every route
        labels = self.labels = id2label(model)
        ent, con = find_label(labels, opts.entailment_label), find_label(labels, opts.contradiction_label)
        if ent is None or con is None or ent == con:
            missing = opts.entailment_label if ent is None else opts.contradiction_label
            raise ModelLoadError(f"model '{cfg.name}': no '{missing}' label in config.json id2label "
                                 f"{labels}; set entailment_label / contradiction_label", model=cfg.name)
        self.entail, self.contra = ent, con
        self.output = pick_output(model, LOGIT_OUTPUTS)
        shape = self.output_shape(self.output)
        if len(shape) != 2 or (isinstance(shape[-1], int) and shape[-1] != len(labels)):
            raise ModelLoadError(f"model '{cfg.name}': NLI output '{self.output}' has shape {list(shape)}; expected "
                                 f"[batch, {len(labels)}] for the labels {labels}", model=cfg.name)
        self.template = opts.hypothesis_template
        self.scoring = opts.zeroshot_scoring

    def describe(self) -> dict[str, Any]:
        return {"kind": "zeroshot", "output": self.output, "labels": self.labels,
                "entailment": {"index": self.entail, "label": self.labels[self.entail]},
                "contradiction": {"index": self.contra, "label": self.labels[self.contra]},
                "hypothesis_template": self.template, "zeroshot_scoring": self.scoring}

    def reduce(self, out: Array, mask: Array) -> Array:
        pair: Array = np.asarray(out, dtype=np.float64)[:, [self.contra, self.entail]]
        return pair

    def encode_pairs(self, premises: Sequence[str], hypotheses: Sequence[str], timing: Timing,
                     truncate: bool | None = None, param: str = "input") -> Encoded:
        """Pair rows; over max_len the premise is cut, never the hypothesis (while the hypothesis fits)."""
        t0 = time.perf_counter()
        enc = self.encoder
        try:
            rows = enc.encode(premises, hypotheses, strategy="only_first", truncate=truncate, param=param)
        except TokenizeError:  # a hypothesis alone fills max_len: cut the longest side instead
            rows = enc.encode(premises, hypotheses, strategy="longest_first", truncate=truncate, param=param)
        timing.tokenize_s += time.perf_counter() - t0
        return rows

    def plan_classify(self, texts: Sequence[str], labels: Sequence[str], multi_label: bool = False,
                      template: str | None = None, truncate: bool | None = None) -> Work[ZeroShotResult]:
        template = template or self.template
        hyps = [hypothesis(template, label) for label in labels]
        timing = Timing()
        n, k = len(texts), len(labels)
        enc = self.encode_pairs([t for t in texts for _ in labels], hyps * n, timing, truncate)

        def finish(rows: list[Any]) -> ZeroShotResult:
            logits = stack(rows, 2).reshape(n, k, 2)
            contra, entail = logits[..., 0], logits[..., 1]
            if self.scoring == "nli_margin":
                d = entail - contra
                scores = sigmoid(d) if multi_label else softmax(d, axis=1)
            elif multi_label or k == 1:
                scores = softmax(logits, axis=-1)[..., 1]
            else:
                scores = softmax(entail, axis=1)
            results = []
            for row in scores:
                order = sorted(range(k), key=lambda j: (-row[j], j))
                results.append(ZeroShot([labels[j] for j in order], [float(row[j]) for j in order]))
            return ZeroShotResult(results, timing)

        return self.work(enc, finish, timing)

    def plan_true_false(self, texts: Sequence[str], assertion: str, threshold: float = 0.5,
                        truncate: bool | None = None) -> Work[TrueFalseResult]:
        if not 0.0 <= threshold <= 1.0:
            raise InputError(f"`threshold` must be between 0 and 1, got {threshold}", param="threshold")
        timing = Timing()
        enc = self.encode_pairs(list(texts), [assertion] * len(texts), timing, truncate)
        thr = threshold

        def finish(rows: list[Any]) -> TrueFalseResult:
            probs = softmax(stack(rows, 2), axis=-1)[:, 1] if rows else np.empty((0,))
            return TrueFalseResult([TrueFalse(assertion, float(p), bool(p >= thr)) for p in probs], timing)

        return self.work(enc, finish, timing)

    def classify(self, texts: Sequence[str], labels: Sequence[str], multi_label: bool = False,
                 template: str | None = None, truncate: bool | None = None) -> ZeroShotResult:
        return self.run(self.plan_classify(texts, labels, multi_label, template, truncate))

    def true_false(self, texts: Sequence[str], assertion: str, threshold: float = 0.5,
                   truncate: bool | None = None) -> TrueFalseResult:
        return self.run(self.plan_true_false(texts, assertion, threshold, truncate))


def assertion_for(question: str | None, assertion: str | None) -> str:
    """The assertion to judge: a non-blank `assertion`, else the inverted `question`; InputError otherwise."""
    if assertion is not None and assertion.strip():
        return assertion.strip()
    if question is None or not question.strip():
        raise InputError("provide `question` or `assertion`", param="question")
    inverted = invert_question(question)
    if inverted is None:
        raise InputError(f"cannot phrase '{question.strip()}' as an assertion (not a simple yes/no question); pass "
                         "an explicit `assertion` (e.g. \"This email is important.\")", param="question")
    return inverted


QUALITY_LABELS = ("billing", "shipping", "technical support", "account security", "science", "other")


def quality(a: ZeroShotPipeline, b: ZeroShotPipeline, texts: Sequence[str]) -> dict[str, float]:
    """What b loses against a (the quality gate), over fixed candidate labels: the share of texts with the same top
    label, and the largest difference of any label's score."""
    ra = a.classify(texts, QUALITY_LABELS).results
    rb = b.classify(texts, QUALITY_LABELS).results
    agree = sum(x.labels[0] == y.labels[0] for x, y in zip(ra, rb, strict=True)) / len(ra)
    delta = max(abs(dict(zip(x.labels, x.scores, strict=True))[label] - score)
                for x, y in zip(ra, rb, strict=True) for label, score in zip(y.labels, y.scores, strict=True))
    return {"top1_agreement": agree, "max_abs_delta": float(delta)}
