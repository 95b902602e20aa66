"""Request ids and the daemon's log lines: `text` for people, `json` (one object per line) for log pipelines.

A request takes the client's `x-request-id` when it is 1-128 printable ASCII characters, else a new one; the id is
echoed on every answer (errors included) and is in every log line written while the request is handled. The access
line of a request carries its method, route template, model, status, duration, queue wait, forward time and rows:
never a body, a text or an API key.
"""

from __future__ import annotations

import contextvars
import logging
import time
import uuid
from typing import Any

REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("rsinfer_request_id", default=None)
MAX_ID = 128
FORMATS = ("text", "json")
# the structured fields a log call may pass with `extra=`; nothing else of a record reaches a JSON line
FIELDS = ("method", "route", "model", "status", "duration_ms", "queue_ms", "inference_ms", "rows", "client",
          "code")


def request_id(given: str | None) -> str:
    """The client's id when it is 1-128 printable ASCII characters (no spaces), else a new one."""
    if given and len(given) <= MAX_ID and given.isascii() and given.isprintable() and " " not in given:
        return given
    return uuid.uuid4().hex


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = REQUEST_ID.get()
        return True


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        rid = getattr(record, "request_id", None)
        return f"{line} [{rid}]" if rid else line


class JsonFormatter(logging.Formatter):
    """{"ts", "level", "logger", "msg", "request_id"?, the FIELDS given, "exc"?} on one line."""

    def format(self, record: logging.LogRecord) -> str:
        import orjson

        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
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


def configure(level: str, fmt: str = "text") -> None:
    """The root logger of a daemon process: its level, one stderr handler, the format and the request ids."""
    root = logging.getLogger()
    root.setLevel(level.upper())
    if not root.handlers:
        root.addHandler(logging.StreamHandler())
    for h in root.handlers:
        h.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
        if not any(isinstance(f, _RequestIdFilter) for f in h.filters):
            h.addFilter(_RequestIdFilter())
