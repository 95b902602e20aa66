"""Rerank: (query, document) pairs → one relevance score each, by a rule chosen and checked at load time.

    output [B,1]    sigmoid(l)                 | logit: l
    output [B,2]    softmax(l)[1]              | logit: l1 - l0      (sigmoid: sigmoid(l1 - l0), the same)
    output [B,S,V]  softmax([l_no, l_yes])[1]  | logit: l_yes - l_no   at each row's last real token
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import opt
from ..engine.model import LoadedModel
from ..errors import InferenceError, ModelLoadError, TokenizeError
from .base import (
    LOGIT_OUTPUTS,
    Array,
    RowPipeline,
    Timed,
    Timing,
    Work,
    last_token_index,
    pick_output,
    sigmoid,
    stack,
)
from .text import Encoded, TextPipeline

QUERY_MARGIN = 16             # tokens past max_len a rerank query keeps (bounded_query)
_SPACE = re.compile(r"\s")
ALLOWED = {
    "one": ("sigmoid", "logit"),
    "two": ("softmax", "sigmoid", "logit"),
    "vocab": ("yes_no", "sigmoid", "softmax", "logit"),
}
AUTO = {"one": "sigmoid", "two": "softmax", "vocab": "yes_no"}


@dataclass
class ScoreResult(Timed):
    scores: Array          # float64, one per pair, in input order
    timing: Timing


@dataclass(frozen=True)
class RerankOptions:
    """The rerank family's model keys."""

    # auto: from the output's shape ([B,1] sigmoid, [B,2] softmax, [B,S,V] P(yes)); logit: raw values
    scoring: str = opt("auto", choices=("auto", "logit", "sigmoid", "softmax", "yes_no"))
    # documents per request; more → 413 (was server.max_rerank_documents)
    max_rerank_documents: int = opt(1000, gt=0)


class Reranker(RowPipeline):
    """What the rerank routes (Cohere v1/v2, Jina, TEI, vLLM score, the Hugging Face sentence-similarity task) call:
    the rerank family's cross-encoders implement it, and so does every family that declares `serves=("rerank",)`
    (late_interaction scores by MaxSim). Scores are in the documents' order."""

    kind = "rerank"              # the kind whose routes and commands call it
    max_documents: int           # documents per request (max_rerank_documents), on every route

    def rule(self, raw: bool = False) -> str:
        """How a score is computed, for people."""
        raise NotImplementedError

    def plan_rerank(self, query: str, docs: Sequence[str], *, raw: bool = False, truncate: bool | None = None,
                    direction: str = "right", max_tokens_per_doc: int | None = None) -> Work[ScoreResult]:
        """One query against each document; `raw`: the model's score before any activation."""
        raise NotImplementedError

    def plan_pairs(self, queries: Sequence[str], docs: Sequence[str], *, raw: bool = False,
                   truncate: bool | None = None, direction: str = "right",
                   param: str = "documents") -> Work[ScoreResult]:
        """queries[i] against docs[i]."""
        raise NotImplementedError


class RerankPipeline(TextPipeline, Reranker):
    kind = "rerank"

    def __init__(self, model: LoadedModel) -> None:
        super().__init__(model)
        cfg = model.config
        opts = cfg.own(RerankOptions)
        self.max_documents: int = opts.max_rerank_documents   # per request, on every route
        self.output = pick_output(model, LOGIT_OUTPUTS)
        self.shape = self.output_shape(self.output)
        shape = self.shape
        if len(shape) == 2 and shape[-1] in (1, 2):
            self.layout = "one" if shape[-1] == 1 else "two"
        elif len(shape) == 3:
            self.layout = "vocab"
        else:
            raise ModelLoadError(f"model '{cfg.name}': rerank output '{self.output}' has shape {list(shape)}; "
                                 "expected [batch, 1], [batch, 2] or [batch, seq, vocab]", model=cfg.name)
        self.scoring = AUTO[self.layout] if opts.scoring == "auto" else opts.scoring
        if self.scoring not in ALLOWED[self.layout]:
            raise ModelLoadError(
                f"model '{cfg.name}': scoring '{self.scoring}' does not fit output '{self.output}' {list(shape)}; "
                f"use one of {', '.join(ALLOWED[self.layout])} (or auto)", model=cfg.name)
        self.yes_no: tuple[int, int] | None = None
        if self.layout == "vocab":
            self.yes_no = (self._single_token(cfg.name, "no"), self._single_token(cfg.name, "yes"))

    def _single_token(self, name: str, word: str) -> int:
        tok = self.encoder.tokenizer
        ids: list[int] = tok.encode(word, add_special_tokens=False).ids
        if len(ids) != 1:
            raise ModelLoadError(f"model '{name}': yes/no scoring needs '{word}' to be a single token, but the "
                                 f"tokenizer splits it into {len(ids)} tokens {ids}", model=name)
        if tok.id_to_token(ids[0]) in ("[UNK]", "<unk>", "<|unk|>"):
            raise ModelLoadError(f"model '{name}': yes/no scoring needs '{word}' in the vocabulary; the tokenizer "
                                 "maps it to the unknown token", model=name)
        return ids[0]

    def rule(self, raw: bool = False) -> str:
        mode = "logit" if raw else self.scoring
        return {
            ("one", "sigmoid"): "sigmoid(logit)", ("one", "logit"): "raw logit",
            ("two", "softmax"): "softmax(logits)[1]", ("two", "sigmoid"): "sigmoid(l1 - l0)",
            ("two", "logit"): "l1 - l0",
            ("vocab", "logit"): "logit(yes) - logit(no) at the last token",
        }.get((self.layout, mode), "softmax([logit(no), logit(yes)])[1] at the last token")

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {"kind": "rerank", "output": self.output, "output_shape": list(self.shape),
                                "scoring": self.scoring,
                "rule": self.rule()}
        if self.yes_no:
            info["yes_no_token_ids"] = {"no": self.yes_no[0], "yes": self.yes_no[1]}
        return info

    # ------------------------------------------------------------ rows

    def reduce(self, out: Array, mask: Array) -> Array:
        if self.layout == "vocab":
            assert self.yes_no is not None
            last = out[np.arange(out.shape[0]), last_token_index(mask)]
            pair: Array = last[:, list(self.yes_no)].astype(np.float64)  # [n, 2] = [no, yes]
            return pair
        return np.asarray(out, dtype=np.float64).reshape(out.shape[0], -1)

    def _scores(self, logits: Array, raw: bool) -> Array:
        mode = "logit" if raw else self.scoring
        if self.layout == "one":
            return logits[:, 0] if mode == "logit" else sigmoid(logits[:, 0])
        diff: Array = logits[:, 1] - logits[:, 0]
        return diff if mode == "logit" else sigmoid(diff)  # softmax over two = sigmoid of the difference

    def encode_pairs(self, queries: Sequence[str], docs: Sequence[str], truncate: bool | None = None,
                     direction: str = "right", param: str = "documents") -> Encoded:
        """Pair-template encoding; over max_len the document is cut, not the query, while the query fits."""
        enc = self.encoder
        try:
            return enc.encode(queries, docs, strategy="only_second", direction=direction, truncate=truncate,
                              param=param)
        except TokenizeError:
            # some query alone fills max_len: cut the longest side instead, as the reference libraries do
            return enc.encode(queries, docs, strategy="longest_first", direction=direction, truncate=truncate,
                              param=param)

    def plan_pairs(self, queries: Sequence[str], docs: Sequence[str], *, raw: bool = False,
                   truncate: bool | None = None, direction: str = "right",
                   param: str = "documents") -> Work[ScoreResult]:
        timing = Timing()
        t0 = time.perf_counter()
        enc = self.encode_pairs(queries, docs, truncate, direction, param)
        timing.tokenize_s = time.perf_counter() - t0

        def finish(rows: list[Any]) -> ScoreResult:
            scores = self._scores(stack(rows, 2), raw) if rows else np.empty((0,))
            if not np.all(np.isfinite(scores)):
                raise InferenceError(f"model '{self.model.name}' produced a non-finite score", model=self.model.name)
            return ScoreResult(scores, timing)

        return self.work(enc, finish, timing)

    def plan_rerank(self, query: str, docs: Sequence[str], *, raw: bool = False, truncate: bool | None = None,
                    direction: str = "right", max_tokens_per_doc: int | None = None) -> Work[ScoreResult]:
        if max_tokens_per_doc is not None:
            docs = self.encoder.cut(docs, max_tokens_per_doc)
        query = self.bounded_query(query, docs, direction)
        return self.plan_pairs([query] * len(docs), docs, raw=raw, truncate=truncate, direction=direction)

    def bounded_query(self, query: str, docs: Sequence[str], direction: str = "right") -> str:
        """The query cut, once, to the tokens a pair could ever keep: it is tokenized with each document, and a
        1,000,000-character query with 32 documents was 20 s of tokenizing. No pair holds more than max_len tokens,
        and longest_first's lengths depend on the query's only through which side is longer; so a query cut past
        max_len and past every document's length (+ QUERY_MARGIN tokens, at a word boundary: the words before the
        cut tokenize as they did) gives every pair the tokens the whole query gave it, and the same scores."""
        keep = (self.model.max_len or 512) + QUERY_MARGIN
        if len(query) <= keep:           # fewer characters than that: too few tokens to matter
            return query
        tok = self.encoder.tokenizer
        offsets = tok.encode(query, add_special_tokens=False).offsets
        if len(offsets) <= keep:
            return query
        longest = max((len(e.ids) for e in tok.encode_batch(list(docs), add_special_tokens=False)), default=0)
        keep = max(keep, longest + QUERY_MARGIN)
        if len(offsets) <= keep:
            return query
        if direction == "left":          # the last tokens are kept: cut before a word that starts early enough
            a = offsets[len(offsets) - keep][0]
            while a > 0 and not query[a - 1].isspace():
                a -= 1
            return query[a:]
        space = _SPACE.search(query, offsets[keep - 1][1])
        return query[:space.start()] if space is not None else query

    def rerank(self, query: str, docs: Sequence[str], **kw: Any) -> ScoreResult:
        return self.run(self.plan_rerank(query, docs, **kw))


def ranked(scores: Array, top_n: int | None = None) -> list[int]:
    """Indices by score, highest first, ties in input order; at most top_n."""
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    return order if top_n is None else order[:top_n]


def quality(a: Reranker, b: Reranker, texts: Sequence[str]) -> dict[str, float]:
    """What b's scores lose against a's (the quality gate): per query of the corpus, Spearman's ρ of the documents'
    scores (mean, min), whether the top document is the same, and the largest score difference."""
    from .quality import queries_and_documents, spearman

    rhos, agree, delta = [], 0, 0.0
    for query, docs in queries_and_documents(texts):
        sa, sb = a.run(a.plan_rerank(query, docs)).scores, b.run(b.plan_rerank(query, docs)).scores
        rhos.append(spearman(sa, sb))
        agree += int(ranked(sa)[0] == ranked(sb)[0])
        delta = max(delta, float(np.abs(sa - sb).max()))
    return {"mean_spearman": float(np.mean(rhos)), "min_spearman": float(np.min(rhos)),
            "top1_agreement": agree / len(rhos), "max_abs_delta": delta}
