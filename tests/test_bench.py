"""`rsinfer bench`: in-process per EP (a missing EP is reported as skipped, never run on CPU), and HTTP mode
against a loopback server; bounded by count and time."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rsinfer_cli.cli.bench import builtin_corpus, request_body
from rsinfer_cli.config import parse_config
from rsinfer_cli.errors import ConfigError

from serverutil import ServerThread

SERVE_MODES = ("single", "workers")  # every test here also runs against the front-end/engine split


def bench(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rsinfer_cli", "bench", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def test_builtin_corpus_is_deterministic_and_mixed():
    a, b = builtin_corpus(), builtin_corpus()
    assert a == b
    lengths = [len(t.split()) for t in a]
    assert min(lengths) >= 5 and max(lengths) <= 120 and len(set(lengths)) > 50


@pytest.mark.parametrize(("route", "key"), [("/v1/embeddings", "input"), ("/embed", "inputs"),
                                            ("/v1/rerank", "documents"), ("/v2/rerank", "documents"),
                                            ("/v1/score", "text_2"), ("/pii/redact", "texts"),
                                            ("/classify/zero-shot", "candidate_labels"),
                                            ("/v1/classify/true-false", "assertion")])
def test_request_bodies_per_route(route, key):
    assert key in request_body(route, "m", ["a"])
    assert request_body(route, "m", ["a"])["model"] == "m"


def test_unknown_route_is_refused():
    with pytest.raises(ConfigError, match="not one of rsinfer's POST routes"):
        request_body("/v1/chat/completions", None, [])


@pytest.mark.shared
def test_in_process_skips_missing_eps(shared_models):
    proc = bench("--path", str(shared_models / "tiny-reranker-1"), "--eps", "cpu,tensorrt", "--batch-sizes", "1,4",
                 "--seq-lens", "16", "--warmup", "1", "--repeats", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["kind"] == "rerank"
    cpu = [r for r in rep["results"] if r["ep"] == "cpu"]
    assert [(r["batch"], r["seq_len"]) for r in cpu] == [(1, 16), (4, 16)]
    assert all(r["rows_per_s"] > 0 and r["p50_ms"] <= r["p99_ms"] and r["speedup"] == 1.0 for r in cpu)
    (trt,) = [r for r in rep["results"] if r["ep"] == "tensorrt"]
    assert "not installed" in trt["skipped"] and "rows_per_s" not in trt


@pytest.mark.shared
def test_http_mode_against_a_loopback_server(shared_models, tmp_path, serve_mode):
    cfg = parse_config({"models": [{"name": "mini", "kind": "embedding", "replicas": 1,
                                    "path": str(shared_models / "all-minilm-l6-v2")}]})
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("first text\nsecond text\n\nthird\n")
    with ServerThread(cfg, mode=serve_mode) as srv:
        proc = bench("--url", srv.url, "--concurrency", "4", "--requests", "40", "--texts-per-request", "2",
                     "--corpus", str(corpus), "--json")
        table = bench("--url", srv.url, "--route", "/embed", "--requests", "5", "--concurrency", "2")
        missing = bench("--url", srv.url, "--route", "/v1/rerank", "--requests", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["requests"] == rep["ok"] == 40 and rep["errors"] == {}
    assert rep["texts_per_s"] == pytest.approx(2 * rep["requests_per_s"])
    assert 0 < rep["p50_ms"] <= rep["p99_ms"]
    assert table.returncode == 0 and "/embed at concurrency 2" in table.stdout
    assert json.loads(missing.stdout)["errors"] == {"400": 3}  # no rerank model: counted by status


def test_bad_options_exit_2():
    assert bench("--url", "ftp://x").returncode == 2
    assert bench("--url", "http://127.0.0.1:9", "--concurrency", "0").returncode == 2
    assert bench("--url", "http://127.0.0.1:9", "--route", "/nope").returncode == 2
    proc = bench("--path", "/nonexistent", "--batch-sizes", "1,x")
    assert proc.returncode == 2 and "--batch-sizes" in proc.stderr


@pytest.mark.shared
def test_tensor_model_with_random_inputs_from_its_signature(shared_models):
    model = str(shared_models / "tensor-models" / "int64_identity")
    proc = bench("--path", model, "--shape", "INPUT0=1,32", "--batch-sizes", "1,4", "--seq-lens", "8",
                 "--warmup", "1", "--repeats", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["kind"] == "tensor" and [r["batch"] for r in out["results"]] == [1, 4]
    assert all(r["rows_per_s"] > 0 for r in out["results"])
    bad = bench("--path", model, "--shape", "INPUT0=1,2,3", "--repeats", "1")
    assert bad.returncode == 2 and "does not fit the input's shape [-1, -1]" in bad.stderr
