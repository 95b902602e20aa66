"""The ONE mapping from errors (ours and aiohttp's) to HTTP status and the OpenAI-style error body.

    {"error": {"message": str, "type": str, "param": str | null, "code": <HTTP status as int>}}
"""

from __future__ import annotations

from aiohttp import web

from ..errors import (
    DeadlinePassed,
    EngineUnavailable,
    InferenceError,
    InputError,
    KindMismatch,
    ModelNotFound,
    NotAllowed,
    PayloadTooLarge,
    PoolTimeout,
    RsinferError,
    Saturated,
    UnknownModel,
    VersionNotFound,
)
from ..jsonio import encode
from .schemas import KServeError, OpenAIError, OpenAIErrorDetail


class RequestValidationError(InputError):
    """The body has the wrong shape: a field of the wrong type or a required field missing (422)."""


class Unauthorized(RsinferError):
    type = "authentication_error"


class RequestTimeout(RsinferError):
    type = "timeout_error"


class RateLimited(RsinferError):
    """Over `server.rate_limit`: 429 with Retry-After and the RateLimit-* headers (sent for every limited answer)."""

    type = "rate_limit_error"


STATUS: dict[type[BaseException], tuple[int, str]] = {
    RequestValidationError: (422, "invalid_request_error"),
    VersionNotFound: (404, "model_not_found"),
    PayloadTooLarge: (413, "invalid_request_error"),
    KindMismatch: (400, "invalid_request_error"),
    InputError: (400, "invalid_request_error"),
    ModelNotFound: (404, "model_not_found"),
    Unauthorized: (401, "authentication_error"),
    NotAllowed: (403, "permission_error"),
    RequestTimeout: (408, "timeout_error"),
    DeadlinePassed: (408, "timeout_error"),
    Saturated: (429, "rate_limit_error"),
    RateLimited: (429, "rate_limit_error"),
    PoolTimeout: (503, "timeout_error"),
    EngineUnavailable: (503, "server_error"),
    InferenceError: (500, "server_error"),
    RsinferError: (500, "server_error"),
}

HTTP_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
              404: "not_found_error", 405: "invalid_request_error", 408: "timeout_error", 413: "invalid_request_error",
              415: "invalid_request_error", 422: "invalid_request_error", 429: "rate_limit_error"}


def status_for(exc: BaseException) -> tuple[int, str]:
    for klass in type(exc).__mro__:
        if klass in STATUS:
            return STATUS[klass]
    return 500, "server_error"


def error_response(status: int, message: str, type_: str, param: str | None = None,
                   headers: dict[str, str] | None = None) -> web.Response:
    """The OpenAI-style error body every route but the tensor ones answers with."""
    body = OpenAIError(error=OpenAIErrorDetail(message=message, type=type_, param=param, code=status))
    return web.Response(status=status, body=encode(body), content_type="application/json", headers=headers)


def kserve_message(exc: RsinferError) -> str:
    """An error's message on a KServe front (REST and gRPC): Triton's own words where its clients check them (its
    examples test that an unknown model's error starts with "Request for unknown model")."""
    return exc.triton if isinstance(exc, UnknownModel) else exc.public


def response_for(exc: BaseException, kserve: bool = False) -> web.Response:
    """The response for any exception a handler raised; `kserve`: KServe's body `{"error": "..."}` (the tensor
    routes), else the OpenAI-style body."""
    if kserve:
        status = status_for(exc)[0] if isinstance(exc, RsinferError) else \
            exc.status if isinstance(exc, web.HTTPException) else 500
        message = kserve_message(exc) if isinstance(exc, RsinferError) else \
            (exc.reason if isinstance(exc, web.HTTPException) else "internal server error")
        headers = {"Retry-After": "1"} if status in (429, 503) else None
        if status == 401:
            headers = {"WWW-Authenticate": 'Bearer realm="rsinfer"'}
        return web.Response(status=status, body=encode(KServeError(error=message)), content_type="application/json",
                            headers=headers)
    if isinstance(exc, RsinferError):
        status, type_ = status_for(exc)
        headers = {"Retry-After": "1"} if status in (429, 503) else None
        if status == 401:
            headers = {"WWW-Authenticate": 'Bearer realm="rsinfer"'}
        if isinstance(exc, RateLimited):
            headers = None      # Retry-After and RateLimit-* come with every limited answer (app._no_banner)
        return error_response(status, exc.public, type_, exc.param, headers)
    if isinstance(exc, web.HTTPException):
        status = exc.status
        if isinstance(exc, web.HTTPRequestEntityTooLarge):
            message = f"request body too large: {exc.text or ''}".rstrip(": ")
        elif isinstance(exc, web.HTTPMethodNotAllowed):
            message = f"method {exc.method} not allowed; use {', '.join(sorted(exc.allowed_methods))}"
        elif isinstance(exc, web.HTTPNotFound):
            message = "no such route"
        else:
            message = exc.reason
        headers = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")}
        return error_response(status, message, HTTP_TYPES.get(status, "server_error" if status >= 500
                                                               else "invalid_request_error"), None, headers)
    return error_response(500, "internal server error", "server_error")
