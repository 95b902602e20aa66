"""A pool of `replicas` ORT sessions with a waiter budget (→ Saturated) and a wait limit (→ PoolTimeout)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

from ..errors import PoolTimeout, Saturated

S = TypeVar("S")


class SessionPool(Generic[S]):
    """Hands out one session per forward. Thread-safe; a session always comes back, whatever happens."""

    def __init__(self, sessions: list[S], *, max_queue: int, queue_timeout_s: float, name: str = "") -> None:
        if not sessions:
            raise ValueError("a pool needs at least one session")
        self.name = name
        self.max_queue = max_queue
        self.queue_timeout_s = queue_timeout_s
        self._all = list(sessions)
        self._free = list(sessions)
        self._waiting = 0
        self._cond = threading.Condition()

    @property
    def size(self) -> int:
        return len(self._all)

    @property
    def idle(self) -> int:
        return len(self._free)

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def sessions(self) -> list[S]:
        return list(self._all)

    @contextmanager
    def acquire(self, timeout_s: float | None = None) -> Iterator[S]:
        """Borrow a session; Saturated when `max_queue` callers already wait, PoolTimeout after the wait limit."""
        session = self._take(self.queue_timeout_s if timeout_s is None else timeout_s)
        try:
            yield session
        finally:
            with self._cond:
                self._free.append(session)
                self._cond.notify()

    def _take(self, timeout_s: float) -> S:
        with self._cond:
            if self._free:
                return self._free.pop()
            if self._waiting >= self.max_queue:
                raise Saturated(f"inference pool of model '{self.name}' is saturated "
                                f"({self._waiting} requests waiting); retry later", model=self.name or None)
            self._waiting += 1
            try:
                deadline = time.monotonic() + timeout_s
                while not self._free:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise PoolTimeout(f"timed out after {timeout_s * 1000:.0f} ms waiting for a session "
                                          f"slot of model '{self.name}'", model=self.name or None)
                    self._cond.wait(remaining)
                return self._free.pop()
            finally:
                self._waiting -= 1

    def stats(self) -> dict[str, Any]:
        return {"replicas": self.size, "idle": self.idle, "waiting": self.waiting}
