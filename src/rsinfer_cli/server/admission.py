"""Async admission to a model's replicas: at most `replicas` forwards at once, at most `max_queue` waiting
(else Saturated → 429), waits bounded by `queue_timeout_ms` (else PoolTimeout → 503).

Work runs on a thread; a slot is given back when the thread finishes, not when the caller stops waiting,
so a timed-out or disconnected caller never lets more forwards run than there are sessions.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

from ..errors import PoolTimeout, Saturated

T = TypeVar("T")


class Gate:
    def __init__(self, name: str, slots: int, max_queue: int, queue_timeout_s: float) -> None:
        self.name = name
        self.slots = slots
        self.max_queue = max_queue
        self.queue_timeout_s = queue_timeout_s
        self._sem = asyncio.Semaphore(slots)
        self.waiting = 0
        self.running = 0

    async def run(self, executor: Executor, fn: Callable[..., T], *args: Any) -> tuple[T, float]:
        """fn(*args) on the executor once a slot is free → (result, seconds waited for the slot)."""
        t0 = time.perf_counter()
        if self._sem.locked():
            if self.waiting >= self.max_queue:
                raise Saturated(f"inference pool of model '{self.name}' is saturated ({self.waiting} requests "
                                "waiting); retry later", model=self.name)
            self.waiting += 1
            try:
                await asyncio.wait_for(self._sem.acquire(), self.queue_timeout_s)
            except asyncio.TimeoutError:
                raise PoolTimeout(f"timed out after {self.queue_timeout_s * 1000:.0f} ms waiting for a session "
                                  f"slot of model '{self.name}'", model=self.name) from None
            finally:
                self.waiting -= 1
        else:
            await self._sem.acquire()
        waited = time.perf_counter() - t0
        self.running += 1
        try:
            fut = asyncio.get_running_loop().run_in_executor(executor, fn, *args)
        except BaseException:
            self._release(None)
            raise
        fut.add_done_callback(self._release)
        return await asyncio.shield(fut), waited

    def _release(self, _fut: Any) -> None:
        self.running -= 1
        self._sem.release()
