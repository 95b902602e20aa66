"""Per-client rate limits (`server.rate_limit`): `requests` per `window_s`, in fixed windows.

A client is its API key when keys are configured (the position of the key in `server.api_keys`: the key itself is
never kept or shown), else its address. A key entry may carry its own limit. Over the limit, a request is answered
429 with `Retry-After` and the `RateLimit-Limit` / `RateLimit-Remaining` / `RateLimit-Reset` headers (also sent on
every limited answer under the limit) and counted in `rsinfer_rate_limited_total{route}`.

Memory is bounded by the clients seen in the current window: at each new window every older count is dropped.

Across processes: when the row cache is Redis, every request of a limited client is counted there (one pipelined
INCR + EXPIRE on the cache's client, windows on the wall clock so every machine agrees, the client hashed in the
key), so the limit holds across front ends and across replicas that share the Redis. Without Redis, or while it
does not answer, every front end of N holds `ceil(requests / N)` of the limit on its own (connections are spread by
the kernel; a client pinned to one front end by keep-alive gets that share, never more than the whole limit).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Limit:
    requests: int
    window_s: float


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    limit: int
    remaining: int
    reset_s: float                  # until the window ends
    window_s: float

    def headers(self) -> dict[str, str]:
        reset = str(max(1, math.ceil(self.reset_s)))
        out = {"RateLimit-Limit": str(self.limit), "RateLimit-Remaining": str(self.remaining),
               "RateLimit-Reset": reset}
        if not self.allowed:
            out["Retry-After"] = reset
        return out


class RateLimiter:
    """Fixed-window counters by client; event-loop thread only (no lock)."""

    def __init__(self, default: Limit | None, per_key: dict[int, Limit] | None = None, share: int = 1,
                 clock: object = None) -> None:
        self.default = default
        self.per_key = per_key or {}
        self.share = max(1, share)
        self._clock = clock if callable(clock) else time.monotonic
        self._counts: dict[str, tuple[float, int]] = {}   # client → (end of its current window, requests in it)
        windows = [lim.window_s for lim in [default, *self.per_key.values()] if lim is not None]
        self._sweep_every = min(windows) if windows else 60.0
        self._next_sweep = 0.0

    def __len__(self) -> int:
        return len(self._counts)

    def limit_for(self, key_index: int | None) -> Limit | None:
        """The key's own limit, else the default (None: the client is not limited)."""
        return self.per_key.get(key_index, self.default) if key_index is not None else self.default

    def check(self, client: str, key_index: int | None = None) -> Verdict | None:
        """This request's verdict; None when no limit applies to the client."""
        limit = self.limit_for(key_index)
        if limit is None:
            return None
        allowed_n = max(1, math.ceil(limit.requests / self.share))
        now: float = self._clock()
        if now >= self._next_sweep:                       # drop every window that has ended
            self._counts = {c: v for c, v in self._counts.items() if v[0] > now}
            self._next_sweep = now + self._sweep_every
        end = (math.floor(now / limit.window_s) + 1) * limit.window_s
        current, n = self._counts.get(client, (end, 0))
        if current != end:
            n = 0
        if n >= allowed_n:
            return Verdict(False, allowed_n, 0, end - now, limit.window_s)
        self._counts[client] = (end, n + 1)
        return Verdict(True, allowed_n, allowed_n - n - 1, end - now, limit.window_s)

    async def acheck(self, client: str, key_index: int | None,
                     counter: Callable[[bytes, int], Awaitable[int | None]]) -> Verdict | None:
        """The verdict from a counter every process shares (Redis), the whole limit; this process's own share
        (`check`) when the counter does not answer."""
        limit = self.limit_for(key_index)
        if limit is None:
            return None
        now = time.time()                                  # shared windows: the wall clock every machine agrees on
        end = (math.floor(now / limit.window_s) + 1) * limit.window_s
        who = hashlib.blake2b(client.encode(), digest_size=12).hexdigest()
        count = await counter(f"rsinfer:ratelimit:{who}:{end:.3f}".encode(), math.ceil(limit.window_s) + 1)
        if count is None:
            return self.check(client, key_index)
        return Verdict(count <= limit.requests, limit.requests, max(0, limit.requests - count), end - now,
                       limit.window_s)
