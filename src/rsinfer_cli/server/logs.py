"""Request ids and the daemon's log lines: `text` for people, `json` (one object per line) for log pipelines.

A request takes the client's `x-request-id` when it is 1-128 printable ASCII characters, else a new one; the id is
echoed on every answer (errors included) and is in every log line written while the request is handled. The access
line of a request carries its method, route template, model, status, duration, queue wait, forward time and rows:
never a body, a text or an API key.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("rsinfer_request_id", default=None)
MAX_ID = 128
FORMATS = ("text", "json")
# the structured fields a log call may pass with `extra=`; nothing else of a record reaches a JSON line
FIELDS = ("method", "route", "model", "status", "duration_ms", "queue_ms", "inference_ms", "rows", "client",
          "code")


def request_id(given: str | None) -> str:
    """The client's id when it is 1-128 printable ASCII characters (no spaces), else a new one: 32 hex digits, a
    random half drawn once per process (again in a forked child) and a count, unique like uuid4's without a
    getrandom call per request."""
    if given and len(given) <= MAX_ID and given.isascii() and given.isprintable() and " " not in given:
        return given
    return f"{_ids.prefix}{next(_ids.count):016x}"


class _Ids:
    def __init__(self) -> None:
        self.reseed()

    def reseed(self) -> None:
        self.prefix, self.count = secrets.token_hex(8), itertools.count(int.from_bytes(secrets.token_bytes(4), "big"))


_ids = _Ids()
os.register_at_fork(after_in_child=_ids.reseed)


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = REQUEST_ID.get()
        return True


# "000".."999": a line's milliseconds by index (f"{ms:03d}" parses its format spec on every line)
MILLIS = tuple(f"{ms:03d}" for ms in range(1000))


class _Stamps:
    """A time's text to the second, kept while the second lasts (one strftime a second, not one a line)."""

    def __init__(self, fmt: str, convert: Callable[[float], time.struct_time]) -> None:
        self.fmt, self.convert = fmt, convert
        self.second, self.text = -1, ""

    def __call__(self, created: float) -> str:
        second = int(created)
        if second != self.second:
            self.second, self.text = second, time.strftime(self.fmt, self.convert(created))
        return self.text


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self._stamp = _Stamps(self.default_time_format, time.localtime)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        rid = getattr(record, "request_id", None)
        return f"{line} [{rid}]" if rid else line

    def info_line(self, name: str, created: float, msg: str, rid: str | None,
                  fields: Callable[[], dict[str, Any]], end: str = "") -> str:
        """What format() makes of an INFO record of `name` with this message, id and `extra` fields (the text
        format prints none of them: `fields` is not called), followed by `end` (one string made, not three)."""
        second, stamps = int(created), self._stamp     # (the stamp's cache read here: a call less a line)
        stamp = stamps.text if second == stamps.second else stamps(created)
        ms = MILLIS[int((created - second) * 1000)]
        if rid:
            return f"{stamp},{ms} INFO {name}: {msg} [{rid}]{end}"
        return f"{stamp},{ms} INFO {name}: {msg}{end}"


class JsonFormatter(logging.Formatter):
    """{"ts", "level", "logger", "msg", "request_id"?, the FIELDS given, "exc"?} on one line."""

    def __init__(self) -> None:
        super().__init__()
        self._stamp = _Stamps("%Y-%m-%dT%H:%M:%S", time.gmtime)

    def format(self, record: logging.LogRecord) -> str:
        import orjson

        out: dict[str, Any] = {
            "ts": f"{self._stamp(record.created)}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(), "logger": record.name, "msg": record.getMessage()}
        rid = getattr(record, "request_id", None)
        if rid:
            out["request_id"] = rid
        for key in FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out).decode()

    def info_line(self, name: str, created: float, msg: str, rid: str | None,
                  fields: Callable[[], dict[str, Any]], end: str = "") -> str:
        import orjson

        given = fields()
        out: dict[str, Any] = {"ts": f"{self._stamp(created)}.{int((created - int(created)) * 1000):03d}Z",
                               "level": "info", "logger": name, "msg": msg}
        if rid:
            out["request_id"] = rid
        for key in FIELDS:
            value = given.get(key)
            if value is not None:
                out[key] = value
        return orjson.dumps(out).decode() + end


ACCESS = logging.getLogger("rsinfer.access")
# how long a line logged on an event loop may wait for the write that takes it with the others logged meanwhile
FLUSH_S = 0.05


def access(msg: str, fields: Callable[[], dict[str, Any]]) -> None:
    """A request's access line (never a body, a text or a key): `msg` and the structured fields of FIELDS (made by
    `fields()` only when a format prints them).
    Where the daemon's own stderr handler is the only one a record of `rsinfer.access` reaches, the line is made
    here without a LogRecord, in the same text as the formatter's (a test holds them equal): under load this cut
    logging's CPU per request by about two thirds (benchmarks/RESULTS.md)."""
    handler = _direct()
    if handler is None:
        ACCESS.info("%s", msg, extra=fields())
        return
    fmt = handler.formatter
    assert isinstance(fmt, (TextFormatter, JsonFormatter))
    handler.line(fmt.info_line(ACCESS.name, time.time(), msg, REQUEST_ID.get(), fields, handler.terminator))


_FORMATTERS = (TextFormatter, JsonFormatter)


def _direct() -> LoopStreamHandler | None:
    """The daemon's stderr handler when an access record would reach it and nothing else (else None). Exact types:
    a subclass of our formatters may format differently."""
    root = logging.root
    handlers = root.handlers
    if ACCESS.handlers or ACCESS.filters or not ACCESS.propagate or len(handlers) != 1 or root.filters:
        return None
    h = handlers[0]
    if type(h) is not LoopStreamHandler or h.level > logging.INFO or type(h.formatter) not in _FORMATTERS:
        return None
    for f in h.filters:
        if type(f) is not _RequestIdFilter:
            return None
    return h


class LoopStreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """stderr, written at most every FLUSH_S seconds instead of once per line (nginx's `access_log ... flush=`).

    A line logged on a thread running an event loop (every access line) is kept until FLUSH_S after the first line
    that waits, then all of them go out in one write: one system call for every request answered meanwhile, not one
    each. A write per line cost 63 µs of CPU per request (64 clients on `add_one`); one per loop iteration still cost
    a gRPC call 30-40 µs, because grpc.aio answers each call in an iteration of its own (benchmarks/RESULTS.md).
    Lines from other threads, and every line at `flush()` (shutdown, `logging.shutdown()`), are written at once,
    after any that wait, so nothing is lost and one thread's lines keep their order."""

    def __init__(self) -> None:
        super().__init__()
        self._pending: list[str] = []
        # the thread, and its event loop, that has a write of the pending lines scheduled
        self._due: tuple[int, asyncio.AbstractEventLoop] | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + self.terminator
        except Exception:  # noqa: BLE001 - logging's own contract: report, never raise
            self.handleError(record)
            return
        self.line(line)

    def line(self, line: str) -> None:
        """A formatted line (with its terminator): out with the write due on this thread's loop, or now off a loop.
        Only the first line of a write looks for the running loop (on Python 3.11 that look-up is a getpid() system
        call); the others join the write already due."""
        me = threading.get_ident()
        lock = self.lock
        assert lock is not None
        lock.acquire()       # not `with`: see metrics._Count.inc
        try:
            self._pending.append(line)
            due = self._due
        finally:
            lock.release()
        if due is not None and due[0] == me and due[1].is_running():
            return       # this thread's loop writes them when that write is due
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or loop.is_closed():
            self.flush()     # off a loop (or after its loop ended, with what that loop left unwritten): now
        else:
            with self.lock:   # type: ignore[union-attr]
                if self._due is None:
                    self._due = (me, loop)
            loop.call_later(FLUSH_S, self.flush)

    def flush(self) -> None:
        with self.lock:   # type: ignore[union-attr]
            lines, self._pending, self._due = self._pending, [], None
            if lines:
                try:
                    self.stream.write("".join(lines))
                except Exception:  # noqa: BLE001 - a closed or full stderr must not take the daemon down
                    return
            if self.stream and hasattr(self.stream, "flush"):
                try:
                    self.stream.flush()
                except Exception:  # noqa: BLE001
                    return


def configure(level: str, fmt: str = "text") -> None:
    """The root logger of a daemon process: its level, one stderr handler, the format and the request ids.

    Records carry no caller, thread or process fields (none of our formats prints them; the logging HOWTO's
    "Optimization" section): an access line per request costs the formatting and a share of one write."""
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging.logAsyncioTasks = False  # type: ignore[attr-defined,unused-ignore]  # 3.12+: no task name per record
    root = logging.getLogger()
    root.setLevel(level.upper())
    for h in list(root.handlers):          # the CLI's basicConfig line to stderr: the batched one replaces it
        if type(h) is logging.StreamHandler and h.stream is sys.stderr:
            root.removeHandler(h)
    if not root.handlers:
        root.addHandler(LoopStreamHandler())
    for h in root.handlers:
        h.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
        if not any(isinstance(f, _RequestIdFilter) for f in h.filters):
            h.addFilter(_RequestIdFilter())
