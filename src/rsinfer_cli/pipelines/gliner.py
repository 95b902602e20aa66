"""GLiNER span models (the gliner package's uni-encoder span mode, `markerV0`) with numpy, tokenizers and ONNX
Runtime, no torch: the words, the label prompt, the graph's inputs and the span decoding exactly as gliner 0.2.x
computes them (`GLiNER.predict_entities`), every constant read from the folder's `gliner_config.json`.

- Words: `\\w+(?:[-_]\\w+)*|\\S` over the text (Unicode `\\w`, offsets as str indices); the package scores only the
  first `max_len` of them (`Encoded.words_used`).
- Prompt: `[ent, label_1, ent, label_2, ..., sep] + words`, labels de-duplicated (the first kept), tokenised as
  pre-split words with the tokenizer's own specials; `words_mask` numbers the first sub-token of each text word
  that produced tokens (1-based), 0 elsewhere.
- Spans: every (start, start + k) for k < max_width, masked past the text's words; `sigmoid(logits)`, strictly
  above the threshold, then greedy decoding by score: flat (no overlap) or nested (no partial overlap), one label
  per span unless multi_label.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..errors import InputError, ModelLoadError

WORD = re.compile(r"\w+(?:[-_]\w+)*|\S")
SPAN_MODES = ("markerV0",)          # the span graphs the ONNX export of gliner 0.2.x writes (inputs as below)
SPLITTERS = ("whitespace",)         # gliner's WhitespaceTokenSplitter: the regex above
GRAPH_INPUTS = ("input_ids", "attention_mask", "words_mask", "text_lengths", "span_idx", "span_mask")


@dataclass(frozen=True)
class GlinerConfig:
    """What inference reads of `gliner_config.json`."""

    max_width: int
    max_len: int
    ent_token: str
    sep_token: str
    # the tokens one row may hold (the tokenizer's model_max_length, where the package truncates; None: no limit)
    max_tokens: int | None = None

    @classmethod
    def load(cls, folder: Path) -> GlinerConfig:
        path = folder / "gliner_config.json"
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"{path.name}: not a GLiNER folder ({exc})") from None
        try:
            limit = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8")).get("model_max_length")
        except (OSError, ValueError, AttributeError):
            limit = None
        return cls.of(raw, path.name, int(limit) if isinstance(limit, (int, float)) and 0 < limit < 1e6 else None)

    @classmethod
    def of(cls, raw: dict[str, Any], where: str = "gliner_config.json", max_tokens: int | None = None
           ) -> GlinerConfig:
        mode = raw.get("span_mode")
        if mode not in SPAN_MODES:
            raise ModelLoadError(f"{where}: span_mode {mode!r} is not supported (supported: "
                                 f"{', '.join(SPAN_MODES)}; token-level GLiNER models have another graph)")
        splitter = raw.get("words_splitter_type", "whitespace")
        if splitter not in SPLITTERS:
            raise ModelLoadError(f"{where}: words_splitter_type {splitter!r} is not supported (supported: "
                                 f"{', '.join(SPLITTERS)})")
        if raw.get("subtoken_pooling", "first") != "first":
            raise ModelLoadError(f"{where}: subtoken_pooling {raw.get('subtoken_pooling')!r} is not supported "
                                 "(supported: first)")
        if raw.get("labels_encoder"):
            raise ModelLoadError(f"{where}: a bi-encoder GLiNER (labels_encoder) is not supported")
        try:
            return cls(int(raw["max_width"]), int(raw["max_len"]), str(raw.get("ent_token", "<<ENT>>")),
                       str(raw.get("sep_token", "<<SEP>>")), max_tokens)
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(f"{where}: missing or invalid {exc}") from None


@dataclass(frozen=True)
class Words:
    """A text split as the package splits it: each word and its [start, end) character offsets."""

    text: str
    words: tuple[str, ...]
    offsets: tuple[tuple[int, int], ...]


def split_words(text: str) -> Words:
    found = [(m.group(), m.start(), m.end()) for m in WORD.finditer(text)]
    return Words(text, tuple(w for w, _, _ in found), tuple((s, e) for _, s, e in found))


def unique_labels(labels: Sequence[str]) -> list[str]:
    """The labels as the prompt holds them: duplicates dropped, the first kept."""
    return list(dict.fromkeys(labels))


@dataclass(frozen=True)
class Encoded:
    """One text's graph inputs before batching."""

    input_ids: list[int]
    words_mask: list[int]
    words_used: int             # the text's words the model sees (at most max_len)


def encode(tokenizer: Any, cfg: GlinerConfig, labels: Sequence[str], words: Sequence[str],
           cut: bool = False) -> Encoded:
    """The prompt and the first `max_len` of `words` (a text's, or one window of them) as pre-split words;
    `tokenizer` has no truncation or padding. `cut`: a row over max_tokens loses the tokens before its closing
    specials (a window of one word that alone is over the limit: its first token, which the model reads, stays)."""
    prompt: list[str] = []
    for label in labels:
        prompt += [cfg.ent_token, label]
    prompt.append(cfg.sep_token)
    used = list(words[:cfg.max_len])
    enc = tokenizer.encode(prompt + used, is_pretokenized=True)
    ids, word_ids = list(enc.ids), list(enc.word_ids)
    if cut and cfg.max_tokens is not None and len(ids) > cfg.max_tokens:
        tail = next((k for k in range(len(word_ids)) if word_ids[-1 - k] is not None), 0)
        keep = cfg.max_tokens - tail
        ids, word_ids = ids[:keep] + ids[len(ids) - tail:], word_ids[:keep] + word_ids[len(word_ids) - tail:]
    mask = [0] * len(ids)
    seen = -1
    counted = 0
    for i, word in enumerate(word_ids):
        if word is None or word < len(prompt) or word == seen:
            continue
        seen = word
        counted += 1
        mask[i] = counted
    return Encoded(ids, mask, len(used))


def word_tokens(tokenizer: Any, words: Sequence[str]) -> list[int]:
    """The tokens each word makes (pre-split words, no specials: what it adds to a row)."""
    sizes = [0] * len(words)
    for w in tokenizer.encode(list(words), is_pretokenized=True, add_special_tokens=False).word_ids:
        if w is not None:
            sizes[w] += 1
    return sizes


def plan_text(tokenizer: Any, cfg: GlinerConfig, labels: Sequence[str], words: Sequence[str]
              ) -> list[tuple[tuple[int, int], Encoded]]:
    """A text's windows and their rows: `windows`' (exactly the package's within max_len words), unless a row
    would hold more than max_tokens tokens, where the package's tokenizer truncates and the words past the cut
    get no token; then windows that fit the token budget too (token_windows), so no word goes unread."""
    if not words:
        return []
    wins = windows(len(words), cfg)
    rows = [encode(tokenizer, cfg, labels, words[lo:hi]) for lo, hi in wins]
    limit = cfg.max_tokens
    if limit is None or all(len(r.input_ids) <= limit for r in rows):
        return list(zip(wins, rows, strict=True))
    budget = limit - len(encode(tokenizer, cfg, labels, []).input_ids)
    if budget < 1:
        raise InputError(f"the labels make a prompt of {limit - budget} tokens, and a row holds at most {limit} "
                         "(the tokenizer's model_max_length): ask for fewer or shorter labels", param="labels")
    wins = token_windows(word_tokens(tokenizer, words), cfg, budget)
    return [(w, encode(tokenizer, cfg, labels, words[w[0]:w[1]], cut=True)) for w in wins]


def feeds(batch: Sequence[Encoded], max_width: int) -> dict[str, np.ndarray]:
    """The graph's inputs for a batch: tokens padded with 0, every span of every text (end inclusive), masked past
    its words, rows padded with (0, 0) and False up to the longest text's words."""
    n = len(batch)
    tokens = max(len(e.input_ids) for e in batch)
    width = max(max(e.words_used for e in batch), 1)
    input_ids = np.zeros((n, tokens), dtype=np.int64)
    attention = np.zeros((n, tokens), dtype=np.int64)
    words_mask = np.zeros((n, tokens), dtype=np.int64)
    span_idx = np.zeros((n, width * max_width, 2), dtype=np.int64)
    span_mask = np.zeros((n, width * max_width), dtype=bool)
    starts = np.repeat(np.arange(width), max_width)
    ends = starts + np.tile(np.arange(max_width), width)
    for i, e in enumerate(batch):
        input_ids[i, :len(e.input_ids)] = e.input_ids
        attention[i, :len(e.input_ids)] = 1
        words_mask[i, :len(e.words_mask)] = e.words_mask
        rows = e.words_used * max_width
        span_idx[i, :rows, 0] = starts[:rows]
        span_idx[i, :rows, 1] = ends[:rows]
        span_mask[i, :rows] = ends[:rows] < e.words_used
    lengths = np.array([[e.words_used] for e in batch], dtype=np.int64)
    return {"input_ids": input_ids, "attention_mask": attention, "words_mask": words_mask,
            "text_lengths": lengths, "span_idx": span_idx, "span_mask": span_mask}


class Span(NamedTuple):
    """A decoded entity: word span [start, end] (inclusive), its label index and score (a tuple: hundreds are made
    per text)."""

    start: int
    end: int
    label: int
    score: float


def _clash(a: Span, b: Span, flat: bool, multi_label: bool) -> bool:
    if (a.start, a.end) == (b.start, b.end):
        return not multi_label
    if a.start > b.end or b.start > a.end:
        return False
    if flat:
        return True
    nested = (a.start <= b.start and a.end >= b.end) or (b.start <= a.start and b.end >= a.end)
    return not nested


def candidates(logits: np.ndarray, words: int, threshold: float, offset: int = 0) -> list[Span]:
    """The spans of one text's (or window's) logits [W, max_width, labels] scored strictly above the threshold,
    within its `words`, in (start, width, label) order; word indices shifted by `offset` (a window's first word)."""
    if threshold >= 1:
        return []
    # the logits that may pass, by the threshold's logit less a margin (no exp over every span: most are far
    # below, and exp overflows there); then the sigmoid of those and the exact test
    cut = np.log(threshold) - np.log1p(-threshold) - 1e-3 if threshold > 0 else -np.inf
    s, k, c = np.nonzero(logits > cut)             # row-major: (start, width, label) order
    inside = s + k < words
    s, k, c = s[inside], k[inside], c[inside]
    scores = 1.0 / (1.0 + np.exp(-logits[s, k, c].astype(np.float64)))
    keep = scores > threshold
    s, k, c = s[keep], k[keep], c[keep]
    return [Span(a, b, lab, v) for a, b, lab, v in zip((s + offset).tolist(), (s + k + offset).tolist(), c.tolist(),
                                                       scores[keep].tolist(), strict=True)]


def greedy(found: Sequence[Span], flat_ner: bool = True, multi_label: bool = False) -> list[Span]:
    """gliner's greedy search: by score (stable: ties keep the candidates' order), each span kept unless it clashes
    with one kept before (flat: any overlap; nested: a partial overlap; the same span unless multi_label); the
    result sorted by start."""
    kept: list[Span] = []
    ranked = sorted(found, key=lambda x: -x.score)
    if flat_ner and not multi_label and ranked:     # a clash is any shared word: mark the words taken
        taken = bytearray(max(x.end for x in ranked) + 1)
        for span in ranked:
            if not any(taken[span.start:span.end + 1]):
                kept.append(span)
                taken[span.start:span.end + 1] = b"\x01" * (span.end + 1 - span.start)
        return sorted(kept, key=lambda x: x.start)
    for span in ranked:
        if not any(_clash(span, other, flat_ner, multi_label) for other in kept):
            kept.append(span)
    return sorted(kept, key=lambda x: x.start)


def decode(logits: np.ndarray, words: int, threshold: float, flat_ner: bool = True,
           multi_label: bool = False) -> list[Span]:
    """gliner's SpanDecoder on one text's logits: candidates, then greedy."""
    return greedy(candidates(logits, words, threshold), flat_ner, multi_label)


def overlap_words(cfg: GlinerConfig) -> int:
    """Words two neighbouring windows share: at least max_width (so every span the model can score lies whole in
    one window), a quarter of the window where that is more (context on both sides of a boundary)."""
    return min(cfg.max_len // 2, max(cfg.max_width, cfg.max_len // 4))


def windows(n_words: int, cfg: GlinerConfig) -> list[tuple[int, int]]:
    """[start, end) word windows covering a text: one when it fits max_len (exactly the package), else the fewest
    windows of max_len words, spread evenly from the first word to the last, that share at least overlap_words
    with their neighbours."""
    if n_words <= cfg.max_len:
        return [(0, n_words)]
    step = cfg.max_len - overlap_words(cfg)
    count = 1 + -(-(n_words - cfg.max_len) // step)       # the fewest windows no further apart than `step`
    starts = [round(i * (n_words - cfg.max_len) / (count - 1)) for i in range(count)]   # spread evenly
    return [(start, start + cfg.max_len) for start in starts]


def token_windows(sizes: Sequence[int], cfg: GlinerConfig, budget: int) -> list[tuple[int, int]]:
    """[start, end) word windows of at most max_len words and `budget` tokens (`sizes`: each word's), from the first
    word to the last, each as long as it can be, neighbours sharing overlap_words (at most half a window). A word
    over the budget alone is a window of its own, and the windows beside it do not reach into it."""
    n = len(sizes)
    ends = [0, *accumulate(sizes)]          # ends[i]: the tokens of words [0, i)

    def end_from(lo: int) -> int:
        return max(bisect_right(ends, ends[lo] + budget, lo + 1, min(lo + cfg.max_len, n) + 1) - 1, lo + 1)

    out = [(0, end_from(0))]
    while out[-1][1] < n:
        lo, hi = out[-1]
        start = max(hi - min(overlap_words(cfg), (hi - lo) // 2), lo + 1)
        if end_from(start) <= hi:           # the next word does not fit beside the shared ones: start afresh
            start = hi
        out.append((start, end_from(start)))
    return out


def merge_windows(per_window: Sequence[tuple[tuple[int, int], Sequence[Span]]]) -> list[Span]:
    """Candidates of overlapping windows as one text's: a span two windows found is taken from the one that saw
    the most words on both sides of it (the earlier one on a tie); the result in (start, width, label) order, as one
    window's would be."""
    if len(per_window) == 1:
        return list(per_window[0][1])        # one window: its candidates, already in that order
    best: dict[tuple[int, int, int], tuple[int, Span]] = {}
    for (lo, hi), found in per_window:
        for span in found:
            margin = min(span.start - lo, hi - 1 - span.end)
            key = (span.start, span.end, span.label)
            if key not in best or margin > best[key][0]:
                best[key] = (margin, span)
    return [best[key][1] for key in sorted(best, key=lambda k: (k[0], k[1] - k[0], k[2]))]


def entities(words: Words, spans: Sequence[Span], labels: Sequence[str]) -> list[dict[str, Any]]:
    """The package's entity dicts: character offsets of the span's first and last word."""
    out = []
    for sp in spans:
        start, end = words.offsets[sp.start][0], words.offsets[sp.end][1]
        out.append({"start": start, "end": end, "text": words.text[start:end], "label": labels[sp.label],
                    "score": sp.score})
    return out


def check_graph(input_names: Sequence[str], output_shape: Sequence[Any] | None = None) -> None:
    """Refuse a graph that is not a GLiNER span graph, naming what it lacks."""
    missing = [n for n in GRAPH_INPUTS if n not in input_names]
    if missing:
        raise ModelLoadError(f"not a GLiNER span graph: the graph lacks input(s) {', '.join(missing)} (it has "
                             f"{', '.join(input_names)})")
    if output_shape is not None and len(output_shape) != 4:
        raise ModelLoadError(f"not a GLiNER span graph: logits of rank {len(output_shape)}, expected 4 "
                             "[batch, words, max_width, labels]")


def predict(run: Callable[[dict[str, np.ndarray]], np.ndarray], tokenizer: Any, cfg: GlinerConfig,
            texts: Sequence[str], labels: Sequence[str], threshold: float = 0.5, flat_ner: bool = True,
            multi_label: bool = False, batch_size: int = 8) -> list[list[dict[str, Any]]]:
    """`GLiNER.predict_entities` over texts, `run` mapping the graph's inputs to its logits. A text within max_len
    words gives exactly the package's entities; a longer one is scored in overlapping windows (the package drops
    every word past max_len) and decoded as one text."""
    labels = unique_labels(labels)
    split = [split_words(t) for t in texts]
    jobs = [(i, win, enc) for i, w in enumerate(split) for win, enc in plan_text(tokenizer, cfg, labels, w.words)]
    found: dict[int, list[tuple[tuple[int, int], list[Span]]]] = {}
    for at in range(0, len(jobs), batch_size):
        chunk = jobs[at:at + batch_size]
        encoded = [enc for _, _, enc in chunk]
        logits = run(feeds(encoded, cfg.max_width))
        for (i, win, _), enc, lg in zip(chunk, encoded, logits, strict=True):
            found.setdefault(i, []).append((win, candidates(lg, enc.words_used, threshold, offset=win[0])))
    return [entities(w, greedy(merge_windows(found.get(i, [])), flat_ner, multi_label), labels)
            for i, w in enumerate(split)]
