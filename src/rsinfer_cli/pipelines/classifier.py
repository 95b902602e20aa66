"""Text classification (`kind: classifier`): one text (or a text pair) → a score for every label of a sequence
classifier (sentiment, intent, toxicity, language ID), as the transformers `text-classification` pipeline computes
it:

    function_to_apply  auto: sigmoid when config.json's problem_type is multi_label_classification or there is one
                       label, none for regression, softmax otherwise;  raw scores: the logits as they are
    labels             config.json id2label, every one sorted by score (ties in label order), or the top k
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import opt
from ..engine.model import LoadedModel
from ..errors import InferenceError, InputError, ModelLoadError
from ..families import Folder
from .base import LOGIT_OUTPUTS, Array, Timed, Timing, Work, id2label, pick_output, sigmoid, softmax, stack
from .text import TextPipeline

FUNCTIONS = ("sigmoid", "softmax", "none")


@dataclass(frozen=True)
class ClassifierOptions:
    """The classifier family's model keys."""

    function_to_apply: str = opt("auto", choices=("auto", *FUNCTIONS))   # auto: the transformers pipeline's rule


def recognise(folder: Folder) -> str | None:
    """A sequence classifier whose labels are named (a cross-encoder's are LABEL_0.. or one score; NLI models have
    entailment and are the zeroshot family's, recognised before this)."""
    arch = folder.architectures
    labels = folder.config.get("id2label") or {}
    if "ForSequenceClassification" not in arch or not isinstance(labels, dict) or not labels:
        return None
    named = [str(v) for v in labels.values() if not str(v).upper().startswith("LABEL_")]
    return f"config.json architectures: {arch}; id2label names {', '.join(named[:4])}" if named else None


def default_function(hf_config: Mapping[str, Any], num_labels: int) -> str:
    """transformers' TextClassificationPipeline default for `function_to_apply`."""
    problem = hf_config.get("problem_type")
    if problem == "regression":
        return "none"
    if problem == "multi_label_classification" or num_labels == 1:
        return "sigmoid"
    return "softmax"


def check_function(value: str | None, param: str = "function_to_apply") -> str | None:
    if value is not None and value.lower() not in FUNCTIONS:
        raise InputError(f"`{param}` must be one of {', '.join(FUNCTIONS)}, got {value!r}", param=param)
    return value.lower() if value is not None else None


@dataclass
class Classified(Timed):
    """Per input: (label, score) for every label, best first (or the top k)."""

    results: list[list[tuple[str, float]]]
    timing: Timing

    def to_json(self) -> list[list[dict[str, Any]]]:
        return [[{"label": label, "score": score} for label, score in r] for r in self.results]


class ClassifierPipeline(TextPipeline):
    kind = "classifier"

    def __init__(self, model: LoadedModel) -> None:
        super().__init__(model)
        opts = model.config.own(ClassifierOptions)
        self.output = pick_output(model, LOGIT_OUTPUTS)
        shape = self.output_shape(self.output)
        self.labels = id2label(model)
        width = shape[-1] if len(shape) == 2 else None
        if len(shape) != 2 or (isinstance(width, int) and width != len(self.labels)):
            raise ModelLoadError(f"model '{model.name}': classifier output '{self.output}' has shape {list(shape)}; "
                                 f"expected [batch, {len(self.labels)}] (one logit per id2label entry)",
                                 model=model.name)
        self.function = (default_function(model.hf_config, len(self.labels)) if opts.function_to_apply == "auto"
                         else opts.function_to_apply)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "output": self.output, "labels": self.labels, "function_to_apply": self.function}

    def reduce(self, out: Array, mask: Array) -> Array:
        return np.asarray(out, dtype=np.float64).reshape(out.shape[0], -1)

    def scores(self, logits: Array, function: str) -> Array:
        if function == "sigmoid":
            return sigmoid(logits)
        if function == "softmax":
            return softmax(logits, axis=-1)
        return logits

    def plan_classify(self, texts: Sequence[str], pairs: Sequence[str] | None = None, *, raw: bool = False,
                      function: str | None = None, top_k: int | None = None, truncate: bool | None = None,
                      direction: str = "right", param: str = "inputs") -> Work[Classified]:
        """`texts` (with `pairs`: text pairs) → every label's score per text, best first; `raw`: the logits;
        `function`: a request's own function_to_apply; `top_k`: only the k best labels."""
        timing = Timing()
        t0 = time.perf_counter()
        enc = self.encoder.encode(texts, pairs, direction=direction, truncate=truncate, param=param)
        timing.tokenize_s = time.perf_counter() - t0
        chosen = "none" if raw else (function or self.function)
        labels = self.labels

        def finish(rows: list[Any]) -> Classified:
            scores = self.scores(stack(rows, len(labels)), chosen)
            if not np.all(np.isfinite(scores)):
                raise InferenceError(f"model '{self.model.name}' produced a non-finite score", model=self.model.name)
            results = []
            for row in scores.tolist():
                order = sorted(range(len(labels)), key=lambda j: -row[j])   # stable: ties keep label order
                results.append([(labels[j], row[j]) for j in (order if top_k is None else order[:top_k])])
            return Classified(results, timing)

        return self.work(enc, finish, timing)

    def classify(self, texts: Sequence[str], **kw: Any) -> Classified:
        return self.run(self.plan_classify(texts, **kw))


def quality(a: ClassifierPipeline, b: ClassifierPipeline, texts: Sequence[str]) -> dict[str, float]:
    """What b loses against a (the quality gate): the share of texts with the same top label, and the largest
    difference of any label's score."""
    ra, rb = a.classify(texts).results, b.classify(texts).results
    agree = sum(x[0][0] == y[0][0] for x, y in zip(ra, rb, strict=True)) / len(ra)
    delta = max(abs(dict(x)[label] - score) for x, y in zip(ra, rb, strict=True) for label, score in y)
    return {"top1_agreement": agree, "max_abs_delta": float(delta)}
