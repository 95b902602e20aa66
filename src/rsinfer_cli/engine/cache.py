"""A response cache per row: the output of one row's forward (a pooled vector, a pair's logits, a PII window's
label probabilities, a tensor row's outputs), keyed by a digest of the model and the row.

- The key is BLAKE2b over the model's identity (name, version, graph digest, and what the pipeline does to an
  output) and the row as the model sees it (token ids after truncation, or the tensor's bytes). Request options
  that only change how outputs become the answer (dimensions, normalize, threshold, types, labels order …) are
  applied after the cache, so one entry serves them all, and a key never holds text.
- The value is the row's output arrays in a small self-describing binary form (never pickle): model outputs,
  never the input, so a PII entry holds probabilities, not the values it found.
- Backends: `memory` (an LRU bounded by bytes) and `redis` (the `redis` package; one pipelined round trip per
  request, a short timeout, and while Redis is down or slow every request is served without it).
"""

from __future__ import annotations

import hashlib
import logging
import struct
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from ..config import CacheConfig

log = logging.getLogger("rsinfer.cache")

PREFIX = b"rsinfer:row:v1:"
_MAGIC = b"RSC1"
RETRY_AFTER_S = 1.0          # after a Redis failure, requests skip Redis this long before one tries again


class CacheStats(Protocol):
    """Where a backend reports a failed round trip (hits and misses are counted by whoever looks rows up)."""

    def error(self, backend: str) -> None: ...


# ---------------------------------------------------------------- keys and values


def model_identity(name: str, version: str | None, graph_digest: str, pipeline: str) -> bytes:
    return hashlib.blake2b(f"{name}\0{version or ''}\0{graph_digest}\0{pipeline}".encode(), digest_size=16).digest()


def row_key(identity: bytes, row_bytes: bytes) -> bytes:
    return PREFIX + hashlib.blake2b(identity + row_bytes, digest_size=20).hexdigest().encode()


def encode_value(output: Any) -> bytes | None:
    """A row's output (an array, or a dict of named arrays) as bytes; None when it cannot be cached (text)."""
    items = output.items() if isinstance(output, dict) else [("", output)]
    parts = [_MAGIC, struct.pack("<B?", len(output) if isinstance(output, dict) else 1, isinstance(output, dict))]
    for name, value in items:
        arr = np.asarray(value)
        if arr.dtype == object or arr.dtype.kind in "USV":
            return None
        arr = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
        n, d = name.encode(), arr.dtype.str.encode()
        parts += [struct.pack("<HH B", len(n), len(d), arr.ndim), n, d, struct.pack(f"<{arr.ndim}q", *arr.shape),
                  arr.tobytes()]
    return b"".join(parts)


def decode_value(raw: bytes) -> Any:
    if raw[:4] != _MAGIC:
        raise ValueError("not a cached row")
    count, is_dict = struct.unpack_from("<B?", raw, 4)
    pos = 6
    out: dict[str, Any] = {}
    for _ in range(count):
        ln, ld, ndim = struct.unpack_from("<HH B", raw, pos)
        pos += 5
        name = raw[pos:pos + ln].decode()
        pos += ln
        dtype = np.dtype(raw[pos:pos + ld].decode())
        pos += ld
        shape = struct.unpack_from(f"<{ndim}q", raw, pos)
        pos += 8 * ndim
        size = int(np.prod(shape)) * dtype.itemsize if ndim else dtype.itemsize
        out[name] = np.frombuffer(raw, dtype=dtype, count=size // dtype.itemsize, offset=pos).reshape(shape) \
            .astype(dtype.newbyteorder("="))
        pos += size
    return out if is_dict else out[""]


# ---------------------------------------------------------------- backends


class MemoryCache:
    """An LRU bounded by the bytes of its keys and values (the event loop's, or one CLI thread's)."""

    backend = "memory"
    available = True

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._data: OrderedDict[bytes, bytes] = OrderedDict()

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        out: list[bytes | None] = []
        for k in keys:
            v = self._data.get(k)
            if v is not None:
                self._data.move_to_end(k)
            out.append(v)
        return out

    def set_many(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        for k, v in items:
            size = len(k) + len(v)
            if size > self.max_bytes:
                continue
            old = self._data.pop(k, None)
            if old is not None:
                self.bytes -= len(k) + len(old)
            self._data[k] = v
            self.bytes += size
            while self.bytes > self.max_bytes:
                ok, ov = self._data.popitem(last=False)
                self.bytes -= len(ok) + len(ov)

    async def aget_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        return self.get_many(keys)

    async def aset_many(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        self.set_many(items)

    async def close(self) -> None:
        pass


class RedisCache:
    """Redis through the `redis` package: every request's rows in one pipelined round trip with a short timeout.
    A failure is logged once per outage and counted; requests then skip Redis for RETRY_AFTER_S, and the client
    reconnects by itself on the next try."""

    backend = "redis"

    def __init__(self, url: str, ttl_s: int, timeout_s: float, stats: CacheStats | None = None) -> None:
        self.url = url
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self.stats = stats
        self._async: Any = None
        self._sync: Any = None
        self._down_since: float | None = None
        self._retry_at = 0.0

    @property
    def available(self) -> bool:
        return self._down_since is None

    def _skip(self) -> bool:
        return self._down_since is not None and time.monotonic() < self._retry_at

    def _failed(self, exc: BaseException) -> None:
        if self.stats is not None:
            self.stats.error(self.backend)
        if self._down_since is None:
            self._down_since = time.monotonic()
            log.warning("cache: Redis unavailable (%s); serving without the cache until it answers again",
                        type(exc).__name__)
        self._retry_at = time.monotonic() + RETRY_AFTER_S

    def _ok(self) -> None:
        if self._down_since is not None:
            log.warning("cache: Redis answers again after %.1f s", time.monotonic() - self._down_since)
            self._down_since = None

    def _client(self, sync: bool) -> Any:
        import redis
        import redis.asyncio

        t = self.timeout_s
        if sync:
            if self._sync is None:
                self._sync = redis.Redis.from_url(self.url, socket_timeout=t, socket_connect_timeout=t)
            return self._sync
        if self._async is None:
            self._async = redis.asyncio.Redis.from_url(self.url, socket_timeout=t, socket_connect_timeout=t)
        return self._async

    async def acount(self, key: bytes, ttl_s: int) -> int | None:
        """A counter shared by every process that uses this Redis: INCR (the key expires after `ttl_s`) in one
        pipelined round trip; None when Redis does not answer (the caller counts on its own then)."""
        if self._skip():
            return None
        try:
            pipe = self._client(False).pipeline(transaction=False)
            pipe.incr(key)
            pipe.expire(key, ttl_s, nx=True)
            count, _ = await pipe.execute()
        except Exception as exc:  # noqa: BLE001 - any failure: served around
            self._failed(exc)
            return None
        self._ok()
        return int(count)

    async def aget_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        if not keys or self._skip():
            return [None] * len(keys)
        try:
            values = await self._client(False).mget(list(keys))
        except Exception as exc:  # noqa: BLE001 - any failure of the cache is served around
            self._failed(exc)
            return [None] * len(keys)
        self._ok()
        return list(values)

    async def aset_many(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        if not items or self._skip():
            return
        try:
            async with self._client(False).pipeline(transaction=False) as pipe:
                for k, v in items:
                    pipe.set(k, v, ex=self.ttl_s)
                await pipe.execute()
        except Exception as exc:  # noqa: BLE001
            self._failed(exc)
            return
        self._ok()

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        if not keys or self._skip():
            return [None] * len(keys)
        try:
            values = self._client(True).mget(list(keys))
        except Exception as exc:  # noqa: BLE001
            self._failed(exc)
            return [None] * len(keys)
        self._ok()
        return list(values)

    def set_many(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        if not items or self._skip():
            return
        try:
            with self._client(True).pipeline(transaction=False) as pipe:
                for k, v in items:
                    pipe.set(k, v, ex=self.ttl_s)
                pipe.execute()
        except Exception as exc:  # noqa: BLE001
            self._failed(exc)
            return
        self._ok()

    async def close(self) -> None:
        if self._async is not None:
            await self._async.aclose()
        if self._sync is not None:
            self._sync.close()


Cache = MemoryCache | RedisCache


def open_cache(cfg: CacheConfig | None, stats: CacheStats | None = None) -> Cache | None:
    if cfg is None:
        return None
    if cfg.backend == "redis":
        return RedisCache(cfg.url, cfg.ttl_s, cfg.timeout_ms / 1000, stats)
    return MemoryCache(int(cfg.max_mb * 2**20))
