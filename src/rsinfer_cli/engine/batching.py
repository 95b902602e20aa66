"""Cutting rows into forwards: sorted by length, capped by rows and padded tokens (the direct path)."""

from __future__ import annotations

from collections.abc import Sequence


def plan_batches(lengths: Sequence[int], max_rows: int, max_tokens: int,
                 max_padding: int | None = None) -> list[list[int]]:
    """Row indices grouped into forwards, shortest first. A batch closes at `max_rows` rows, before a row that
    would push rows × longest past `max_tokens` padded tokens (an over-budget row runs alone), and - with
    `max_padding` - before a row that would add more than that many padding tokens to the rows already in
    (rows × its extra length): on CPU padding costs more than the per-forward overhead a bigger batch saves."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        width = max(lengths[i], 1)  # sorted: this row is the longest so far
        if current and (len(current) >= max_rows or (len(current) + 1) * width > max_tokens
                        or (max_padding is not None and len(current) * (width - longest) > max_padding)):
            batches.append(current)
            current = []
        current.append(i)
        longest = width
    if current:
        batches.append(current)
    return batches
