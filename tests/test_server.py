"""The daemon over real loopback HTTP: OpenAI/TEI shapes and parity, every error status with its body,
auth, metrics, /v1/models; a real `rsinfer serve` subprocess (drain on SIGTERM); the official openai SDK."""

from __future__ import annotations

import base64
import json
import signal
import socket
import sys
import threading
import time

import httpx
import numpy as np
import pytest

from rsinfer_cli.config import parse_config
from rsinfer_cli.engine.registry import Registry

from serverutil import ServeProcess, ServerThread, free_port

SERVE_MODES = ("single", "workers")  # every test here also runs against the front-end/engine split

pytestmark = pytest.mark.shared
FP32_COS = 0.9999


def cosine(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def ref(shared_models) -> dict:
    return json.loads((shared_models / "all-minilm-l6-v2" / "reference.json").read_text())


def make_config(shared_models, batching: bool = True, **server):
    return parse_config({"server": server, "models": [
        {"name": "mini", "kind": "embedding", "path": str(shared_models / "all-minilm-l6-v2"), "replicas": 2,
         "batching": {"enabled": batching}}]})


def running(srv) -> int:
    return sum(s.running for s in srv.schedulers.values())


@pytest.fixture(scope="module")
def registry(shared_models) -> Registry:
    return Registry.load(make_config(shared_models))


@pytest.fixture(scope="module")
def direct_registry(shared_models) -> Registry:
    return Registry.load(make_config(shared_models, batching=False))


@pytest.fixture(scope="module")
def server(shared_models, registry, serve_mode):
    with ServerThread(make_config(shared_models), registry, mode=serve_mode) as srv:
        yield srv


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def assert_error(resp: httpx.Response, status: int, type_: str, param=None, contains: str = "") -> dict:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == status and err["type"] == type_ and err["param"] == param
    assert contains in err["message"]
    return err


class TestOpenAIShape:
    def test_float_parity_and_usage(self, client, ref):
        cases = ref["cases"]
        r = client.post("/v1/embeddings", json={"model": "mini", "input": [c["text"] for c in cases]})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "list" and body["model"] == "mini"
        assert [d["index"] for d in body["data"]] == list(range(len(cases)))
        assert all(d["object"] == "embedding" for d in body["data"])
        worst = min(cosine(d["embedding"], c["embedding"]) for d, c in zip(body["data"], cases, strict=True))
        assert worst >= FP32_COS
        tokens = sum(min(c["num_tokens_untruncated"], 256) for c in cases)
        assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
        assert r.headers["x-rsinfer-truncated"] == "1"

    def test_infinity_path_answers_as_v1(self, client, ref):
        """infinity serves OpenAI's shape at /embeddings (no /v1): litellm's infinity/ provider with a root base URL
        posts there, with infinity's own `modality` field beside OpenAI's."""
        body = {"model": "mini", "input": [c["text"] for c in ref["cases"][:3]], "encoding_format": "float"}
        r = client.post("/embeddings", json={**body, "modality": "text"})
        assert r.status_code == 200, r.text
        assert r.json() == client.post("/v1/embeddings", json=body).json()

    def test_base64_is_little_endian_float32(self, client, ref):
        case = ref["cases"][0]
        r = client.post("/v1/embeddings", json={"input": case["text"], "encoding_format": "base64"})
        vec = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), dtype="<f4")
        assert vec.shape == (384,) and cosine(vec, case["embedding"]) >= FP32_COS
        assert "x-rsinfer-truncated" not in r.headers

    def test_matryoshka_dimensions(self, client, ref):
        m = ref["matryoshka"][0]
        r = client.post("/v1/embeddings", json={"input": [m["text"]], "dimensions": m["dimensions"]})
        vec = r.json()["data"][0]["embedding"]
        assert len(vec) == m["dimensions"] and np.abs(np.array(vec) - m["embedding"]).max() <= 1e-4

    def test_token_id_input(self, client, ref):
        case = ref["cases"][1]
        single = client.post("/v1/embeddings", json={"input": case["input_ids"]}).json()
        assert cosine(single["data"][0]["embedding"], case["embedding"]) >= FP32_COS
        assert single["usage"]["prompt_tokens"] == len(case["input_ids"])
        many = client.post("/v1/embeddings", json={"input": [case["input_ids"], case["input_ids"][:3]]}).json()
        assert len(many["data"]) == 2

    def test_per_request_truncate_off(self, client):
        r = client.post("/v1/embeddings", json={"input": ["short", "word " * 400], "truncate": False})
        assert_error(r, 400, "invalid_request_error", "input[1]", "input[1] has 402 tokens but max_len is 256")

    def test_unknown_fields_ignored(self, client):
        r = client.post("/v1/embeddings", json={"input": "x", "user": "u1", "safety_identifier": "s"})
        assert r.status_code == 200


class TestTeiShape:
    def test_embed_returns_bare_vectors(self, client, ref):
        cases = ref["cases"][:3]
        r = client.post("/embed", json={"inputs": [c["text"] for c in cases]})
        vecs = r.json()
        assert isinstance(vecs, list) and len(vecs) == 3
        assert min(cosine(v, c["embedding"]) for v, c in zip(vecs, cases, strict=True)) >= FP32_COS

    def test_string_input_normalize_false_and_dimensions(self, client, ref):
        case = ref["cases"][0]
        raw = client.post("/embed", json={"inputs": case["text"], "normalize": False}).json()[0]
        assert np.abs(np.array(raw) - case["embedding_unnormalized"]).max() <= 1e-4
        short = client.post("/embed", json={"inputs": case["text"], "dimensions": 64}).json()[0]
        assert len(short) == 64

    def test_truncate_and_direction(self, client):
        long = "word " * 400
        r = client.post("/embed", json={"inputs": [long], "truncate": False})
        assert_error(r, 400, "invalid_request_error", "inputs[0]", "max_len is 256")
        right = client.post("/embed", json={"inputs": [long + "cat"], "truncate": True}).json()[0]
        left = client.post("/embed", json={"inputs": [long + "cat"], "truncation_direction": "left"}).json()[0]
        assert cosine(right, left) < 0.9999
        bad = client.post("/embed", json={"inputs": ["x"], "truncation_direction": "up"})
        assert_error(bad, 400, "invalid_request_error", "truncation_direction")


class TestErrors:
    def test_malformed_json(self, client):
        r = client.post("/v1/embeddings", content=b'{"input": ', headers={"content-type": "application/json"})
        assert_error(r, 400, "invalid_request_error", None, "malformed JSON")

    def test_wrong_types_are_422(self, client):
        assert_error(client.post("/v1/embeddings", json={"input": 5}), 422, "invalid_request_error", "input")
        assert_error(client.post("/v1/embeddings", json={"input": ["a", 1]}), 422, "invalid_request_error",
                     "input[1]")
        assert_error(client.post("/v1/embeddings", json={"input": "a", "dimensions": "8"}), 422,
                     "invalid_request_error", "dimensions")
        assert_error(client.post("/v1/embeddings", json=["a"]), 422, "invalid_request_error")

    def test_validation_400s(self, client):
        assert_error(client.post("/v1/embeddings", json={"input": []}), 400, "invalid_request_error", "input",
                     "`input` is empty")
        assert_error(client.post("/v1/embeddings", json={}), 422, "invalid_request_error", "input")  # missing
        assert_error(client.post("/v1/embeddings", json={"input": "a", "encoding_format": "flaot"}), 400,
                     "invalid_request_error", "encoding_format")
        for dims in (0, 1000):
            assert_error(client.post("/v1/embeddings", json={"input": "a", "dimensions": dims}), 400,
                         "invalid_request_error", "dimensions")
        assert_error(client.post("/v1/embeddings", json={"input": [[101, -5]]}), 400, "invalid_request_error",
                     "input[0]", "outside the vocabulary")

    def test_unknown_model_404(self, client):
        assert_error(client.post("/v1/embeddings", json={"model": "gpt", "input": "a"}), 404, "model_not_found",
                     "model", "model 'gpt' not found")

    def test_max_texts_is_configurable(self, shared_models, registry, serve_mode):
        with ServerThread(make_config(shared_models, max_texts=2), registry, mode=serve_mode) as srv, \
                httpx.Client(base_url=srv.url) as c:
            assert c.post("/v1/embeddings", json={"input": ["a", "b"]}).status_code == 200
            assert_error(c.post("/v1/embeddings", json={"input": ["a"] * 3}), 413, "invalid_request_error",
                         "input", "at most 2 per request (server.max_texts)")
            assert_error(c.post("/embed", json={"inputs": ["a"] * 3}), 413, "invalid_request_error", "inputs")

    def test_route_and_method(self, client):
        assert_error(client.get("/nothing"), 404, "not_found_error")
        assert client.get("/v2/nothing").json() == {"error": "no such KServe v2 route: /v2/nothing"}  # KServe's
        r = client.get("/v1/embeddings")
        assert_error(r, 405, "invalid_request_error")
        assert "POST" in r.headers["allow"]

    def test_too_many_inputs_413(self, client):
        assert_error(client.post("/v1/embeddings", json={"input": ["a"] * 2049}), 413, "invalid_request_error",
                     "input", "2049 items; at most 2048 per request (server.max_texts)")


class TestLimits:
    def test_body_cap_413_before_parsing(self, shared_models, registry, serve_mode):
        with ServerThread(make_config(shared_models, max_body_mb=0.001), registry, mode=serve_mode) as srv, \
                httpx.Client(base_url=srv.url) as c:
            r = c.post("/v1/embeddings", content=b"x" * 5000)  # not even JSON: refused on its length
            assert_error(r, 413, "invalid_request_error")

    def test_request_timeout_408(self, shared_models, registry, serve_mode):
        with ServerThread(make_config(shared_models, request_timeout_ms=50), registry, mode=serve_mode) as srv, \
                httpx.Client(base_url=srv.url) as c:
            batcher = srv.schedulers["mini"]
            slow = batcher.forward

            def sleepy(*a, **k):
                time.sleep(0.3)
                return slow(*a, **k)

            batcher.forward = sleepy
            try:
                assert_error(c.post("/v1/embeddings", json={"input": "a"}), 408, "timeout_error")
            finally:
                batcher.forward = slow
            deadline = time.monotonic() + 10
            while running(srv) and time.monotonic() < deadline:  # the worker finishes and frees its replica
                time.sleep(0.01)
            assert running(srv) == 0

    @staticmethod
    def _hold_both_replicas(srv, release: threading.Event):
        scheduler = srv.schedulers["mini"]
        slow = scheduler.forward

        def held(*a, **k):
            release.wait(10)
            return slow(*a, **k)

        scheduler.forward = held
        threads = [threading.Thread(target=lambda: httpx.post(srv.url + "/v1/embeddings", json={"input": "a"},
                                                              timeout=30)) for _ in range(2)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while running(srv) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        return threads

    def test_direct_path_saturated_429_and_queue_timeout_503(self, shared_models, direct_registry, serve_mode):
        with ServerThread(make_config(shared_models, batching=False, max_queue=0), direct_registry,
                          mode=serve_mode) as srv:
            release = threading.Event()
            threads = self._hold_both_replicas(srv, release)
            try:
                r = httpx.post(srv.url + "/v1/embeddings", json={"input": "a"}, timeout=30)
                assert_error(r, 429, "rate_limit_error", None, "saturated")
                assert r.headers["retry-after"] == "1"
            finally:
                release.set()
                for t in threads:
                    t.join(30)
        config = make_config(shared_models, batching=False, max_queue=4, queue_timeout_ms=100)
        with ServerThread(config, direct_registry, mode=serve_mode) as srv:
            release = threading.Event()
            threads = self._hold_both_replicas(srv, release)
            try:
                r = httpx.post(srv.url + "/v1/embeddings", json={"input": "a"}, timeout=30)
                assert_error(r, 503, "timeout_error", None, "timed out after 100 ms")
            finally:
                release.set()
                for t in threads:
                    t.join(30)


class TestAuth:
    def test_keys_required_except_health(self, shared_models, registry, serve_mode):
        with ServerThread(make_config(shared_models, api_keys=["k1", "k2"]), registry, mode=serve_mode) as srv, \
                httpx.Client(base_url=srv.url) as c:
            assert c.get("/health").status_code == 200
            assert_error(c.post("/v1/embeddings", json={"input": "a"}), 401, "authentication_error")
            assert_error(c.get("/metrics", headers={"Authorization": "Bearer nope"}), 401, "authentication_error")
            ok = c.post("/v1/embeddings", json={"input": "a"}, headers={"Authorization": "Bearer k2"})
            assert ok.status_code == 200
            assert c.get("/v1/models", headers={"Authorization": "bearer k1"}).status_code == 200

    def test_no_keys_no_auth(self, client):
        assert client.get("/v1/models").status_code == 200


class TestOps:
    def test_health(self, client):
        assert client.get("/health").json() == {"status": "ok", "models_loaded": 1, "redis_connected": None}
        assert client.post("/health").json()["status"] == "ok"

    def test_models_card(self, client):
        body = client.get("/v1/models").json()
        assert body["object"] == "list"
        (card,) = body["data"]
        assert card["id"] == "mini" and card["object"] == "model" and card["kind"] == "embedding"
        assert card["graph_file"] == "onnx/model.onnx" and card["execution_providers"] == ["cpu"]
        assert card["replicas"] == 2 and card["max_len"] == 256 and card["default"] is True
        assert card["threads"]["lanes"] == 2 and card["threads"]["source"] == "config"   # replicas: 2 is set
        assert card["pooling"] == "mean" and card["source"].startswith("path:")
        assert card["provenance"]["file"] == "onnx/model.onnx"

    def test_metrics_count_requests(self, client):
        client.post("/v1/embeddings", json={"input": "count me"})
        client.get("/no-such-route")
        r = client.get("/metrics")
        assert r.headers["content-type"].startswith("text/plain")
        text = r.text
        line = next(x for x in text.splitlines()
                    if x.startswith('rsinfer_http_requests_total{route="/v1/embeddings",status="200"}'))
        assert float(line.split()[-1]) >= 1
        assert 'rsinfer_http_requests_total{route="unmatched",status="404"}' in text
        assert 'rsinfer_http_request_duration_seconds_bucket{le="0.005",route="/v1/embeddings"}' in text
        assert 'rsinfer_queue_depth{model="mini",version=""}' in text
        assert 'rsinfer_inference_seconds_count{model="mini",version=""}' in text
        assert 'rsinfer_batch_rows_bucket{le="1.0",model="mini",version=""}' in text


class TestHistogram:
    """rsinfer's own histograms (metrics.Family, values appended on the request's path and counted into buckets when
    read) against prometheus_client's Histogram, the reference for the exposition."""

    @staticmethod
    def exposition(registry) -> list[str]:
        from prometheus_client.exposition import generate_latest

        return sorted(x for x in generate_latest(registry).decode().splitlines()
                      if x.startswith("h_") and not x.startswith("h_created"))

    def test_buckets_and_sum_as_prometheus_client_counts_them(self):
        from prometheus_client import CollectorRegistry, Histogram

        from rsinfer_cli.server.metrics import STAGE_BUCKETS, Family, _Hist

        ours, theirs = CollectorRegistry(), CollectorRegistry()
        fam = Family("histogram", "h", "doc", ["model"], ours, STAGE_BUCKETS)
        ref = Histogram("h", "doc", ["model"], registry=theirs, buckets=STAGE_BUCKETS)
        rng = np.random.default_rng(7)
        # every bound exactly (a value equal to `le` is in that bucket), below and above them all, and random ones:
        # 3 folds of a full list and a partial one left for the scrape to count
        values = [*STAGE_BUCKETS, 0.0, 1e-9, 100.0, *(10 ** rng.uniform(-5, 2, 3 * _Hist.FOLD + 17)).tolist()]
        for v in values:
            fam.labels("m").observe(v)
            ref.labels("m").observe(v)
        assert len(fam.labels("m").pending) < _Hist.FOLD
        mine, want = self.exposition(ours), self.exposition(theirs)
        assert [x for x in mine if "_sum" not in x] == [x for x in want if "_sum" not in x]
        (s1,), (s2,) = ([float(x.split()[-1]) for x in e if "_sum" in x] for e in (mine, want))
        assert s1 == pytest.approx(s2, rel=1e-12)
        assert f'h_count{{model="m"}} {float(len(values))}' in mine

    def test_no_observation_lost_between_threads(self):
        from rsinfer_cli.server.metrics import ROW_BUCKETS, _Hist

        h = _Hist(ROW_BUCKETS)
        per, n = 20_000, 4
        start = threading.Barrier(n)

        def observe(k: int) -> None:
            start.wait(timeout=30)
            for i in range(per):
                h.observe(float((i + k) % 2048))

        threads = [threading.Thread(target=observe, args=(k,)) for k in range(n)]
        interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)      # threads switch inside observe() and fold(), not once per 5 ms
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
        finally:
            sys.setswitchinterval(interval)
        counts, total = h.snapshot()
        assert sum(counts) == per * n and not h.pending
        assert total == sum(float((i + k) % 2048) for k in range(n) for i in range(per))


class TestOpenAISdk:
    def test_embeddings_create_both_encodings(self, server, ref):
        from openai import OpenAI

        with OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30) as sdk:
            self.check(sdk, ref)

    @staticmethod
    def check(sdk, ref):
        cases = ref["cases"][:4]
        texts = [c["text"] for c in cases]
        default = sdk.embeddings.create(model="mini", input=texts)  # the SDK asks for base64 and decodes it
        floats = sdk.embeddings.create(model="mini", input=texts, encoding_format="float")
        for resp in (default, floats):
            assert [d.index for d in resp.data] == [0, 1, 2, 3]
            assert min(cosine(d.embedding, c["embedding"]) for d, c in zip(resp.data, cases, strict=True)) >= FP32_COS
            assert resp.usage.prompt_tokens > 0
        with pytest.raises(Exception) as info:
            sdk.embeddings.create(model="nope", input="x")
        assert getattr(info.value, "status_code", None) == 404


class TestServeProcess:
    def test_serve_subprocess_drains_on_sigterm(self, shared_models, tmp_path, ref):
        port = free_port()
        cfg = tmp_path / "serve.yaml"
        cfg.write_text(f"server: {{bind: '127.0.0.1:{port}'}}\nmodels:\n"
                       f"  - {{name: mini, kind: embedding, path: '{shared_models / 'all-minilm-l6-v2'}', "
                       "replicas: 1}\n")
        srv = ServeProcess(cfg, port)
        try:
            srv.wait_ready()
            with httpx.Client(base_url=srv.url, timeout=60) as c:
                r = c.post("/v1/embeddings", json={"input": ref["cases"][0]["text"]})
                assert cosine(r.json()["data"][0]["embedding"], ref["cases"][0]["embedding"]) >= FP32_COS
                assert_error(c.post("/v1/embeddings", content=b"{oops"), 400, "invalid_request_error")
                assert 'rsinfer_http_requests_total{route="/v1/embeddings",status="400"} 1.0' in c.get("/metrics").text
            # a request in flight when SIGTERM arrives still gets its 200
            results: list = []
            big = {"input": ["a long sentence about the history of printing presses " * 12] * 400}
            t = threading.Thread(target=lambda: results.append(httpx.post(srv.url + "/v1/embeddings", json=big,
                                                                          timeout=120)))
            t.start()
            deadline = time.monotonic() + 30
            in_flight = False
            while not in_flight and t.is_alive() and time.monotonic() < deadline:
                text = httpx.get(srv.url + "/metrics").text
                in_flight = 'rsinfer_forwards_running{model="mini",version=""} 1.0' in text
                time.sleep(0.01)
            assert in_flight, "the big request should still be running"
            srv.proc.send_signal(signal.SIGTERM)
            t.join(120)
            assert results and results[0].status_code == 200
            assert len(results[0].json()["data"]) == 400
            assert srv.proc.wait(60) == 0
            assert "draining" in srv.output
            with pytest.raises(httpx.ConnectError):
                httpx.get(srv.url + "/health", timeout=2)
        finally:
            srv.stop()
        access = [x for x in srv.lines if "rsinfer.access" in x]
        assert access and not any("printing presses" in x for x in srv.lines)  # never the body


@pytest.mark.shared
def test_public_answers_hold_no_local_paths_or_banner(shared_models, serve_mode):
    cfg = parse_config({"server": {"api_keys": ["k"]}, "models": [
        {"name": "mini", "kind": "embedding", "path": str(shared_models / "all-minilm-l6-v2"), "replicas": 1}]})
    with ServerThread(cfg, mode=serve_mode) as srv:
        r = httpx.get(srv.url + "/v1/models", headers={"Authorization": "Bearer k"})
        assert str(shared_models) not in r.text and r.json()["data"][0]["source"] == "path:all-minilm-l6-v2"
        assert r.headers["server"] == "rsinfer"  # no Python/aiohttp versions
        denied = httpx.get(srv.url + "/v1/models")
        assert denied.status_code == 401 and denied.headers["www-authenticate"].startswith("Bearer")
        assert denied.headers["server"] == "rsinfer"
        host, port = srv.url.removeprefix("http://").split(":")
        for raw in (b"GARBAGE\r\n\r\n", b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n"):
            with socket.create_connection((host, int(port)), timeout=10) as sock:   # aiohttp's own 400s: no app
                sock.sendall(raw)                                                  # middleware or signal sees them
                answer = b""
                while b"\r\n\r\n" not in answer and len(answer) < 65536:
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    answer += chunk
            head = answer.split(b"\r\n\r\n")[0].decode()
            assert head.startswith("HTTP/1.") and " 400 " in head.splitlines()[0]
            assert "Server: rsinfer" in head.splitlines() and "aiohttp" not in head and "Python/" not in head


def test_deadlines_sweep_keeps_asyncio_timeouts_contract():
    """server.app.Deadlines: past due → TimeoutError (at most a tick late); a cancel from elsewhere stays a cancel;
    a request done in time leaves nothing behind and the sweep stops when nothing is in flight."""
    import asyncio
    import time

    from rsinfer_cli.server.app import Deadlines

    async def main():
        d = Deadlines(0.05)
        assert await d.within(asyncio.sleep(0, result="ok")) == "ok"
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            await d.within(asyncio.sleep(5))
        assert 0.05 <= time.monotonic() - t0 < 0.05 + d.tick + 0.05
        assert asyncio.current_task().cancelling() == 0          # the deadline's cancel was taken back

        async def outer():
            await d.within(asyncio.sleep(5))

        task = asyncio.ensure_future(outer())
        await asyncio.sleep(0.01)
        task.cancel()                                            # the client left: a cancel, not a timeout
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(2 * d.tick)
        assert not d.due and not d.fired and not d._sweeping

    asyncio.run(main())
