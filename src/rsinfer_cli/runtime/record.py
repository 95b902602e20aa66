"""One request as it crosses the core (TEI's ResponseMetadata, and the queue's `Asked`): every front door makes one
per request and passes it to the core (`Inference.infer(record, ...)`): the HTTP middleware, the KServe gRPC
servicer, the CLI's one-shot commands and the Python API alike. The front door notes what it knows (its body's
size); the core gives it the request's plan and token and notes its model, rows and cache status; the plan's and the
answer's spans are stamped as they run, and the queue notes its wait and forwards (`timed`). Its timing headers,
access line, spans and metrics read these fields; a field nobody set stays None (and out of the access line).

A plain class whose fields are class attributes (None): making one is no Python call (no `__init__`), and a request
sets only what it has - a few µs less on every request than a dataclass's generated `__init__` of ten fields."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..engine.cancel import Token
    from ..pipelines.base import Work


class RequestRecord:
    body_bytes: int | None = None                # the body's size, when the front knows it
    model: str | None = None                     # the model's key, once the core has the request
    cache: str | None = None                     # hit | partial | miss, with a row cache
    rows: int | None = None
    queue_ms: float | None = None
    inference_ms: float | None = None
    postprocess_ms: float | None = None
    t_tokenize: tuple[float, float] | None = None   # perf_counter spans, for traces and the tokenization header
    t_queue: tuple[float, float] | None = None
    t_forward: tuple[float, float] | None = None

    # while the core runs it: its plan with the route's arguments, its token, and what the plan made
    call: tuple[Callable[..., Work[Any]], Any, Any]
    token: Token
    small: bool = False          # its body is small: planned and answered on the event loop when that pays
    work: Work[Any] | None = None

    def plan(self) -> Work[Any]:
        """The plan run (tokenizing, → rows), its span stamped."""
        fn, args, kwargs = self.call
        t0 = time.perf_counter()
        try:
            work = self.work = fn(*args, **kwargs)
        finally:
            self.t_tokenize = (t0, time.perf_counter())
        return work

    def finish(self, outputs: list[Any]) -> Any:
        """The answer from the rows' outputs in row order, its post-processing time added."""
        t0 = time.perf_counter()
        try:
            assert self.work is not None
            return self.work.finish(outputs)
        finally:
            self.postprocess_ms = (self.postprocess_ms or 0.0) + (time.perf_counter() - t0) * 1000

    def timed(self, enqueued: float, started: float, forward_s: float, span: tuple[float, float] | None) -> None:
        """A job's queue wait and forward time (perf_counter): milliseconds for the access line and headers,
        spans for traces."""
        self.queue_ms = (self.queue_ms or 0.0) + (started - enqueued) * 1000
        self.inference_ms = (self.inference_ms or 0.0) + forward_s * 1000
        self.t_queue = (enqueued, started)
        if span is not None:
            self.t_forward = span

    def log_fields(self) -> dict[str, Any]:
        """The fields of the access line: those set, milliseconds rounded to µs, no perf_counter spans."""
        out: dict[str, Any] = {}
        for name in LOGGED:
            value = getattr(self, name)
            if value is not None:
                out[name] = round(value, 3) if isinstance(value, float) else value
        return out


LOGGED = ("body_bytes", "model", "cache", "rows", "queue_ms", "inference_ms", "postprocess_ms")
# every field of the record (an access line, a span or a header may carry)
FIELDS = (*LOGGED, "t_tokenize", "t_queue", "t_forward")
