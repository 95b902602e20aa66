"""Cooperative cancellation of a request's CPU work on any thread: its tokenizing and post-processing.

A forward in flight is cancelled by the scheduler; work that is plain Python (PII span resolution, custom patterns,
redaction) cannot be stopped from outside its thread. So the inference core gives each served request a `Token`
(its deadline, and a flag set when its caller goes away - a 408, a closed connection, a cancelled gRPC call), and
runs the request's work on a thread with that token current (`running`). Long loops call `checkpoint()` every so
often: with no token current (the one-shot CLI) it costs one attribute read; past the deadline or once cancelled it
raises `DeadlinePassed`, so the thread lets go of its core (and of the model's lane) within one step of the loop.
The CPU time each token's work took on its threads is summed in `cpu_s` (the per-request CPU metric)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import DeadlinePassed

T = TypeVar("T")
_local = threading.local()


class Stop:
    """Set once, for every token made with it: the server is closing, what still runs stops at its next checkpoint
    (one flag read by each check, instead of a set of the tokens in flight kept up by every request)."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = False


_NEVER = Stop()


class Token:
    """One request's deadline (time.monotonic()), whether its caller has gone, and the server's `Stop`."""

    __slots__ = ("deadline", "cancelled", "cpu_s", "late", "stop")

    def __init__(self, timeout_s: float, stop: Stop = _NEVER) -> None:
        self.deadline = time.monotonic() + timeout_s
        self.stop = stop
        self.cancelled = False
        self.cpu_s = 0.0
        # once its request has been answered without it (cancelled): where the CPU of work still running goes
        self.late: Callable[[float], None] | None = None

    def check(self) -> None:
        if self.cancelled or self.stop.now or time.monotonic() > self.deadline:
            self.cancelled = True
            raise DeadlinePassed("the request's deadline passed (server.request_timeout_ms) or its caller went away; "
                                 "its work was stopped")


def checkpoint() -> None:
    """Raise DeadlinePassed when the work running on this thread belongs to a request that is past its deadline or
    cancelled; nothing otherwise (and nothing outside a served request)."""
    token: Token | None = getattr(_local, "token", None)
    if token is not None:
        token.check()


def running(token: Token, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """fn(*args, **kwargs) with `token` current on this thread (checked first), its thread CPU time added to
    the token's `cpu_s` (or, once the request is answered without it, to `late`)."""
    if token.cancelled or token.stop.now or time.monotonic() > token.deadline:   # (check(), written out)
        token.check()
    outer = getattr(_local, "token", None)
    _local.token = token
    c0 = time.thread_time()
    try:
        return fn(*args, **kwargs)
    finally:
        used = time.thread_time() - c0
        late = token.late
        if late is not None:
            late(used)
        else:
            token.cpu_s += used
        _local.token = outer
