"""What every pipeline shares: encoded rows → length-sorted forwards → one output row per input, in order."""

from __future__ import annotations

from collections.abc import Callable
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


def forward_rows(model: Any, enc: Encoded, output: str, reduce: Reduce, *, max_rows: int, max_tokens: int,
                 timing: Timing, ragged: bool = False) -> Any:
    """All rows of `enc` through the graph in forwards of at most `max_rows` rows / `max_tokens` padded tokens,
    shortest first; `reduce` turns each forward's output into one row per input row; input order restored.
    With `ragged`, per-token outputs come back as a list, each row cut to its own length."""
    timing.tokens += enc.num_tokens
    timing.truncated += enc.truncated
    if ragged:
        pieces: list[Any] = [None] * len(enc.ids)
    result: np.ndarray | None = None
    for batch in plan_batches(enc.lengths, max_rows, max_tokens):
        ids = [enc.ids[i] for i in batch]
        types = [enc.type_ids[i] for i in batch] if enc.type_ids is not None else None
        feeds = model.feeds.build(ids, types, model.encoder.pad_id)
        (out,) = model.run([output], feeds, timing)
        width = feeds["input_ids"].shape[1]
        mask = (np.arange(width)[None, :] < np.array([len(r) for r in ids])[:, None]).astype(np.int64)
        rows = reduce(np.asarray(out), mask)
        if ragged:
            for j, i in enumerate(batch):
                pieces[i] = rows[j, : len(enc.ids[i])]
            continue
        if result is None:
            result = np.empty((len(enc.ids), *rows.shape[1:]), dtype=rows.dtype)
        result[batch] = rows
    if ragged:
        return pieces
    return result if result is not None else np.empty((0,), dtype=np.float32)
