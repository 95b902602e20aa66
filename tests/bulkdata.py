"""The 2,000-row dataset the Ray and Spark tests share, and the API's answers for it: computed once per test run
(the Ray and the Spark tests compare against the same answers)."""

from __future__ import annotations

import functools
from pathlib import Path

ROWS = 2000


def texts(n: int = ROWS) -> list[str]:
    return [f"Ticket {i}: mail ana.souza{i}@example.org, call +44 20 7946 {i % 10000:04d}" if i % 5 else
            f"ticket {i} about an overdue invoice" for i in range(n)]


@functools.cache
def api_answers(shared: Path) -> dict:
    """What the API answers for texts(): embeddings, sparse vectors (top 16) and redactions (mode replace)."""
    import rsinfer_cli

    return {"embed": rsinfer_cli.load(shared / "all-minilm-l6-v2").embed(texts()),
            "sparse": rsinfer_cli.load(shared / "tiny-splade").sparse(texts(), top_k=16),
            "redact": rsinfer_cli.load(shared / "rampart-pii").redact(texts(), mode="replace")}
