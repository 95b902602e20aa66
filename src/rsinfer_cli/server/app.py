"""create_app(runtime) → web.Application: a pure factory that binds no socket."""

from __future__ import annotations

import asyncio
import hmac
import logging
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from aiohttp import web, web_response
from aiohttp.typedefs import Middleware
from multidict import istr

from .. import families
from ..config import Config
from ..engine.cache import RedisCache
from ..errors import ConfigError
from ..runtime import Runtime
from ..runtime.control import Control, ModelControl
from ..runtime.record import RequestRecord
from .errors import RateLimited, RequestTimeout, Unauthorized, response_for, status_for
from .logs import ACCESS, REQUEST_ID, request_id
from .logs import access as log_access
from .metrics import Metrics, QueueCollector
from .ratelimit import Limit, RateLimiter
from .routes import hf, ops
from .routes.common import RECORD, STATE
from .schemas import all_ops
from .state import ServerState

log = logging.getLogger("rsinfer.server")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OPEN_ROUTES = frozenset({"/health", "/v2/health/live", "/v2/health/ready", "/openapi.json", "/docs",
                         "/docs/assets"})
# the status a request whose client disconnected before its answer is logged and counted with (nginx's "client closed
# request"): work nobody waits for is no server error
CLIENT_CLOSED = 499
STATIC = Path(__file__).parent / "static" / "swagger-ui"   # Swagger UI 5 (Apache-2.0), served by /docs, no CDN


# Cohere's /v2/embed and /v2/rerank share the /v2 prefix; every other /v2 path is KServe's (Triton's extensions
# included), so even an unknown one answers with KServe's {"error": ...}, the only body tritonclient can read
COHERE_V2 = ("/v2/embed", "/v2/rerank")


def kserve_path(path: str) -> bool:
    return (path == "/v2" or path.startswith("/v2/")) and not path.startswith(COHERE_V2)


def kserve_not_found(path: str) -> str:
    """Why an unknown KServe path is not served, for tritonclient's exception."""
    if "sharedmemory" in path:
        return ("rsinfer does not implement Triton's system or CUDA shared-memory extension: send the tensors in "
                "the request (JSON, or the binary tensor data extension)")
    return f"no such KServe v2 route: {path}"


def route_label(request: web.Request) -> str:
    """The matched route template; `unmatched` for anything else (bounded label cardinality)."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


def front(config: Config, metrics: Metrics, limiter: RateLimiter | None = None, tracing: Any = None) -> Middleware:
    """The one middleware (each layer of aiohttp middleware costs a request ~10 µs of CPU, measured): metrics and
    one access-log line per request (never the body) whatever the outcome; auth (constant-time), the body cap
    before the body is read and the whole-request timeout; and the one place errors become HTTP responses (ours,
    aiohttp's 404/405/413, and the unexpected)."""
    keys = [k.encode() for k in config.server.api_keys]
    max_body = int(config.server.max_body_mb * 2**20)
    timeout_s = config.server.request_timeout_ms / 1000
    deadlines = Deadlines(timeout_s)
    access = config.server.access_log
    # the routes whose errors take KServe's body: the route table says so, for the document and the server alike
    kserve_routes = frozenset(path for op in all_ops() if op.errors == "kserve" for path in op.paths)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        t0 = time.perf_counter()
        status = 500
        metrics.enter()
        length = request.content_length
        limit_headers: dict[str, str] | None = None
        route = route_label(request)       # the matched template: once per request
        rid = request_id(request.headers.get("x-request-id"))
        REQUEST_ID.set(rid)
        stats = request[RECORD] = RequestRecord()      # the request's record, handed to the core
        stats.body_bytes = length
        try:
            try:
                key_index = _key_index(request, keys) if keys and route not in OPEN_ROUTES else None
                if limiter is not None and route not in OPEN_ROUTES:
                    limit_headers, refused = await _limited(request, route, limiter, key_index, metrics)
                    if refused is not None:
                        raise refused
                if length is not None and length > max_body:
                    raise web.HTTPRequestEntityTooLarge(max_size=max_body, actual_size=length)
                try:
                    if sys.version_info >= (3, 11):  # a deadline on this task: a dict entry, no task or timer
                        response = await deadlines.within(handler(request))
                    else:
                        response = await asyncio.wait_for(handler(request), timeout_s)
                except (asyncio.TimeoutError, TimeoutError):
                    raise RequestTimeout(f"request took longer than server.request_timeout_ms "
                                         f"({config.server.request_timeout_ms} ms)") from None
            except asyncio.CancelledError:   # the client went away: logged and counted as nginx's 499, not a 500
                status = CLIENT_CLOSED
                raise
            except Exception as exc:  # noqa: BLE001 - this is the mapping point
                response = _failure(request, route, exc, kserve_routes)
            status = response.status
            # every answer passes here before aiohttp prepares it (files included): its id and limits, set here
            # rather than by an on_response_prepare signal (a coroutine per response)
            headers = response.headers
            if limit_headers is not None:
                headers.update(limit_headers)
            if stats.cache is not None:
                headers[X_CACHE] = stats.cache
            if stats.model is not None and not response.prepared:
                timing_headers(headers, stats, time.perf_counter() - t0)
            headers[X_REQUEST_ID] = rid
            return response
        finally:
            metrics.leave()
            elapsed = time.perf_counter() - t0
            metrics.http(route, status, elapsed)
            if tracing is not None:
                tracing.request(request.headers, f"{request.method} {route}", t0, t0 + elapsed, {
                    "http.request.method": request.method, "http.route": route, "http.response.status_code": status,
                    "rsinfer.request_id": rid, "rsinfer.model": stats.model, "rsinfer.rows": stats.rows},
                    stats)
            if access and ACCESS.isEnabledFor(logging.INFO):
                _access_line(request, route, status, elapsed, stats)

    return middleware


class Deadlines:
    """Every request's deadline, enforced by one sweep instead of a timer per request: a request is an entry in a
    dict (its task → when it is due), and while any is in flight a callback every `tick` seconds cancels the tasks
    past due. asyncio.timeout's contract: the cancel a deadline makes is taken back with uncancel() and becomes
    TimeoutError, any other cancel goes through. A deadline fires at most `tick` late (a tenth of the timeout, at
    most 100 ms). A per-request timer cost ~6 µs of CPU a request under load (py-spy, 64 clients)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.tick = min(seconds / 10, 0.1)
        self.due: dict[asyncio.Task[Any], float] = {}
        self.fired: set[asyncio.Task[Any]] = set()
        self._sweeping = False

    async def within(self, work: Awaitable[web.StreamResponse]) -> web.StreamResponse:
        task = asyncio.current_task()
        assert task is not None
        loop = task.get_loop()   # not get_running_loop(): on Python 3.11 each of those is a getpid() system call
        self.due[task] = loop.time() + self.seconds
        if not self._sweeping:
            self._sweeping = True
            loop.call_later(self.tick, self._sweep, loop)
        try:
            return await work
        except asyncio.CancelledError:
            if task in self.fired:
                self.fired.discard(task)
                if task.uncancel() == 0:  # type: ignore[attr-defined,unused-ignore]  # 3.11+
                    raise TimeoutError from None
            raise
        finally:
            self.due.pop(task, None)
            self.fired.discard(task)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        for task, when in list(self.due.items()):
            if when <= now and task not in self.fired:
                self.fired.add(task)
                task.cancel()
        if self.due:
            loop.call_later(self.tick, self._sweep, loop)
        else:
            self._sweeping = False


def _key_index(request: web.Request, keys: list[bytes]) -> int:
    """The index of the API key the request sends (every key compared, in constant time); Unauthorized without."""
    header = request.headers.get("Authorization", "")
    given = header[7:].strip().encode() if header[:7].lower() == "bearer " else b""
    matches = [hmac.compare_digest(given, k) for k in keys]   # every key compared
    if not any(matches):
        raise Unauthorized("missing or invalid API key; send `Authorization: Bearer <key>`")
    return matches.index(True)


async def _limited(request: web.Request, route: str, limiter: RateLimiter, key_index: int | None,
                   metrics: Metrics) -> tuple[dict[str, str] | None, RateLimited | None]:
    """The request counted against its client's limit (its key's, else its address's): the limit headers to send
    (the refusal's too), and the refusal past it."""
    client = f"key:{key_index}" if key_index is not None else f"addr:{request.remote}"
    cache = request.app[STATE].cache
    if isinstance(cache, RedisCache):     # one count for every process
        verdict = await limiter.acheck(client, key_index, cache.acount)
    else:
        verdict = limiter.check(client, key_index)
    if verdict is None:
        return None, None
    headers = verdict.headers()
    if not verdict.allowed:
        metrics.rate_limited.labels(route).inc()
        return headers, RateLimited(f"rate limit reached: {verdict.limit} requests per {verdict.window_s:g} s; "
                                    f"retry in {headers['Retry-After']} s")
    return headers, None


def _failure(request: web.Request, route: str, exc: Exception, kserve_routes: frozenset[str]) -> web.Response:
    """An error as its HTTP response: KServe's error body on KServe's routes (and unmatched /v2 paths), the
    unexpected logged with its traceback."""
    kserve = route in kserve_routes
    if route == "unmatched" and kserve_path(request.path):
        kserve = True
        if isinstance(exc, web.HTTPNotFound):
            exc = web.HTTPNotFound(reason=kserve_not_found(request.path))
    response = response_for(exc, kserve=kserve)
    if response.status >= 500:
        log.error("%s %s failed: %s", request.method, route, exc,
                  exc_info=not isinstance(exc, (web.HTTPException,)) and status_for(exc)[0] == 500)
    return response


def _access_line(request: web.Request, route: str, status: int, elapsed: float, stats: RequestRecord) -> None:
    """The request's access line (a function of its own: a closure inside the middleware would turn its locals into
    cells, slower on every access)."""
    method = request.method

    def fields() -> dict[str, Any]:     # made only for a format that prints them (JSON)
        return {"method": method, "route": route, "status": status, "duration_ms": round(elapsed * 1000, 3),
                "client": request.remote, **stats.log_fields()}

    log_access(f"{method} {route} {status} {elapsed * 1000:.1f}ms", fields)


# the headers every answer may carry, as multidict's case-insensitive strings made once: an item set with an istr
# name does not fold its case again (5 headers: 0.21 µs set one by one, 0.63 µs through update() with a dict of str;
# timeit, multidict 7.2)
X_REQUEST_ID, X_CACHE = istr("x-request-id"), istr("x-rsinfer-cache")
X_COMPUTE, X_TOKENIZE, X_QUEUE, X_INFERENCE = (istr("x-compute-time"), istr("x-tokenization-time"),
                                               istr("x-queue-time"), istr("x-inference-time"))


def timing_headers(headers: MutableMapping[str, str], stats: RequestRecord, total_s: float) -> None:
    """TEI's timing headers (milliseconds) from the request's one record, set in `headers`: the same numbers as its
    log line, its spans and the metrics. Queue and inference times are the engine's, absent in a front-end process."""
    headers[X_COMPUTE] = f"{total_s * 1000:.3f}"
    tok = stats.t_tokenize
    if tok:
        headers[X_TOKENIZE] = f"{(tok[1] - tok[0]) * 1000:.3f}"
    if stats.queue_ms is not None:
        headers[X_QUEUE] = f"{stats.queue_ms:.3f}"
    if stats.inference_ms is not None:
        headers[X_INFERENCE] = f"{stats.inference_ms:.3f}"


def rate_limiter(config: Config) -> RateLimiter | None:
    """`server.rate_limit` and the keys' own limits; each of N front-end processes holds 1/N of each."""
    s = config.server
    if s.rate_limit is None and not s.key_limits:
        return None
    default = Limit(s.rate_limit.requests, s.rate_limit.window_s) if s.rate_limit is not None else None
    return RateLimiter(default, {i: Limit(lim.requests, lim.window_s) for i, lim in s.key_limits},
                       share=max(1, s.workers))


def check_served(config: Config) -> None:
    """Refuse, before any model is loaded, a config with a kind the daemon has no routes for."""
    served = families.served_kinds()
    unserved = [(i, m) for i, m in enumerate(config.models) if m.kind not in served]
    if unserved:
        names = ", ".join(f"models[{i}] '{m.name}' ({m.kind})" for i, m in unserved)
        raise ConfigError(f"{config.file}: `rsinfer serve` has routes for kinds {', '.join(served)}; "
                          f"remove or comment out {names}")


def create_app(runtime: Runtime, control: Callable[[ServerState], Control] | None = None) -> web.Application:
    """The HTTP front door over `runtime` (started here if it was not), which must report to the server's
    `Metrics`. `control(state)`: who changes the served set (a front-end process: its engines); by default the
    runtime's own ModelControl. Its cleanup drains the other front doors, then closes the runtime."""
    config = runtime.config
    metrics = runtime.metrics
    if not isinstance(metrics, Metrics):
        raise TypeError("create_app needs a Runtime built with the server's Metrics")
    check_served(config)
    # no version banner on any answer: aiohttp stamps `Server: Python/3.x aiohttp/3.y` on every response that has
    # no Server header, its own 400s for unparseable requests too (those never reach an app's middleware or
    # signals), and reads this module global when it does (tests/test_server.py sends one such request)
    web_response.SERVER_SOFTWARE = "rsinfer"  # type: ignore[attr-defined]  # imported there, not exported
    limiter = rate_limiter(config)
    tracing = None
    if config.server.tracing is not None:
        from .tracing import Tracing

        tracing = Tracing(config)
    app = web.Application(client_max_size=int(config.server.max_body_mb * 2**20),
                          middlewares=[front(config, metrics, limiter, tracing)])
    state = ServerState(runtime=runtime.start(), metrics=metrics, limiter=limiter, tracing=tracing)
    state.control = control(state) if control is not None else \
        ModelControl(runtime, check=check_served, changed=state.refresh, metrics=metrics)
    metrics.add_live(QueueCollector(state.queue_stats))
    app[STATE] = state
    app.add_routes(ops.routes)
    for family in families.all_families():
        table = family.route_table()
        if table is not None:
            app.add_routes(table)
    app.add_routes(hf.routes)  # the Hugging Face Inference API shapes, by the named model's kind
    app.router.add_static("/docs/assets", STATIC, name="docs-assets")

    async def lifetime(app: web.Application) -> AsyncIterator[None]:
        yield
        await runtime.drain()      # the gRPC front's calls in flight finish first
        await runtime.close()
        if tracing is not None:
            tracing.close()        # the batched spans are sent

    app.cleanup_ctx.append(lifetime)
    return app
