"""server.rate_limit: fixed windows per API key (per address without keys), a key's own limit, 429 with Retry-After
and RateLimit-* headers, the metric, a share per front end with worker processes, and bounded memory under a churn
of 1,000 client addresses (all on 127.0.0.0/8)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest
import yaml

from rsinfer_cli.config import parse_config
from rsinfer_cli.server.ratelimit import Limit, RateLimiter

import synth
from serverutil import ServeProcess, ServerThread, free_port

BODY = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_fixed_windows_per_client_and_per_key():
    clock = Clock()
    lim = RateLimiter(Limit(3, 10), {1: Limit(1, 5)}, clock=clock)
    got = [lim.check("a") for _ in range(4)]
    assert [v.allowed for v in got] == [True, True, True, False]
    assert [v.remaining for v in got] == [2, 1, 0, 0]
    assert got[3].headers() == {"RateLimit-Limit": "3", "RateLimit-Remaining": "0", "RateLimit-Reset": "10",
                                "Retry-After": "10"}
    assert lim.check("b").allowed                                  # another client: its own count
    assert lim.check("key:1", 1).allowed and not lim.check("key:1", 1).allowed   # its own limit: 1 per 5 s
    clock.now += 10                                                # a new window
    assert lim.check("a").allowed
    assert RateLimiter(None, {0: Limit(1, 5)}, clock=clock).check("addr:x") is None   # no limit applies
    half = RateLimiter(Limit(5, 10), share=2, clock=clock)         # one of two front ends: ceil(5 / 2)
    assert [half.check("a").allowed for _ in range(4)] == [True, True, True, False]


def test_memory_is_bounded_by_the_clients_of_one_window():
    clock = Clock()
    lim = RateLimiter(Limit(5, 1.0), clock=clock)
    sizes = []
    for k in range(100_000):                                       # 100,000 distinct clients, 1,000 a second
        clock.now += 0.001
        lim.check(f"addr:{k}")
        sizes.append(len(lim))
    assert max(sizes) <= 2001 and sizes[-1] <= 2001                # at most two windows' clients, never all


def write_config(tmp: Path, **server) -> Path:
    add = synth.add_graph(tmp / "add" / "model.onnx").parent
    path = tmp / "c.yaml"
    path.write_text(yaml.safe_dump({"server": server, "models": [
        {"name": "add", "kind": "tensor", "path": str(add), "max_batch_size": 8}]}))
    return path


def inside_one_window(window_s: float, clock) -> None:
    """Wait (at most 15 s) until the fixed window of `clock` has 15 s or more left: a burst of requests then counts in
    one window (one that ends between them lets the next window's requests through)."""
    left = window_s - clock() % window_s
    if left < 15:
        time.sleep(left + 0.1)


@pytest.mark.parametrize("workers", [1, 2])
def test_limits_over_http(tmp_path, workers):
    cfg = write_config(tmp_path, rate_limit={"requests": 4, "window_s": 60},
                       api_keys=["key-a", {"key": "key-b", "rate_limit": {"requests": 2, "window_s": 60}}])
    srv = ServeProcess(cfg, free_port(), args=["--workers", str(workers)])
    try:
        srv.wait_ready(120)
        # windows are fixed on the monotonic clock (every process reads the same one): start well inside one, so
        # that no window ends between the requests (that reset let a 5th request through, ~2 % of runs)
        inside_one_window(60, time.monotonic)
        codes: dict[str, list[int]] = {"key-a": [], "key-b": []}
        refusals: list[httpx.Response] = []
        for key in ("key-a", "key-b"):
            for _ in range(8):
                with httpx.Client(base_url=srv.url, timeout=30) as c:   # a new connection: any front end
                    r = c.post("/v2/models/add/infer", json=BODY, headers={"Authorization": f"Bearer {key}"})
                codes[key].append(r.status_code)
                if r.status_code == 429:
                    refusals.append(r)
        # one process holds the whole limit; two front ends hold half each, so the total never exceeds it
        assert codes["key-a"].count(200) == 4 if workers == 1 else 2 <= codes["key-a"].count(200) <= 4
        assert codes["key-b"].count(200) == 2 if workers == 1 else 1 <= codes["key-b"].count(200) <= 2
        assert set(codes["key-a"]) == {200, 429}
        # not necessarily the last one: with two front ends, a late connection can land on the one with budget left
        refused = refusals[0]
        assert refused.json() == {"error": refused.json()["error"]}  # KServe body
        assert "rate limit reached" in refused.json()["error"]
        assert refused.headers["RateLimit-Remaining"] == "0" and 0 < int(refused.headers["Retry-After"]) <= 60
        assert int(refused.headers["RateLimit-Reset"]) == int(refused.headers["Retry-After"])
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            assert c.get("/health").status_code == 200                 # open routes are not limited
            metrics = c.get("/metrics", headers={"Authorization": "Bearer key-b"})
            if metrics.status_code == 200:
                counted = re.findall(r'^rsinfer_rate_limited_total\{route="/v2/models/\{model\}/infer"\} '
                                     r'([0-9.]+)$', metrics.text, re.M)
                assert counted and float(counted[0]) >= 1
            else:
                assert metrics.status_code == 429                      # key-b spent: /metrics is limited too
    finally:
        assert srv.stop() == 0


def test_openai_routes_answer_429_with_their_error_body(tmp_path):
    cfg = parse_config({"server": {"rate_limit": {"requests": 1, "window_s": 60}}, "models": [
        {"name": "e", "kind": "embedding", "path": str(synth.write_model_dir(tmp_path / "e"))}]})
    with ServerThread(cfg) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        inside_one_window(60, time.monotonic)
        assert c.post("/v1/embeddings", json={"input": "a"}).status_code == 200
        r = c.post("/v1/embeddings", json={"input": "a"})
        assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
        assert r.json()["error"]["code"] == 429 and "Retry-After" in r.headers


def test_a_churn_of_1000_addresses_keeps_the_table_small(tmp_path):
    """1,000 clients from 1,000 loopback addresses, one request each over ~2 s, 0.2 s windows: the limiter's table
    holds about the clients of the current window, never all of them."""
    cfg = parse_config({"server": {"rate_limit": {"requests": 1, "window_s": 0.2}}, "models": [
        {"name": "add", "kind": "tensor", "path": str(synth.add_graph(tmp_path / "a" / "model.onnx").parent),
         "max_batch_size": 8}]})
    import ssl

    tls = ssl.create_default_context()     # made once: each client would load the CA bundle (~40 ms) for plain HTTP
    with ServerThread(cfg) as srv:
        limiter = srv.state.limiter
        sizes, t0 = [], time.monotonic()
        for k in range(1000):
            addr = f"127.0.{2 + k // 250}.{1 + k % 250}"
            with httpx.Client(base_url=srv.url, timeout=10, verify=tls,
                              transport=httpx.HTTPTransport(local_address=addr, verify=tls)) as c:
                assert c.post("/v2/models/add/infer", json=BODY).status_code == 200   # each its own client
            sizes.append(len(limiter))
            if time.monotonic() - t0 > 60:
                break
        elapsed = time.monotonic() - t0
    assert len(sizes) == 1000
    per_window = 1000 / (elapsed / 0.2)
    assert max(sizes) <= 3 * per_window + 10 < 1000, (max(sizes), per_window)


def test_with_a_redis_cache_the_limit_holds_across_front_ends(tmp_path, redis_server):
    """Two front ends count in the cache's Redis: exactly the limit is served in total (not a share each), the
    keys name no client; with Redis gone each front end falls back to its own share and keeps serving."""
    cfg = write_config(tmp_path, rate_limit={"requests": 5, "window_s": 60},
                       cache={"backend": "redis", "url": redis_server.url})
    srv = ServeProcess(cfg, free_port(), args=["--workers", "2"])
    try:
        srv.wait_ready(120)
        inside_one_window(60, time.time)      # the shared windows are the wall clock's (a 6th request got through once)
        codes = []
        for _ in range(12):
            with httpx.Client(base_url=srv.url, timeout=30) as c:      # a new connection: either front end
                codes.append(c.post("/v2/models/add/infer", json=BODY).status_code)
        assert codes.count(200) == 5 and codes.count(429) == 7, codes
        keys = list(redis_server.client().scan_iter(match=b"rsinfer:ratelimit:*"))
        assert len(keys) == 1 and b"127.0.0.1" not in keys[0]          # one client, hashed
        assert 0 < redis_server.client().ttl(keys[0]) <= 61
        redis_server.kill()                                            # Redis gone: the shares of each front end
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            after = [c.post("/v2/models/add/infer", json=BODY).status_code for _ in range(6)]
        assert after.count(200) >= 1 and set(after) <= {200, 429}, after
    finally:
        assert srv.stop() == 0
