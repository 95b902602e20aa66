"""What every pipeline shares. A request becomes `Work`: token rows plus a `finish` that turns the rows' outputs
into the answer. The rows run either here, in length-sorted forwards (the direct path, also the CLI's), or
through the server's cross-request batcher, which mixes rows of many requests in one forward."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engine.batching import plan_batches
from ..engine.inputs import Encoded
from ..engine.model import Timing

# reduce(output of one forward, attention mask [rows, width]) → one row per input row of that forward
Reduce = Callable[[np.ndarray, np.ndarray], np.ndarray]

LOGIT_OUTPUTS = ("logits", "output0", "output", "scores")


def pick_output(model: Any, preferred: tuple[str, ...]) -> str:
    names = [o.name for o in model.graph.outputs]
    return next((n for n in preferred if n in names), names[0])


def last_token_index(mask: np.ndarray) -> np.ndarray:
    """Each row's last real token under right padding."""
    return np.maximum(mask.sum(axis=1) - 1, 0)


def forward_batch(model: Any, output: str, reduce: Reduce, ids: Sequence[Sequence[int]],
                  type_ids: Sequence[Sequence[int]] | None, timing: Timing | None = None,
                  ragged: bool = False) -> list[Any]:
    """One forward of these rows → one output per row (per-token outputs cut to each row's length if ragged)."""
    feeds = model.feeds.build(ids, type_ids, model.encoder.pad_id)
    (out,) = model.run([output], feeds, timing)
    width = feeds["input_ids"].shape[1]
    lengths = np.array([len(r) for r in ids])
    mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)
    rows = reduce(np.asarray(out), mask)
    if ragged:
        return [rows[j, : lengths[j]] for j in range(len(ids))]
    return list(rows)


def forward_rows(model: Any, enc: Encoded, output: str, reduce: Reduce, *, max_rows: int, max_tokens: int,
                 timing: Timing, ragged: bool = False) -> list[Any]:
    """All rows of `enc` in forwards of at most `max_rows` rows / `max_tokens` padded tokens, shortest first;
    one output per row, in input order."""
    outputs: list[Any] = [None] * len(enc.ids)
    for batch in plan_batches(enc.lengths, max_rows, max_tokens, getattr(model, "max_padding", None)):
        ids = [enc.ids[i] for i in batch]
        types = [enc.type_ids[i] for i in batch] if enc.type_ids is not None else None
        for i, row in zip(batch, forward_batch(model, output, reduce, ids, types, timing, ragged), strict=True):
            outputs[i] = row
    return outputs


class Timed:
    """Usage numbers of a result, read from its timing record (`timing` is a field of each result)."""

    timing: Timing

    @property
    def tokens(self) -> int:
        return self.timing.tokens

    @property
    def truncated(self) -> int:
        return self.timing.truncated


@dataclass
class Work:
    """One request's rows and how their outputs (one per row, in row order) become its answer."""

    enc: Encoded
    finish: Callable[[list[Any]], Any]
    timing: Timing

    @property
    def rows(self) -> int:
        return len(self.enc.ids)


class RowPipeline:
    """A pipeline whose requests decompose into independent token rows of one model."""

    model: Any
    output: str
    ragged = False          # per-token outputs (PII) instead of one vector per row
    max_rows: int
    max_tokens: int

    def reduce(self, out: np.ndarray, mask: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def work(self, enc: Encoded, finish: Callable[[list[Any]], Any], timing: Timing) -> Work:
        timing.tokens += enc.num_tokens
        timing.truncated += enc.truncated
        return Work(enc, finish, timing)

    def forward(self, ids: Sequence[Sequence[int]], type_ids: Sequence[Sequence[int]] | None,
                timing: Timing | None = None) -> list[Any]:
        """One forward of rows that may come from several requests (the batcher's unit of work)."""
        return forward_batch(self.model, self.output, self.reduce, ids, type_ids, timing, self.ragged)

    def run(self, work: Work) -> Any:
        """The direct path: the work's rows in this thread, in length-sorted forwards, then its answer."""
        outputs = forward_rows(self.model, work.enc, self.output, self.reduce, max_rows=self.max_rows,
                               max_tokens=self.max_tokens, timing=work.timing, ragged=self.ragged)
        return work.finish(outputs)


def stack(outputs: list[Any], width: int) -> np.ndarray:
    """Per-row outputs as one [n, width] array (an empty request gives [0, width])."""
    return np.stack(outputs) if outputs else np.empty((0, width))
