"""The text front end every text family shares: tokenizer.json with rsinfer's own limits (visible truncation),
token rows → graph feeds (dynamic padding, derived mask / types / positions / empty KV cache), and
`TextPipeline`, whose rows are token rows and whose forward reduces the graph output per row."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..engine.cancel import checkpoint
from ..engine.model import LoadedModel
from ..engine.session import GraphInfo, Session, TensorInfo
from ..errors import DeadlinePassed, InputError, ModelLoadError, TokenizeError
from .base import Array, RowPipeline, T, Timing, Work

if TYPE_CHECKING:
    from tokenizers import Tokenizer

FILLABLE = ("input_ids", "attention_mask", "token_type_ids", "position_ids", "past_key_values.*")
PAD_TOKENS = ("[PAD]", "<pad>", "<|endoftext|>", "<|pad|>")


# characters tokenized between two deadline checkpoints: the tokenizer's Rust cannot be stopped, so a request of
# 300 texts of 50,000 characters (seconds of tokenizing) is tokenized in slices, the deadline checked between them
TOKENIZE_SLICE_CHARS = 1 << 20


def encode_batch(tok: Any, batch: list[Any], add_special_tokens: bool = True) -> list[Any]:
    """tok.encode_batch(batch) in slices of about TOKENIZE_SLICE_CHARS characters, a cancellation checkpoint before
    each (one call, as before, for a batch under that)."""
    pairs = bool(batch) and not isinstance(batch[0], str)
    if (sum(len(a) + len(b) for a, b in batch) if pairs else sum(map(len, batch))) <= TOKENIZE_SLICE_CHARS:
        encs: list[Any] = tok.encode_batch(batch, add_special_tokens=add_special_tokens)
        return encs
    sizes = [len(a) + len(b) for a, b in batch] if pairs else [len(x) for x in batch]
    out: list[Any] = []
    start = chars = 0
    for i, size in enumerate(sizes):
        chars += size
        if chars >= TOKENIZE_SLICE_CHARS or i == len(sizes) - 1:
            checkpoint()
            out.extend(tok.encode_batch(batch[start:i + 1], add_special_tokens=add_special_tokens))
            start, chars = i + 1, 0
    return out


@dataclass
class Encoded:
    """Token rows of one batch of texts (or text pairs), before padding."""

    ids: list[list[int]]
    type_ids: list[list[int]] | None
    truncated: int = 0                       # rows that lost tokens to max_len
    offsets: list[list[tuple[int, int]]] | None = None

    @property
    def lengths(self) -> list[int]:
        return [len(r) for r in self.ids]

    @property
    def num_tokens(self) -> int:
        return sum(len(r) for r in self.ids)


class TextEncoder:
    """A `tokenizer.json` with its presets cleared and rsinfer's own `max_len` applied."""

    def __init__(self, path: Path, max_len: int | None, *, truncate: bool = True, model: str = "",
                 lowercase: bool = False) -> None:
        from tokenizers import Tokenizer, normalizers

        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # ORT owns the cores
        try:
            self._base = Tokenizer.from_file(str(path))
        except Exception as exc:  # noqa: BLE001
            raise ModelLoadError(f"cannot read tokenizer {path}: {exc}", model=model or None) from exc
        self._base.no_padding()
        self._base.no_truncation()
        if lowercase:   # sentence_bert_config.json `do_lower_case`: a Lowercase first, as sentence-transformers adds it
            current = self._base.normalizer
            has = isinstance(current, normalizers.Lowercase) or (
                isinstance(current, normalizers.Sequence) and any(isinstance(n, normalizers.Lowercase)
                                                                  for n in current))  # type: ignore[attr-defined]
            if not has:
                self._base.normalizer = normalizers.Sequence(
                    [normalizers.Lowercase(), *([current] if current is not None else [])])
        self.max_len = max_len
        self.truncate = truncate
        self.model = model
        self._variants: dict[tuple[str, str], Tokenizer] = {}
        self._lock = threading.Lock()
        self.pad_id = next((i for t in PAD_TOKENS if (i := self._base.token_to_id(t)) is not None), 0)
        # the default variant made now, at load: making one (a copy of the tokenizer with rsinfer's truncation)
        # took 22 ms of all-MiniLM's first request (benchmarks/reload.py), 4 ms is the whole of the next ones
        self._variant("longest_first", "right")

    @property
    def tokenizer(self) -> Tokenizer:
        return self._base

    def _variant(self, strategy: str, direction: str) -> Tokenizer:
        key = (strategy, direction)
        tok = self._variants.get(key)
        if tok is None:
            from tokenizers import Tokenizer

            with self._lock:
                tok = self._variants.get(key)
                if tok is None:
                    tok = Tokenizer.from_str(self._base.to_str())
                    if self.max_len:
                        tok.enable_truncation(self.max_len, strategy=strategy, direction=direction)
                    self._variants[key] = tok
        return tok

    def encode(self, texts: Sequence[str], pairs: Sequence[str] | None = None, *,
               strategy: str = "longest_first", direction: str = "right", truncate: bool | None = None,
               add_special_tokens: bool = True, offsets: bool = False, param: str = "input",
               keep: int = 0) -> Encoded:
        """Encode texts (or text pairs); over-length rows are cut at max_len, or refused when truncate is off.
        `keep`: with left truncation of single texts, the first `keep` tokens (a prompt) stay and the text after
        them is cut."""
        if keep and direction == "left" and pairs is None and self.max_len:
            return self._encode_keeping(texts, keep, truncate, add_special_tokens, param)
        tok = self._variant(strategy, direction)
        batch = list(zip(texts, pairs, strict=True)) if pairs is not None else list(texts)
        try:
            encs = encode_batch(tok, batch, add_special_tokens)
        except DeadlinePassed:
            raise
        except Exception as exc:  # noqa: BLE001 - the tokenizer raises untyped errors
            raise TokenizeError(f"the tokenizer rejected the input: {exc}", param=param,
                                model=self.model or None) from exc
        cut = [i for i, e in enumerate(encs) if e.overflowing]
        if cut and not (self.truncate if truncate is None else truncate):
            i = cut[0]
            first, second = (texts[i], None) if pairs is None else (texts[i], pairs[i])
            full = len(self._base.encode(first, second, add_special_tokens=add_special_tokens).ids)
            raise InputError(f"{param}[{i}] has {full} tokens but max_len is {self.max_len}; "
                             "shorten it or allow truncation (truncate: true)", param=f"{param}[{i}]",
                             model=self.model or None)
        return Encoded(ids=[e.ids for e in encs], type_ids=[e.type_ids for e in encs], truncated=len(cut),
                       offsets=[e.offsets for e in encs] if offsets else None)

    def cut(self, texts: Sequence[str], max_tokens: int) -> list[str]:
        """Each text held to `max_tokens` tokens (without special tokens; Cohere's max_tokens_per_doc), cut at a
        token boundary."""
        out = []
        for text, e in zip(texts, self._base.encode_batch(list(texts), add_special_tokens=False), strict=True):
            out.append(text[: e.offsets[max_tokens - 1][1]] if len(e.ids) > max_tokens else text)
        return out

    def _encode_keeping(self, texts: Sequence[str], keep: int, truncate: bool | None, add_special_tokens: bool,
                        param: str) -> Encoded:
        max_len = int(self.max_len or 0)
        if keep >= max_len:
            raise InputError(f"the prompt alone has {keep} tokens and max_len is {max_len}: no text fits after it",
                             param=param, model=self.model or None)
        try:
            encs = encode_batch(self._base, list(texts), add_special_tokens)
        except DeadlinePassed:
            raise
        except Exception as exc:  # noqa: BLE001 - the tokenizer raises untyped errors
            raise TokenizeError(f"the tokenizer rejected the input: {exc}", param=param,
                                model=self.model or None) from exc
        ids, types, cut = [], [], 0
        for i, e in enumerate(encs):
            row, row_types = list(e.ids), list(e.type_ids)
            if len(row) > max_len:
                if not (self.truncate if truncate is None else truncate):
                    raise InputError(f"{param}[{i}] has {len(row)} tokens but max_len is {self.max_len}; shorten "
                                     "it or allow truncation (truncate: true)", param=f"{param}[{i}]",
                                     model=self.model or None)
                tail = len(row) - (max_len - keep)
                row, row_types, cut = row[:keep] + row[tail:], row_types[:keep] + row_types[tail:], cut + 1
            ids.append(row)
            types.append(row_types)
        return Encoded(ids=ids, type_ids=types, truncated=cut)


class FeedBuilder:
    """Builds the graph's inputs from token rows; checks at load time that every input can be filled."""

    def __init__(self, graph: GraphInfo, model: str = "") -> None:
        self.model = model
        self.inputs = {t.name: t for t in graph.inputs}
        self.past: list[TensorInfo] = []
        names = ", ".join(f"{t.name} ({t.dtype})" for t in graph.inputs)
        for t in graph.inputs:
            if t.name.startswith("past_key_values."):
                if len(t.shape) != 4 or not all(isinstance(d, int) for d in (t.shape[1], t.shape[3])):
                    raise ModelLoadError(
                        f"model '{model}': cache input '{t.name}' has shape {list(t.shape)}; need "
                        "[batch, kv_heads, past, head_dim] with fixed kv_heads and head_dim", model=model)
                self.past.append(t)
            elif t.name not in FILLABLE:
                raise ModelLoadError(
                    f"model '{model}': graph input '{t.name}' cannot be filled; the graph's inputs are "
                    f"{names}; rsinfer fills {', '.join(FILLABLE)}", model=model)
        if "input_ids" not in self.inputs:
            raise ModelLoadError(f"model '{model}': the graph has no `input_ids` input (inputs: {names})",
                                 model=model)

    def build(self, ids: Sequence[Sequence[int]], type_ids: Sequence[Sequence[int] | None] | None = None,
              pad_id: int = 0) -> dict[str, Array]:
        """Right-pad to the longest row of the batch; derive mask, positions and an empty KV cache."""
        rows = len(ids)
        width = max((len(r) for r in ids), default=0) or 1
        dtype = self.inputs["input_ids"].dtype
        input_ids = np.full((rows, width), pad_id, dtype=dtype)
        mask = np.zeros((rows, width), dtype=np.int64)
        types = np.zeros((rows, width), dtype=np.int64) if "token_type_ids" in self.inputs else None
        for i, row in enumerate(ids):
            n = len(row)
            input_ids[i, :n] = row
            mask[i, :n] = 1
            row_types = type_ids[i] if type_ids is not None else None
            if types is not None and row_types is not None:
                types[i, :n] = row_types
        feeds: dict[str, Array] = {"input_ids": input_ids}
        if "attention_mask" in self.inputs:
            feeds["attention_mask"] = mask.astype(self.inputs["attention_mask"].dtype, copy=False)
        if types is not None:
            feeds["token_type_ids"] = types.astype(self.inputs["token_type_ids"].dtype, copy=False)
        if "position_ids" in self.inputs:
            pos = np.where(mask == 1, np.cumsum(mask, axis=1) - 1, 1)
            feeds["position_ids"] = pos.astype(self.inputs["position_ids"].dtype, copy=False)
        for t in self.past:
            heads, head_dim = int(t.shape[1] or 0), int(t.shape[3] or 0)  # fixed ints, checked at load
            feeds[t.name] = np.zeros((rows, heads, 0, head_dim), dtype=t.dtype)
        return feeds


# one row: its token ids and token type ids (None: all zero)
TokenRow = tuple[Sequence[int], "Sequence[int] | None"]


class TextPipeline(RowPipeline):
    """A family over a text model: rows are token rows; `reduce` turns one forward's output into one result per
    row (per token, cut to each row's length, when `ragged`)."""

    output: str
    ragged = False

    def __init__(self, model: LoadedModel) -> None:
        super().__init__(model)
        if model.resolved.tokenizer_path is None:
            raise ModelLoadError(f"model '{model.name}': a {model.kind} model needs tokenizer.json", model=model.name)
        self.encoder = TextEncoder(model.resolved.tokenizer_path, model.max_len, truncate=model.config.truncate,
                                   model=model.name,
                                   lowercase=model.aux.get("sentence_bert_config.json", {}).get("do_lower_case")
                                   is True)
        self.feeds = FeedBuilder(model.graph, model.name)

    def reduce(self, out: Array, mask: Array) -> Array:
        raise NotImplementedError

    def pool_mask(self, rows: Sequence[Any], lengths: Array, width: int) -> Array:
        """[B, width] ones over each row's real tokens: what `reduce` pools over."""
        out: Array = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)
        return out

    def forward(self, session: Session, rows: Sequence[TokenRow]) -> list[Any]:
        ids = [r[0] for r in rows]
        feeds = self.feeds.build(ids, [r[1] for r in rows], self.encoder.pad_id)
        out = self.model.run(session, feeds, [self.output])[self.output]
        width = feeds["input_ids"].shape[1]
        lengths = np.array([len(r) for r in ids])
        reduced = self.reduce(out, self.pool_mask(rows, lengths, width))
        if self.ragged:
            return [reduced[j, : lengths[j]] for j in range(len(ids))]
        return list(reduced)

    def work(self, enc: Encoded, finish: Callable[[list[Any]], T], timing: Timing) -> Work[T]:
        """The rows of encoded texts and how their outputs become the answer; usage counted in `timing`."""
        timing.tokens += enc.num_tokens
        timing.truncated += enc.truncated
        types = enc.type_ids if enc.type_ids is not None else [None] * len(enc.ids)
        return Work(list(zip(enc.ids, types, strict=True)), enc.lengths, finish, timing)

    def row_bytes(self, row: TokenRow) -> bytes:
        ids = np.asarray(row[0], dtype="<i4").tobytes()
        types = np.asarray(row[1], dtype="<i1").tobytes() if row[1] is not None else b""
        return len(ids).to_bytes(4, "little") + ids + types

    def sample_rows(self, batch: int, length: int,
                    shapes: dict[str, list[int]] | None = None) -> tuple[list[Any], list[int]]:
        token = self.encoder.tokenizer.encode("the", add_special_tokens=False).ids[:1] or [1]
        return [(token * length, [0] * length)] * batch, [length] * batch
