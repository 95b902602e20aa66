"""The linear span arithmetic (pipelines/spans.py and its users) answers exactly what the definitions it replaced
answer - the quadratic scans, written here as the reference - over random spans, overlapping and nested."""

from __future__ import annotations

import random

import pytest

from rsinfer_cli.pipelines.pii import Entity, with_rules
from rsinfer_cli.pipelines.pii_rules import Found, Rules
from rsinfer_cli.pipelines.spans import Containers, Taken


def random_spans(rng: random.Random, n: int, length: int) -> list[tuple[int, int]]:
    """Non-empty spans (no finder yields an empty one: patterns, deny values, recognizers and the model's decoding
    drop them, and /anonymize refuses them)."""
    out = []
    for _ in range(n):
        a = rng.randrange(length - 1)
        out.append((a, min(length, a + rng.randint(1, 12))))
    return out


@pytest.mark.parametrize("seed", range(20))
def test_containers_answer_as_the_scan(seed):
    rng = random.Random(seed)
    spans = random_spans(rng, rng.randint(0, 40), 100)
    holds = Containers(spans)
    for a, b in random_spans(rng, 200, 100):
        for same in (False, True):
            want = any(x <= a and b <= y and ((x, y) != (a, b) or same) for x, y in spans)
            assert holds.holds(a, b, same) == want, (spans, a, b, same)


@pytest.mark.parametrize("seed", range(20))
def test_taken_answers_as_the_scan(seed):
    rng = random.Random(seed)
    kept: list[tuple[int, int]] = []
    taken = Taken(100)
    for a, b in random_spans(rng, 60, 100):
        want = any(a < y and x < b for x, y in kept)
        assert taken.overlaps(a, b) == want
        if not want:
            taken.take(a, b)
            kept.append((a, b))


class _Found(Rules):
    """Rules that find what they are given."""

    def __init__(self, found: list[Found]) -> None:
        super().__init__()
        object.__setattr__(self, "given", found)

    def found(self, text: str) -> list[Found]:
        return list(self.given)      # type: ignore[attr-defined]


def reference_with_rules(entities, found, threshold):
    found = sorted((f for f in found if f.score >= threshold), key=lambda f: (-(f.end - f.start), -f.score, f.start))
    if not found:
        return entities
    matches = []
    for f in found:
        if not any(f.start < m.end and m.start < f.end for m in matches):
            matches.append(Entity(f.entity_type, "", f.score, f.start, f.end, source=f.source))
    kept = [e for e in entities if not any(e.start < m.end and m.start < e.end for m in matches)]
    return sorted(kept + matches, key=lambda e: (e.start, e.end))


@pytest.mark.parametrize("seed", range(20))
def test_with_rules_answers_as_the_scan(seed):
    rng = random.Random(seed)
    text = "x" * 100
    found = [Found("T", a, b, rng.choice([0.4, 0.85, 1.0])) for a, b in random_spans(rng, 50, 100)]
    model = [Entity("M", "", 0.9, a, b) for a, b in random_spans(rng, 20, 100)]
    got = [(e.entity_type, e.start, e.end) for e in with_rules(text, model, _Found(found), 0.5)]
    want = [(e.entity_type, e.start, e.end) for e in reference_with_rules(model, found, 0.5)]
    assert got == want
