"""What the rooms of the scheduler and their callers agree on: a model's queue as the runtime asks it (`ModelQueue`:
one `answer` per request), the request as a queue sees it (`Asked`), how a family's rows run (`Forwarding`,
`RowForward`) and where forwards are reported (`Observer`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar

from ..cancel import Token
from ..session import Session

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)

# collate rows → feeds, run them on one session, split the outputs back: one output per row (worker thread)
RowForward = Callable[[Session, Sequence[Any]], list[Any]]


class Observer(Protocol):
    """Where the scheduler reports, once per forward and once per request (metrics)."""

    def forward(self, rows: int, padded: int, seconds: float) -> None: ...
    def waited(self, seconds: float) -> None: ...


class Forwarding(Protocol):
    """A family's pipeline as the scheduler sees it: how rows run and how they may be grouped."""

    max_rows: int
    max_tokens: int
    max_padding: int | None

    @property
    def batching(self) -> bool: ...
    def forward(self, session: Session, rows: Sequence[Any]) -> list[Any]: ...


class Rows(Protocol):
    """A planned request's rows (whatever its family made of it) and the cost of each (its tokens)."""

    @property
    def rows(self) -> Sequence[Any]: ...
    @property
    def costs(self) -> Sequence[int]: ...


class Asked(Protocol[R_co]):
    """A request as its queue sees it (the runtime's `core.Ask`): its cancellation token, whether it is small (its
    tokenizing and answer cost less than a thread hop, so they may run on the event loop), its plan (tokenizing →
    rows, the first thing any path runs, once) and its answer from the rows' outputs in row order. `timed` takes its
    queue wait and forwards (perf_counter) into the request's record."""

    @property
    def token(self) -> Token: ...
    @property
    def small(self) -> bool: ...
    def plan(self) -> Rows: ...
    def finish(self, outputs: list[Any]) -> R_co: ...
    def timed(self, enqueued: float, started: float, forward_s: float, span: tuple[float, float] | None) -> None: ...


class QueueStats(NamedTuple):
    waiting: int        # requests queued and not started
    queued_rows: int    # their rows
    running: int        # forwards (or trains of them) running


class ModelQueue(Protocol):
    """A model's queue as the runtime's core asks it: the local `Scheduler` (one process), or a front-end process's
    `RemoteQueue` (workers/frontend.py). Each owns its path choice: where the request is planned, where its rows run
    and where its answer is built."""

    async def answer(self, ask: Asked[R]) -> R: ...
    def stats(self) -> QueueStats: ...
    def stop(self) -> None: ...


class Cancelled(Exception):
    """Raised in a worker when the request it works for has no caller any more."""


def as_is(outputs: list[Any]) -> list[Any]:
    """A `finish` that answers with the rows' outputs themselves (their answer is built elsewhere: by a front
    end after its engine ran them, or by the caller after the rows came back)."""
    return outputs
