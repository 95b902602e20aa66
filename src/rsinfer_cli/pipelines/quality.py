"""The quality gate: one model's pipeline over two graphs (fp32 and its int8, or one graph on two execution
providers), on the same inputs, and what the second loses - measured by each family's own `quality(a, b, corpus)`
(Family.quality), beside the speed ratio of the two.

    embedding    mean and min cosine of each text's two vectors; top-10 neighbour recall over the corpus
    rerank       Spearman ρ of each query's document scores (mean, min); top-1 agreement
    classifier   top label agreement; max |Δ score| over every label
    zeroshot     top label agreement over fixed candidate labels; max |Δ score|
    pii          span F1 (type, start, end) of the second graph's spans against the first's
    tensor       max absolute and relative error over random inputs

A gate (`--min-cosine 0.99`, `--min-rho`, `--min-agreement`, `--min-f1`, `--min-recall`, `--max-delta`,
`--max-error`) is a bar on one metric; `failed()` says which bars a report misses.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .base import Array, RowPipeline
from .stmodules import l2_normalize

# gate flag → (metric, whether the metric must be at least the bar (True) or at most it (False))
GATES: dict[str, tuple[str, bool]] = {
    "min_cosine": ("min_cosine", True), "min_recall": ("top10_recall", True), "min_rho": ("mean_spearman", True),
    "min_agreement": ("top1_agreement", True), "min_f1": ("span_f1", True), "max_delta": ("max_abs_delta", False),
    "max_error": ("max_abs_error", False),
}

_SUBJECTS = ("my order", "the invoice", "our server", "the train to Lyon", "your password", "the new policy",
             "the quarterly report", "this laptop", "the API key", "the refund", "the hotel booking",
             "the blood test", "the pull request", "the contract", "the flight", "the warranty")
_EVENTS = ("arrived two days late", "shows the wrong amount", "keeps crashing after the update",
           "was cancelled without notice", "must be reset every ninety days", "takes effect in March",
           "beat the forecast by four percent", "overheats when charging", "expired last week",
           "has not reached my account", "was moved to another date", "came back normal",
           "breaks the build on Windows", "renews automatically each year", "is delayed by fog",
           "does not cover water damage")
_ASKS = ("What should I do?", "Can you help?", "Who do I contact?", "Is this expected?", "How long will it take?",
         "Please advise.", "Thanks in advance.", "")
_TOPICS = ("Photosynthesis turns light into chemical energy in plants.",
           "The printing press spread ideas across Europe in the fifteenth century.",
           "Interest rates rose for the third time this year.",
           "The striker scored twice in the second half.",
           "Mount Everest is the highest mountain above sea level.",
           "Regular exercise lowers the risk of heart disease.",
           "The museum opens at nine and is closed on Mondays.",
           "Rust guarantees memory safety without a garbage collector.",
           "Paris is the capital of France.", "Water boils at one hundred degrees Celsius at sea level.")
_PEOPLE = ("Jane Doe", "Carlos Martinez", "Aiko Tanaka", "Peter Smith", "Fatima Khan")
_PII = ("Please call {p} at +1 415 555 0{n:03d} tomorrow.", "Send the contract to {e} before Friday.",
        "{p} lives at {n} Main Street, Springfield.", "My name is {p} and my email is {e}.")


def corpus(n: int = 300, seed: int = 11) -> list[str]:
    """A few hundred varied texts: support requests, facts, people with contact details; deterministic."""
    rng = random.Random(seed)
    out = list(_TOPICS)
    while len(out) < n:
        k = rng.random()
        if k < 0.6:
            out.append(f"{rng.choice(_SUBJECTS).capitalize()} {rng.choice(_EVENTS)}. {rng.choice(_ASKS)}".strip())
        elif k < 0.8:
            p = rng.choice(_PEOPLE)
            e = p.lower().replace(" ", ".") + "@example.com"
            out.append(rng.choice(_PII).format(p=p, e=e, n=rng.randint(1, 999)))
        else:
            out.append(" ".join(rng.sample(_TOPICS, rng.randint(2, 4))))
    return out[:n]


def queries_and_documents(texts: Sequence[str], n_queries: int = 24, per_query: int = 10,
                          seed: int = 5) -> list[tuple[str, list[str]]]:
    """Rerank inputs from the corpus: a query (the first words of a text) with that text among others."""
    rng = random.Random(seed)
    out = []
    for i in range(min(n_queries, len(texts))):
        target = texts[(i * 7) % len(texts)]
        query = " ".join(target.split()[:5])
        others = rng.sample([t for t in texts if t != target], min(per_query - 1, len(texts) - 1))
        docs = [target, *others]
        rng.shuffle(docs)
        out.append((query, docs))
    return out


# ---------------------------------------------------------------- shared measures


def cosines(a: Array, b: Array) -> Array:
    out: Array = (l2_normalize(a) * l2_normalize(b)).sum(axis=1)
    return out


def neighbour_recall(a: Array, b: Array, k: int = 10) -> float:
    """Mean overlap of each text's k nearest neighbours (cosine, itself left out) under a and under b."""
    def top(v: Array) -> Array:
        n = l2_normalize(v)
        sim = n @ n.T
        np.fill_diagonal(sim, -np.inf)
        out: Array = np.argsort(-sim, axis=1, kind="stable")[:, :k]
        return out

    ta, tb = top(a), top(b)
    return float(np.mean([len(set(x) & set(y)) / k for x, y in zip(ta.tolist(), tb.tolist(), strict=True)]))


def spearman(x: Sequence[float] | Array, y: Sequence[float] | Array) -> float:
    """Spearman's ρ (average ranks for ties); 1.0 when both are constant."""
    def ranks(v: Sequence[float] | Array) -> Array:
        arr = np.asarray(v, dtype=np.float64)
        order = np.argsort(arr, kind="stable")
        r = np.empty(len(arr))
        r[order] = np.arange(len(arr))
        for value in np.unique(arr):              # ties share their mean rank
            idx = arr == value
            r[idx] = r[idx].mean()
        return r

    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return 1.0 if rx.std() == ry.std() else 0.0
    return float(np.corrcoef(rx, ry)[0, 1])


def span_f1(want: Sequence[Sequence[tuple[str, int, int]]], got: Sequence[Sequence[tuple[str, int, int]]]) -> float:
    """Micro F1 of exact (type, start, end) spans; 1.0 when neither has any."""
    tp = fp = fn = 0
    for w, g in zip(want, got, strict=True):
        ws, gs = set(w), set(g)
        tp, fp, fn = tp + len(ws & gs), fp + len(gs - ws), fn + len(ws - gs)
    return 1.0 if tp + fp + fn == 0 else 2 * tp / (2 * tp + fp + fn)


# ---------------------------------------------------------------- the report


Quality = Callable[[Any, Any, Sequence[str]], dict[str, float]]   # (pipeline a, pipeline b, corpus) → metrics


@dataclass
class Report:
    kind: str
    metrics: dict[str, float]
    speed: dict[str, float] = field(default_factory=dict)    # "rows/s a b1", ..., "b / a b1", "b / a b32"

    def failed(self, gates: Mapping[str, float | None]) -> list[str]:
        """Each bar the report misses, for people; a bar on a metric the family does not report is a ValueError."""
        out = []
        for flag, bar in gates.items():
            if bar is None:
                continue
            metric, at_least = GATES[flag]
            if metric not in self.metrics:
                raise ValueError(f"--{flag.replace('_', '-')} gates {metric}, which a {self.kind} model's check does "
                                 f"not measure (it measures {', '.join(self.metrics)})")
            value = self.metrics[metric]
            if (value < bar) if at_least else (value > bar):
                out.append(f"{metric} {value:.6g} {'<' if at_least else '>'} {bar:g} "
                           f"(--{flag.replace('_', '-')})")
        return out


def speed(a: RowPipeline, b: RowPipeline, batches: Sequence[int] = (1, 32), length: int = 48, rounds: int = 2,
          seconds: float = 1.0) -> dict[str, float]:
    """Rows/s of each graph at each batch size (rows of `length` tokens, or the family's unit), interleaved
    a, b, a, b over `rounds` so both see the same machine; the best round of each."""
    best: dict[str, float] = {}
    for _ in range(rounds):
        for batch in batches:
            for name, pipe in (("a", a), ("b", b)):
                rows, _ = pipe.sample_rows(batch, length)
                session = pipe.model.sessions[0]
                pipe.forward(session, rows)                      # warm: first-call allocations
                n, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < seconds and n < 10_000:
                    pipe.forward(session, rows)                  # one forward of `batch` rows
                    n += batch
                rate = n / (time.perf_counter() - t0)
                key = f"rows/s {name} b{batch}"
                best[key] = max(best.get(key, 0.0), rate)
    for batch in batches:
        best[f"b / a b{batch}"] = best[f"rows/s b b{batch}"] / best[f"rows/s a b{batch}"]
    return best


def compare(a_cfg: Any, b_cfg: Any, server: Any, texts: Sequence[str], *, cache_dir: Any = None,
            speed_seconds: float = 1.0, on_step: Callable[[str], None] | None = None) -> Report:
    """Load the model twice (two ModelConfigs: another graph file, or other execution providers), run its
    family's quality check on `texts`, and time both (`speed`, `speed_seconds` per measurement; 0: not timed).
    `on_step` hears each phase start (the CLI's progress): "loading", "checking", "timing"."""
    step = on_step or (lambda _phase: None)
    from .. import families
    from ..engine.model import load_model
    from ..errors import ConfigError

    family = families.get(a_cfg.kind)
    check = family.quality_check()
    if check is None:
        have = ", ".join(f.kind for f in families.all_families() if f.quality is not None)
        raise ConfigError(f"the quality gate does not cover kind {a_cfg.kind} (it covers {have})")
    from . import build_pipeline

    step("loading")
    a = build_pipeline(load_model(a_cfg, server, cache_dir))
    b = build_pipeline(load_model(b_cfg, server, cache_dir))
    step("checking")
    metrics = dict(check(a, b, texts))
    if speed_seconds > 0:
        step("timing")
    return Report(a_cfg.kind, metrics, speed(a, b, seconds=speed_seconds) if speed_seconds > 0 else {})
