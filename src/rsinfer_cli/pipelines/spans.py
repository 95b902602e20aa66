"""Span arithmetic in time linear in the text: where thousands of spans meet (a text of matches), a test of each
span against all those kept is quadratic - about an hour of CPU for a 1,000,000-character text of one-letter
matches. Here a kept span marks its characters in a bytearray (`Taken`), so "does [a, b) overlap anything kept" reads
only b - a bytes; and "is [a, b) inside one of these spans" is a binary search over their starts with the running
maximum of their ends (`Containers`)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from itertools import accumulate

from ..engine.cancel import checkpoint

EVERY = 1024          # spans between two cancellation checkpoints in the loops that walk them


class Taken:
    """Characters claimed by kept spans (a span is [start, end) in code points)."""

    __slots__ = ("mask",)

    def __init__(self, n: int) -> None:
        self.mask = bytearray(n)

    def overlaps(self, a: int, b: int) -> bool:
        return self.mask.find(1, a, b) != -1

    def take(self, a: int, b: int) -> None:
        if b > a:
            self.mask[a:b] = b"\x01" * (b - a)

    @classmethod
    def of(cls, n: int, spans: Iterable[tuple[int, int]]) -> Taken:
        taken = cls(n)
        for i, (a, b) in enumerate(spans):
            if not i % EVERY:
                checkpoint()
            taken.take(a, b)
        return taken


class Containers:
    """Spans asked "which of you contains [a, b)": sorted by start, with the largest end up to each."""

    __slots__ = ("starts", "reach", "exact")

    def __init__(self, spans: Iterable[tuple[int, int]]) -> None:
        ordered = sorted(spans)
        self.starts = [a for a, _ in ordered]
        self.reach = list(accumulate((b for _, b in ordered), max))
        self.exact = frozenset(ordered)

    def holds(self, a: int, b: int, same_counts: bool) -> bool:
        """Whether one span contains [a, b); one equal to it counts only when `same_counts`."""
        i = bisect_right(self.starts, a)            # spans starting at or before a
        if i and self.reach[i - 1] > b:
            return True
        j = bisect_left(self.starts, a)             # spans starting strictly before a
        if j and self.reach[j - 1] >= b:
            return True
        return same_counts and (a, b) in self.exact
