"""A GLiNER span model (a folder with gliner_config.json) as the pii family's model: it is asked for the labels of
the entry's `pii_labels` (label text → entity type), and what it finds goes through everything the family has
after the model (recognizers, patterns, allow and deny lists, every redaction mode). Inference is
pipelines/gliner.py's, exact to the gliner package within the model's word window; a longer text is scored in
overlapping word windows. Each window is one row: rows of concurrent requests share forwards, grouped by the
number of labels their prompts hold (the graph's label axis)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engine.model import LoadedModel
from ..engine.session import Session
from ..errors import InputError, ModelLoadError
from . import gliner
from .base import RowPipeline, Timing, Work
from .pii import MAX_LABEL_CHARS, MAX_LABELS, Entity, Labels, PiiOptions, PiiPipeline

# the labels a GLiNER PII model is asked for when the entry names none, and the entity types they answer as
# (Presidio's names where rsinfer's PII types have none of their own)
DEFAULT_LABELS = {"person": "PERSON", "organization": "ORGANIZATION", "location": "LOCATION",
                  "email": "EMAIL", "phone number": "PHONE", "address": "ADDRESS", "date of birth": "DATE_OF_BIRTH"}


def type_of(label: str) -> str:
    """A label written as an entity type: words joined by _, upper case ("employee id" → EMPLOYEE_ID)."""
    return re.sub(r"\W+", "_", label).strip("_").upper() or "ENTITY"


def check_texts(labels: Sequence[Any], param: str) -> None:
    """Each label a text of 1 to MAX_LABEL_CHARS characters (InputError naming the first that is not)."""
    for i, label in enumerate(labels):
        if not isinstance(label, str) or not label.strip() or len(label) > MAX_LABEL_CHARS:
            raise InputError(f"{param}[{i}]: a label is 1 to {MAX_LABEL_CHARS} characters", param=param)


@dataclass(frozen=True)
class Row:
    """One window of one text with the label prompt: what a forward takes."""

    input_ids: tuple[int, ...]
    words_mask: tuple[int, ...]
    words_used: int
    labels: int


@dataclass
class Planned:
    """A request's rows (`ids` keeps plan_detect_groups' row counting) and, per text, its words and windows."""

    ids: list[Row]
    texts: list[tuple[gliner.Words, list[tuple[int, int]]]]


class GlinerPiiPipeline(PiiPipeline):
    def __init__(self, model: LoadedModel) -> None:
        RowPipeline.__init__(self, model)          # not TextPipeline's: the graph takes GLiNER's own inputs
        cfg = model.config
        opts = cfg.own(PiiOptions)
        self.gliner = gliner.GlinerConfig.of(model.aux.get("gliner_config.json") or {},
                                             f"model '{cfg.name}': gliner_config.json", model.max_len)
        outputs = {t.name: t for t in model.graph.outputs}
        self.output = "logits" if "logits" in outputs else next(iter(outputs))
        try:
            gliner.check_graph([t.name for t in model.graph.inputs], outputs[self.output].shape)
        except ModelLoadError as exc:
            raise ModelLoadError(f"model '{cfg.name}': {exc.message}", model=cfg.name) from None
        if model.resolved.tokenizer_path is None:
            raise ModelLoadError(f"model '{cfg.name}': a GLiNER model needs tokenizer.json", model=cfg.name)
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(model.resolved.tokenizer_path))
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.label_types = dict(opts.pii_labels) if opts.pii_labels else dict(DEFAULT_LABELS)
        self.labels = list(self.label_types)
        self.address_columns = []
        self.setup(opts, set(self.label_types.values()), False)
        self.window = self.gliner.max_len
        self.overlap = gliner.overlap_words(self.gliner)
        self._encode_prompt_check()

    def _encode_prompt_check(self) -> None:
        """The prompt of every label fits a row beside one word: a label list the model cannot hold is a load
        error."""
        enc = gliner.encode(self.tokenizer, self.gliner, self.labels, ["x"])
        limit = self.gliner.max_tokens
        if limit is not None and len(enc.input_ids) > limit:
            raise ModelLoadError(f"model '{self.model.name}': pii_labels make a prompt of {len(enc.input_ids)} "
                                 f"tokens; a row holds at most {limit} (max_len)", model=self.model.name)

    def describe(self) -> dict[str, Any]:
        described = {k: v for k, v in super().describe().items() if k not in ("window_tokens", "window_overlap")}
        return {**described, "model": "gliner", "labels": self.label_types, "window_words": self.gliner.max_len,
                "window_overlap_words": self.overlap, "window_tokens": self.gliner.max_tokens or "no limit",
                "max_span_words": self.gliner.max_width}

    def label_types_of(self, labels: Labels | None) -> dict[str, str]:
        """A request's labels and their entity types: a mapping's own, else pii_labels' where it names the label,
        else the label written as an entity type ("employee id" → EMPLOYEE_ID); None: the configured labels."""
        if labels is None:
            return self.label_types
        if isinstance(labels, Mapping):
            return dict(labels)
        return {label: self.label_types.get(label) or type_of(label) for label in gliner.unique_labels(labels)}

    def check_labels(self, labels: Labels | None, param: str = "labels") -> set[str]:
        if labels is None:
            return set()
        if not labels:
            raise InputError(f"`{param}` is empty: name at least one label, or leave it out for the model's own",
                             param=param)
        if len(labels) > MAX_LABELS:
            raise InputError(f"`{param}` asks for {len(labels)} labels; at most {MAX_LABELS}", param=param)
        check_texts(list(labels), param)
        return set(self.label_types_of(labels).values())

    def open_labels(self, entities: Sequence[str], named: Callable[[str], str]) -> dict[str, str] | None:
        check_texts(entities, "entities")
        known = {named(t) for t in self.label_types.values()}
        extra = [e for e in gliner.unique_labels(entities) if e not in known and e not in self.label_types]
        if not extra:
            return None
        if len(self.label_types) + len(extra) > MAX_LABELS:
            raise InputError(f"`entities` adds {len(extra)} labels to the model's {len(self.label_types)}; at most "
                             f"{MAX_LABELS} in all", param="entities")
        return {**self.label_types, **{e: e for e in extra}}

    def plan_probs(self, texts: Sequence[str], timing: Timing, labels: Labels | None = None) -> tuple[Any, Any]:
        """One row per window of every text; per text, its words, windows and their outputs."""
        t0 = time.perf_counter()
        types = self.label_types_of(labels)
        prompt = list(types)
        planned = Planned([], [])
        for text in texts:
            words = gliner.split_words(text)
            rows = gliner.plan_text(self.tokenizer, self.gliner, prompt, words.words)
            planned.texts.append((words, [win for win, _ in rows]))
            planned.ids += [Row(tuple(enc.input_ids), tuple(enc.words_mask), enc.words_used, len(prompt))
                            for _, enc in rows]
        timing.tokenize_s += time.perf_counter() - t0

        def per_text(rows: list[Any]) -> list[tuple[gliner.Words, list[tuple[tuple[int, int], Any]], dict[str, str]]]:
            out = []
            at = 0
            for words, wins in planned.texts:
                out.append((words, list(zip(wins, rows[at:at + len(wins)], strict=True)), types))
                at += len(wins)
            return out

        return planned, per_text

    def joined(self, encs: Sequence[Any]) -> Any:
        return Planned([r for e in encs for r in e.ids], [t for e in encs for t in e.texts])

    def work(self, enc: Any, finish: Any, timing: Timing) -> Work[Any]:
        rows: list[Row] = enc.ids
        timing.tokens += sum(len(r.input_ids) for r in rows)
        return Work(rows, [len(r.input_ids) for r in rows], finish, timing)

    def forward(self, session: Session, rows: Sequence[Any]) -> list[Any]:
        """Rows grouped by their number of labels (the graph's label axis), one run per group; each row's logits
        cut to its words."""
        out: list[Any] = [None] * len(rows)
        for count in sorted({r.labels for r in rows}):
            group = [i for i, r in enumerate(rows) if r.labels == count]
            batch = [gliner.Encoded(list(rows[i].input_ids), list(rows[i].words_mask), rows[i].words_used)
                     for i in group]
            logits = self.model.run(session, gliner.feeds(batch, self.gliner.max_width), [self.output])[self.output]
            for j, i in enumerate(group):
                out[i] = np.asarray(logits[j, :rows[i].words_used])
        return out

    def model_entities(self, text: str, item: Any, threshold: float) -> list[Entity]:
        words, windows, types = item
        found = [(win, gliner.candidates(logits, win[1] - win[0], threshold, offset=win[0]))
                 for win, logits in windows]
        spans = gliner.greedy(gliner.merge_windows(found), flat_ner=True)
        return [Entity(types[e["label"]], e["text"], e["score"], e["start"], e["end"])
                for e in gliner.entities(words, spans, list(types))]

    def weak_of(self, item: Any) -> None:
        return None                 # no per-token address probabilities: address parts are not merged by gaps

    def row_bytes(self, row: Any) -> bytes:
        ids = np.asarray(row.input_ids, dtype="<i4").tobytes()
        return len(ids).to_bytes(4, "little") + ids + np.asarray(row.words_mask, dtype="<i2").tobytes()

    def sample_rows(self, batch: int, length: int,
                    shapes: dict[str, list[int]] | None = None) -> tuple[list[Any], list[int]]:
        enc = gliner.encode(self.tokenizer, self.gliner, self.labels, ["word"] * min(length, self.gliner.max_len))
        row = Row(tuple(enc.input_ids), tuple(enc.words_mask), enc.words_used, len(self.labels))
        return [row] * batch, [len(row.input_ids)] * batch


def pipeline_for(model: LoadedModel) -> PiiPipeline:
    """The pii family's pipeline: a GLiNER folder's (gliner_config.json) or a token classifier's."""
    return GlinerPiiPipeline(model) if "gliner_config.json" in model.aux else PiiPipeline(model)


def trial_feeds(graph: Any, aux: Mapping[str, Any]) -> dict[str, np.ndarray] | None:
    """The load's trial forward for a GLiNER graph: one label token and one word (the signature's zeros hold no
    label and no word, which its reshapes cannot take); None for a token classifier. A gliner_config.json that
    cannot be served is refused here, before any request."""
    raw = aux.get("gliner_config.json")
    if raw is None:
        return None
    cfg = gliner.GlinerConfig.of(raw)
    gliner.check_graph([t.name for t in graph.inputs])
    label = int(raw.get("class_token_index", 1))
    ids = np.array([[1, label, 1, 1, 1, 1]], dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids),
            "words_mask": np.array([[0, 0, 0, 0, 1, 0]], dtype=np.int64),
            "text_lengths": np.array([[1]], dtype=np.int64),
            "span_idx": np.array([[[0, k] for k in range(cfg.max_width)]], dtype=np.int64),
            "span_mask": np.array([[k == 0 for k in range(cfg.max_width)]])}
