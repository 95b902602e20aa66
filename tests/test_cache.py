"""The row cache, in memory and in a real redis-server: miss → hit → partial, cached answers byte-identical to
computed ones for every family, restarts, Redis going away and coming back, privacy of keys and values, TTL."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from rsinfer_cli.config import parse_config
from rsinfer_cli.engine.cache import MemoryCache, decode_value, encode_value
from rsinfer_cli.engine.registry import Registry

from serverutil import ServerThread

SERVE_MODES = ("single", "workers")  # every test here also runs against the front-end/engine split

pytestmark = pytest.mark.shared
PLANTED = ["john.smith@example.com", "Alex Rivera", "4111 1111 1111 1111"]
PII_TEXT = f"Write to {PLANTED[0]}, ask for {PLANTED[1]}, card {PLANTED[2]} please"


def models(shared_models) -> list[dict]:
    tm = shared_models / "tensor-models"
    return [
        {"name": "mini", "kind": "embedding", "path": str(shared_models / "all-minilm-l6-v2"), "replicas": 1},
        {"name": "rr", "kind": "rerank", "path": str(shared_models / "tiny-reranker-1"), "replicas": 1},
        {"name": "pii", "kind": "pii", "path": str(shared_models / "rampart-pii"), "replicas": 1},
        {"name": "nli", "kind": "zeroshot", "path": str(shared_models / "tiny-nli"), "replicas": 1},
        {"name": "t", "kind": "tensor", "path": str(tm / "add_sub"), "replicas": 1, "max_batch_size": 8},
        {"name": "nocache", "kind": "embedding", "path": str(shared_models / "all-minilm-l6-v2"), "replicas": 1,
         "cache": False},
    ]


@pytest.fixture(scope="module")
def registry(shared_models) -> Registry:
    return Registry.load(parse_config({"models": models(shared_models)}))


def config(shared_models, **cache):
    return parse_config({"server": {"cache": cache}, "models": models(shared_models)})


REQUESTS = [  # (route, body, the part of the answer that must be identical)
    ("/v1/embeddings", {"model": "mini", "input": ["the cat sat", "on the mat"], "encoding_format": "float"},
     lambda b: b["data"]),
    ("/v1/rerank", {"model": "rr", "query": "where is my parcel", "documents": ["it shipped", "a cat", "refund"]},
     lambda b: b["results"]),
    ("/pii/detect", {"model": "pii", "text": PII_TEXT}, lambda b: b["results"]),
    ("/classify/zero-shot", {"model": "nli", "input": "my parcel is late", "candidate_labels": ["shipping", "food"]},
     lambda b: [b["labels"], b["scores"]]),
    ("/v2/models/t/infer", {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 16], "data": [0.5] * 32},
                                       {"name": "INPUT1", "datatype": "FP32", "shape": [2, 16],
                                        "data": list(range(32))}]}, lambda b: b["outputs"]),
]


def post(c: httpx.Client, route: str, body: dict) -> httpx.Response:
    r = c.post(route, json=body)
    assert r.status_code == 200, r.text
    return r


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_miss_hit_partial_and_identical_answers(shared_models, registry, request, backend, serve_mode):
    cache = {"backend": backend}
    if backend == "redis":
        cache["url"] = request.getfixturevalue("redis_server").url
    with ServerThread(config(shared_models, **cache), registry,
                      mode=serve_mode) as srv, httpx.Client(base_url=srv.url) as c:
        for route, body, part in REQUESTS:
            first, second = post(c, route, body), post(c, route, body)
            assert (first.headers["x-rsinfer-cache"], second.headers["x-rsinfer-cache"]) == ("miss", "hit"), route
            assert json.dumps(part(first.json())) == json.dumps(part(second.json())), route  # byte for byte
        body = {"model": "mini", "input": ["the cat sat", "something new"], "encoding_format": "float"}
        r = post(c, "/v1/embeddings", body)
        assert r.headers["x-rsinfer-cache"] == "partial"
        alone = post(c, "/v1/embeddings", {"model": "nocache", "input": ["the cat sat", "something new"],
                                           "encoding_format": "float"})
        assert "x-rsinfer-cache" not in alone.headers  # cache: false
        assert np.abs(np.array([d["embedding"] for d in r.json()["data"]])
                      - np.array([d["embedding"] for d in alone.json()["data"]])).max() == 0.0
        # an option applied after the cache: the same rows answer other `dimensions`
        dims = post(c, "/v1/embeddings", {"model": "mini", "input": ["the cat sat"], "dimensions": 8})
        assert dims.headers["x-rsinfer-cache"] == "hit" and len(dims.json()["data"][0]["embedding"]) == 8
        metrics = c.get("/metrics").text
        assert 'rsinfer_cache_hits_total{model="mini"}' in metrics
        assert 'rsinfer_cache_misses_total{model="pii"} ' in metrics
        assert c.get("/health").json() == {"status": "ok", "cache": "ok", "models_loaded": len(registry.models),
                                           "redis_connected": True if backend == "redis" else None}


def test_redis_survives_restarts_outages_and_keeps_no_text(shared_models, registry, redis_server, serve_mode):
    cfg = config(shared_models, backend="redis", url=redis_server.url, ttl_s=600)
    texts = {"model": "mini", "input": ["a question about shipping"]}
    pii = {"model": "pii", "text": PII_TEXT}
    with ServerThread(cfg, registry, mode=serve_mode) as srv, httpx.Client(base_url=srv.url) as c:
        assert post(c, "/v1/embeddings", texts).headers["x-rsinfer-cache"] == "miss"
        assert post(c, "/pii/redact", pii).headers["x-rsinfer-cache"] == "miss"
    with ServerThread(cfg, registry, mode=serve_mode) as srv, httpx.Client(base_url=srv.url) as c:  # rsinfer restarted
        assert post(c, "/v1/embeddings", texts).headers["x-rsinfer-cache"] == "hit"
        # privacy: no key or value holds a request's text or a value redaction removed
        client = redis_server.client()
        keys = list(client.scan_iter(count=1000))
        assert keys
        for key in keys:
            value = client.get(key)
            for planted in [*PLANTED, "shipping", "question"]:
                assert planted.encode() not in key and planted.encode() not in value
            assert 0 < client.ttl(key) <= 600
        redis_server.kill()  # Redis goes away mid-run
        t0 = time.monotonic()
        r = post(c, "/v1/embeddings", texts)
        assert r.headers["x-rsinfer-cache"] == "miss" and time.monotonic() - t0 < 5
        assert c.get("/health").json() == {"status": "ok", "cache": "unavailable",
                                           "models_loaded": len(registry.models), "redis_connected": False}
        assert post(c, "/pii/detect", pii).status_code == 200
        assert 'rsinfer_cache_errors_total{backend="redis"}' in c.get("/metrics").text
        redis_server.start()  # back (empty: no persistence)
        deadline = time.monotonic() + 10
        status = None
        while time.monotonic() < deadline and status != "hit":  # the client reconnects by itself
            status = post(c, "/v1/embeddings", texts).headers["x-rsinfer-cache"]
            time.sleep(0.2)
        assert status == "hit"
        assert c.get("/health").json()["cache"] == "ok"


def test_min_inference_ms_caches_only_slow_rows(shared_models, registry, serve_mode):
    with ServerThread(config(shared_models, backend="memory", min_inference_ms=60_000), registry,
                      mode=serve_mode) as srv, \
            httpx.Client(base_url=srv.url) as c:
        body = {"model": "mini", "input": "quick"}
        assert [post(c, "/v1/embeddings", body).headers["x-rsinfer-cache"] for _ in range(2)] == ["miss", "miss"]


def test_memory_lru_is_bounded_by_bytes():
    cache = MemoryCache(max_bytes=100)
    cache.set_many([(b"k1", b"x" * 40), (b"k2", b"y" * 40)])
    cache.get_many([b"k1"])  # k1 used last
    cache.set_many([(b"k3", b"z" * 40)])
    assert cache.get_many([b"k1", b"k2", b"k3"]) == [b"x" * 40, None, b"z" * 40] and cache.bytes <= 100


def test_values_round_trip_exactly():
    for value in (np.arange(6, dtype=np.float32).reshape(2, 3), np.array([1e-300, -2.5]),
                  {"A": np.array([[2**62 + 1]], dtype=np.int64), "B": np.array([True, False])}):
        back = decode_value(encode_value(value))
        if isinstance(value, dict):
            assert all(np.array_equal(back[k], v) and back[k].dtype == v.dtype for k, v in value.items())
        else:
            assert np.array_equal(back, value) and back.dtype == value.dtype
    assert encode_value(np.array(["text"], dtype=object)) is None  # text is never cached


def test_cli_embed_uses_server_cache(shared_models, redis_server, tmp_path):
    cfg = tmp_path / "cli.yaml"
    cfg.write_text(f"server: {{cache: {{backend: redis, url: '{redis_server.url}'}}}}\nmodels:\n"
                   f"  - {{name: mini, kind: embedding, path: '{shared_models / 'all-minilm-l6-v2'}', replicas: 1}}\n")
    lines = tmp_path / "in.txt"
    lines.write_text("alpha\nbeta\nalpha\ngamma\n")

    def run() -> list:
        proc = subprocess.run([sys.executable, "-m", "rsinfer_cli", "embed", "--config", str(cfg), "--input",
                               str(lines)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return [json.loads(x)["embedding"] for x in proc.stdout.splitlines()]

    first = run()
    stored = len(list(redis_server.client().scan_iter()))
    assert stored == 3  # alpha, beta, gamma: a repeat is one entry
    assert run() == first and first[0] == first[2]
    assert len(list(redis_server.client().scan_iter())) == 3


def test_cache_block_errors_name_the_key_path():
    from rsinfer_cli.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        parse_config({"server": {"cache": {"backend": "redsi", "max_mb": 0, "ttl": 5}},
                      "models": [{"name": "m", "kind": "embedding", "hf": "a/b"}]})
    msg = str(info.value)
    assert "server.cache.backend: must be one of memory, redis, got 'redsi' (did you mean 'redis'?)" in msg
    assert "server.cache.max_mb: must be > 0" in msg and "server.cache.ttl: unknown key (did you mean 'ttl_s'?)" in msg


def test_a_row_repeated_within_a_request_runs_once(shared_models, registry, serve_mode):
    with ServerThread(config(shared_models, backend="memory"), registry,
                      mode=serve_mode) as srv, httpx.Client(base_url=srv.url) as c:
        r = post(c, "/v1/embeddings", {"model": "mini", "input": ["same text", "other", "same text"],
                                       "encoding_format": "float"})
        vectors = [d["embedding"] for d in r.json()["data"]]
        assert vectors[0] == vectors[2] and vectors[0] != vectors[1]
        from serverutil import forwards

        rows = forwards(srv.url, "mini")[1]
        assert rows == 2  # two distinct rows went through the forwards, not three
