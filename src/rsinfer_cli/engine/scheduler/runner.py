"""How forwards run and are timed: `stamped`, the one function every forward of a scheduler goes through (its wall
and CPU time to the learner, its rows and padding to the metrics), the `Runner` that a whole request holds a lane
with (the direct path, and the CLI), and `run_rows`, a request's rows in length-sorted forwards on one lane."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..batching import plan_batches
from ..session import Session
from .contract import Cancelled, Observer, RowForward

if TYPE_CHECKING:      # (a sibling room, imported for its type only: the learner is handed in)
    from .learner import Learner


def stamped(forward: RowForward, session: Session, rows: Sequence[Any], costs: Sequence[int],
            learner: Learner | None, observer: Observer | None, here: bool, clock: bool, wide: bool, /
            ) -> tuple[list[Any], float, float]:
    """One forward of `rows` on `session`: its outputs and its perf_counter start and end. Its wall time (and, with
    `clock`, its CPU time on this thread) go to the learner (`here`: it ran on the event loop's thread; a one-row
    forward on the latency lane, `wide`, also teaches the lane's seconds per token), its rows and padded tokens to
    the observer."""
    c0 = time.thread_time() if clock else 0.0
    t0 = time.perf_counter()
    out = forward(session, rows)
    t1 = time.perf_counter()
    if learner is not None:
        learner.took(t1 - t0, time.thread_time() - c0 if clock else None, here)
        if wide and len(rows) == 1:
            learner.lone_took(t1 - t0, costs[0])
    if observer is not None:
        n = len(rows)
        observer.forward(n, costs[0] if n == 1 else n * max(costs, default=1), t1 - t0)
    return out, t0, t1


class Runner:
    """The forwards of one request on one lane (the direct path, and the CLI): stamped, and stopped between
    forwards once the request's caller is gone (`job.done`)."""

    def __init__(self, session: Session, forward: RowForward, observer: Observer | None = None,
                 job: Any = None, learner: Learner | None = None, *, here: bool = False, clock: bool = True,
                 wide: bool = False) -> None:
        self.session = session
        self._forward = forward
        self._observer = observer
        self._job = job
        self._learner = learner
        self._here, self._clock, self._wide = here, clock, wide
        self.spent = 0.0      # without a job (run here, at once): the forwards' seconds, first start to last end
        self.span: tuple[float, float] | None = None

    @property
    def cancelled(self) -> bool:
        return self._job is not None and self._job.done

    def forward(self, rows: Sequence[Any], costs: Sequence[int]) -> list[Any]:
        if self._job is not None and self._job.done:
            raise Cancelled
        out, t0, t1 = stamped(self._forward, self.session, rows, costs, self._learner, self._observer, self._here,
                              self._clock, self._wide)
        if self._job is not None:
            self._job.ran(t0, t1)
        else:
            self.spent += t1 - t0
            self.span = (self.span or (t0, t1))[0], t1
        return out


def run_rows(runner: Runner, rows: Sequence[Any], costs: Sequence[int], *, max_rows: int, max_tokens: int,
             max_padding: int | None = None) -> list[Any]:
    """All rows on one replica in length-sorted forwards of at most `max_rows` rows / `max_tokens` padded
    tokens; one output per row, in row order."""
    if len(rows) == 1:                    # one row: one forward, nothing to plan
        return runner.forward(rows, costs)
    outputs: list[Any] = [None] * len(rows)
    for batch in plan_batches(costs, max_rows, max_tokens, max_padding):
        outs = runner.forward([rows[i] for i in batch], [costs[i] for i in batch])
        for i, out in zip(batch, outs, strict=True):
            outputs[i] = out
    return outputs
