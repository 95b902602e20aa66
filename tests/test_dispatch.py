"""The server's dispatch (server/dispatch.py): a path answered once skips aiohttp's router from then on, with the same
route, values, middleware and answer; paths that fail are never remembered; anything unusual is the application's."""

from __future__ import annotations

import re

import httpx
import pytest

from rsinfer_cli.config import parse_config
from rsinfer_cli.server import dispatch as dispatch_mod

import synth
from serverutil import ServerThread


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    root = tmp_path_factory.mktemp("dispatch")
    one = synth.add_graph(root / "one" / "model.onnx", 1.0).parent
    two = synth.add_graph(root / "two" / "model.onnx", 2.0).parent
    cfg = parse_config({"server": {"api_keys": ["k1"]}, "models": [
        {"name": "add", "kind": "tensor", "path": str(one), "max_batch_size": 4, "replicas": 1},
        {"name": "multi", "kind": "tensor", "max_batch_size": 4, "replicas": 1, "default_version": "1",
         "versions": [{"version": "1", "path": str(one)}, {"version": "2", "path": str(two)}]}]})
    with ServerThread(cfg) as s:
        yield s


AUTH = {"Authorization": "Bearer k1"}


def infer(url: str, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
    body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}]}
    return httpx.post(url + path, json=body, headers={**AUTH, **(headers or {})}, timeout=30)


class Counting:
    """The application's own handler, counted."""

    def __init__(self, handle):
        self.handle, self.calls = handle, 0

    async def __call__(self, request):
        self.calls += 1
        return await self.handle(request)


def requests_counted(url: str, route: str, status: int) -> float:
    text = httpx.get(url + "/metrics", headers=AUTH, timeout=30).text
    pattern = rf'^rsinfer_http_requests_total{{route="{re.escape(route)}",status="{status}"}} (\S+)$'
    found = re.search(pattern, text, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_path_answered_once_skips_the_router_with_the_same_answer(srv):
    d = srv.dispatch
    counting = d.handle = Counting(d.handle)
    route = "/v2/models/{model}/infer"
    before = requests_counted(srv.url, route, 200)
    first = infer(srv.url, "/v2/models/add/infer")
    assert first.status_code == 200 and ("POST", "/v2/models/add/infer") in d.known
    calls = counting.calls
    again = [infer(srv.url, "/v2/models/add/infer", {"x-request-id": f"id-{i}"}) for i in range(3)]
    assert counting.calls == calls                                   # never the application's handling again
    for r in again:
        assert r.status_code == 200 and r.json() == first.json()     # outputs [[2, 3]], model name, version
        assert r.headers["x-compute-time"] and r.headers["content-type"] == first.headers["content-type"]
    assert [r.headers["x-request-id"] for r in again] == ["id-0", "id-1", "id-2"]   # the middleware ran
    assert requests_counted(srv.url, route, 200) - before == 4       # the route's template, as aiohttp named it
    # the middleware still says no: auth is checked on the remembered path too
    r = httpx.post(srv.url + "/v2/models/add/infer", json={"inputs": []}, timeout=30)
    assert r.status_code == 401 and counting.calls == calls


def test_a_versioned_path_keeps_its_values(srv):
    for version, want in (("1", [2.0, 3.0]), ("2", [3.0, 4.0])):
        for _ in range(2):   # learned, then remembered
            r = infer(srv.url, f"/v2/models/multi/versions/{version}/infer")
            assert r.status_code == 200, r.text
            assert r.json()["model_version"] == version and r.json()["outputs"][0]["data"] == want
    assert ("POST", "/v2/models/multi/versions/2/infer") in srv.dispatch.known


def test_paths_that_fail_are_never_remembered(srv):
    d = srv.dispatch
    for _ in range(3):
        r = infer(srv.url, "/v2/models/nobody/infer")
        assert r.status_code == 404 and "nobody" in r.json()["error"]          # KServe's error body
        assert httpx.get(srv.url + "/no/such/route", headers=AUTH, timeout=30).status_code == 404
        assert infer(srv.url, "/v2/models/multi/versions/9/infer").status_code == 404
    assert not any("nobody" in path or "/9/" in path or path == "/no/such/route" for _, path in d.known)


def test_an_expect_header_is_the_applications_own(srv):
    d = srv.dispatch
    infer(srv.url, "/v2/models/add/infer")
    counting = d.handle = Counting(d.handle)
    r = infer(srv.url, "/v2/models/add/infer", {"Expect": "100-continue"})
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2.0, 3.0]
    assert counting.calls == 1


def test_at_most_limit_paths_are_remembered(srv, monkeypatch):
    d = srv.dispatch
    monkeypatch.setattr(dispatch_mod, "LIMIT", len(d.known))
    r = httpx.get(srv.url + "/v2/models/add/ready", headers=AUTH, timeout=30)
    assert r.status_code == 200 and ("GET", "/v2/models/add/ready") not in d.known


def test_this_aiohttp_has_the_internals_the_dispatch_uses():
    """Fails on an aiohttp that changed them: look at dispatch.py before moving pyproject's upper bound."""
    import aiohttp

    assert dispatch_mod.unsupported() is None, f"aiohttp {aiohttp.__version__}: {dispatch_mod.unsupported()}"


def test_without_them_the_application_serves_everything(tmp_path, monkeypatch, caplog):
    """An aiohttp that changed them: no dispatch, a warning saying why, and every request answered by aiohttp."""
    from aiohttp import web

    monkeypatch.setattr(web.Request, "ATTRS", web.Request.ATTRS - {"_match_info"})
    assert "web.Request declares _match_info" in (dispatch_mod.unsupported() or "")
    model = synth.add_graph(tmp_path / "add" / "model.onnx", 1.0).parent
    cfg = parse_config({"models": [{"name": "add", "kind": "tensor", "path": str(model), "max_batch_size": 4,
                                    "replicas": 1}]})
    with caplog.at_level("WARNING", logger="rsinfer.server"), ServerThread(cfg) as s:
        assert s.dispatch is None
        body = {"inputs": [{"name": "X", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
        for _ in range(3):
            r = httpx.post(s.url + "/v2/models/add/infer", json=body)
            assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2, 3]
    assert "changed what the request dispatch relies on (web.Request declares _match_info)" in caplog.text
