"""Cutting rows into forwards: sorted by length, capped by rows and padded tokens (the direct path)."""

from __future__ import annotations

from collections.abc import Sequence


def plan_batches(lengths: Sequence[int], max_rows: int, max_tokens: int) -> list[list[int]]:
    """Row indices grouped into forwards, shortest first. A batch closes at `max_rows` rows or before a row
    that would push rows × longest past `max_tokens` padded tokens; an over-budget row runs alone."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        width = max(lengths[i], 1)  # sorted: this row is the longest so far
        if current and (len(current) >= max_rows or (len(current) + 1) * width > max_tokens):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches
