"""How a request reaches its route: aiohttp's router, asked once per (method, path) and remembered.

aiohttp's `Application` handles every request by resolving it through its router (a walk over the path's prefixes,
a regular expression and a coroutine per candidate route), building its match info and running the middleware chain
with a layer of aiohttp's own (the current application). Under the 64-client load of benchmarks/http_floor.py that
costs ~13-17 µs of CPU a request: the same handler answers for 42 µs under aiohttp's low-level `web.Server` and for 59
under an `Application` (97 against 110 with the KServe parse and `session.run`).

The daemon's routes and its one middleware never change once it serves, so the router's answer for a method and a
path is the same every time. `Dispatch` (the server's request handler in place of the application's) asks the
application the first time, remembers the route and the path's values when the answer was a success (so paths a
client makes up - unknown models, 404s - are never kept; and at most `LIMIT` paths are), and from then on gives such a
request the same match info and calls the middleware and the route's handler directly. Anything else - a path not
remembered, an `Expect: 100-continue` request, an application with sub-applications or another middleware - is the
application's own handling, unchanged.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import hdrs, web

log = logging.getLogger("rsinfer.server")

LIMIT = 1024          # paths remembered (models × routes × versions; a client cannot add one that fails)
Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


class Dispatch:
    def __init__(self, app: web.Application, handle: Handler) -> None:
        """`handle`: the application's own request handler (what the server called before)."""
        self.app = app
        self.handle = handle
        self.known: dict[tuple[str, str], tuple[web.ResourceRoute, dict[str, str]]] = {}
        # the one middleware called directly; with any other, every request is the application's
        self.middleware: Any = app.middlewares[0] if len(app.middlewares) == 1 else None

    async def __call__(self, request: web.BaseRequest) -> web.StreamResponse:
        assert isinstance(request, web.Request)     # the application's request factory made it
        known = self.known.get((request.method, request.rel_url.path_safe))
        if known is None or hdrs.EXPECT in request.headers:
            return await self._learn(request)
        route, values = known
        info = web.UrlMappingMatchInfo(values, route)     # its own copy of the values
        info.add_app(self.app)
        info.freeze()
        request._match_info = info     # what Application._handle sets (web.Request declares it among its ATTRS)
        response: web.StreamResponse = await self.middleware(request, route.handler)
        return response

    async def _learn(self, request: web.Request) -> web.StreamResponse:
        response = await self.handle(request)
        if self.middleware is not None and response.status < 400 and len(self.known) < LIMIT:
            info = request.match_info
            route = info.route
            if (isinstance(route, web.ResourceRoute) and info.http_exception is None and info.apps == (self.app,)
                    and isinstance(route.resource, (web.PlainResource, web.DynamicResource))):
                self.known[(request.method, request.rel_url.path_safe)] = (route, dict(info))
        return response


def unsupported() -> str | None:
    """Why this aiohttp lacks what the dispatch reads or sets of its internals (None: it has all of it). Checked
    before installing; tests/test_dispatch.py fails on an aiohttp that changed them, before pyproject's bound moves."""
    import yarl
    from aiohttp import web_server

    checks = (
        ("web.Request declares _match_info", "_match_info" in getattr(web.Request, "ATTRS", ())),
        ("UrlMappingMatchInfo(match_dict, route)",
         list(inspect.signature(web.UrlMappingMatchInfo.__init__).parameters)[1:3] == ["match_dict", "route"]),
        ("UrlMappingMatchInfo.add_app / freeze / apps",
         all(hasattr(web.UrlMappingMatchInfo, a) for a in ("add_app", "freeze", "apps", "http_exception"))),
        ("Server.request_handler", "request_handler" in inspect.getsource(web_server.Server.__init__)),
        ("Application._handle sets request._match_info",
         "request._match_info = " in inspect.getsource(web.Application._handle)),
        ("yarl.URL.path_safe", hasattr(yarl.URL, "path_safe")),
    )
    missing = [what for what, ok in checks if not ok]
    return "; ".join(missing) if missing else None


def install(runner: web.AppRunner) -> Dispatch | None:
    """The dispatch as the request handler of a runner's server (after `setup()`, before its sites start); None,
    with a warning, on an aiohttp whose internals it reads changed: every request then takes aiohttp's own way."""
    server = runner.server
    assert server is not None, "install() after runner.setup()"
    why = unsupported()
    if why is not None:
        import aiohttp

        log.warning("aiohttp %s changed what the request dispatch relies on (%s): every request goes through "
                    "aiohttp's router (~15 µs more a request)", aiohttp.__version__, why)
        return None
    dispatch = Dispatch(runner.app, server.request_handler)
    server.request_handler = dispatch
    return dispatch
