"""Redaction that cannot leak, input limits that fail fast, one status rule, and the CLI's edge cases (issue: redaction
that cannot leak)."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from rsinfer_cli.config import parse_config

from serverutil import ServerThread

SERVE_MODES = ("single", "workers")  # every test here also runs against the front-end/engine split

pytestmark = pytest.mark.shared
PLANTED = ["alex.rivera@example.com", "john.smith@example.com", "123-45-6789", "4111 1111 1111 1111"]
TEXT = (f"My name is Alex Rivera and my email is {PLANTED[0]}. SSN {PLANTED[2]}, card {PLANTED[3]}; "
        f"cc {PLANTED[1]}")
MODES = ["mask", "remove", "replace", "hash"]


@pytest.fixture(scope="module")
def server(shared_models, serve_mode):
    cfg = parse_config({"server": {"max_text_chars": 5000}, "models": [
        {"name": "pii", "kind": "pii", "path": str(shared_models / "rampart-pii"), "replicas": 1, "default": True},
        {"name": "pii-small", "kind": "pii", "path": str(shared_models / "rampart-pii"), "replicas": 1,
         "max_text_chars": 50},
        {"name": "mini", "kind": "embedding", "path": str(shared_models / "all-minilm-l6-v2"), "replicas": 1},
        {"name": "rr", "kind": "rerank", "path": str(shared_models / "tiny-reranker-1"), "replicas": 1},
        {"name": "nli", "kind": "zeroshot", "path": str(shared_models / "tiny-nli"), "replicas": 1}]})
    with ServerThread(cfg, mode=serve_mode) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        yield c


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("route", ["/pii/redact", "/v1/pii/redact"])
def test_redaction_answer_holds_no_removed_value(server, mode, route):
    r = server.post(route, json={"model": "pii", "texts": [TEXT, TEXT.upper()], "mode": mode})
    assert r.status_code == 200, r.text
    for planted in PLANTED + [p.upper() for p in PLANTED]:
        assert planted not in r.text, (mode, planted)
    result = r.json()["results"][0]
    assert result["entities"], "something was redacted"
    for e in result["entities"]:
        assert set(e) == {"entity_type", "score", "start", "end", "replacement", "redacted_start", "redacted_end"}
        assert result["text"][e["redacted_start"]:e["redacted_end"]] == e["replacement"]  # offsets in the new text
        assert TEXT[e["start"]:e["end"]] not in r.text


def test_detect_still_returns_the_values(server):
    found = server.post("/pii/detect", json={"model": "pii", "text": TEXT}).json()["results"][0]["entities"]
    assert PLANTED[0] in [e["text"] for e in found]


@pytest.mark.parametrize("route", ["/pii/detect", "/pii/redact", "/v1/pii/detect", "/v1/pii/redact"])
def test_unknown_types_are_400_listing_the_valid_ones(server, route):
    r = server.post(route, json={"model": "pii", "text": TEXT, "types": ["EMAIL", "NOPE"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "types"
    msg = r.json()["error"]["message"]
    assert "'NOPE'" in msg and "EMAIL" in msg and "SSN" in msg


@pytest.mark.parametrize("threshold", [-1, 1.5, 1e19])
@pytest.mark.parametrize(("route", "body"), [
    ("/pii/detect", {"model": "pii", "text": "x"}), ("/pii/redact", {"model": "pii", "text": "x"}),
    ("/classify/true-false", {"model": "nli", "input": "x", "assertion": "It is."})])
def test_threshold_outside_0_1_is_400(server, route, body, threshold):
    r = server.post(route, json={**body, "threshold": threshold})
    assert r.status_code == 400 and r.json()["error"]["param"] == "threshold"
    assert any(bound in r.json()["error"]["message"] for bound in (">= 0", "<= 1"))


@pytest.mark.parametrize(("route", "body", "param"), [
    ("/pii/redact", {"model": "pii", "text": "y" * 5001}, "text"),
    ("/pii/detect", {"model": "pii-small", "texts": ["ok", "z" * 51]}, "texts[1]"),  # the model's own limit
    ("/v1/embeddings", {"model": "mini", "input": ["a", "b" * 5001]}, "input[1]"),
    ("/v1/rerank", {"model": "rr", "query": "q" * 5001, "documents": ["d"]}, "query"),
    ("/classify/zero-shot", {"model": "nli", "input": "i" * 5001, "candidate_labels": ["a"]}, "input"),
])
def test_texts_over_max_text_chars_are_413_naming_the_limit(server, route, body, param):
    r = server.post(route, json=body)
    assert r.status_code == 413 and r.json()["error"]["param"] == param
    assert "(max_text_chars)" in r.json()["error"]["message"]


def test_default_limit_refuses_a_2mb_text_at_once(shared_models, serve_mode):
    cfg = parse_config({"models": [{"name": "pii", "kind": "pii", "path": str(shared_models / "rampart-pii"),
                                    "replicas": 1}]})
    with ServerThread(cfg, mode=serve_mode) as srv:
        r = httpx.post(srv.url + "/pii/redact", json={"text": "word " * 400_000}, timeout=30)
        assert r.status_code == 413 and "at most 1000000 per text" in r.json()["error"]["message"]


@pytest.mark.parametrize(("route", "param"), [
    ("/v1/embeddings", "input"), ("/embed", "inputs"), ("/v1/rerank", "query"), ("/rerank", "query"),
    ("/v2/rerank", "query"), ("/v1/score", "text_1"), ("/pii/detect", "text"), ("/pii/redact", "text"),
    ("/classify/zero-shot", "input"), ("/classify/true-false", "input"),
])
def test_a_missing_required_field_is_422_on_every_route(server, route, param):
    r = server.post(route, json={})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["param"] == param and "required" in r.json()["error"]["message"]


# ---------------------------------------------------------------- CLI


def cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rsinfer_cli", *args], input=stdin.encode(),
                          capture_output=True, timeout=180)


@pytest.mark.parametrize("mode", MODES)
def test_cli_spans_hold_no_removed_value(shared_models, mode):
    records = json.dumps({"id": 1, "text": TEXT}) + "\n"
    proc = cli("redact", "--spans", "--mode", mode, "--path", str(shared_models / "rampart-pii"), stdin=records)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.decode()
    for planted in PLANTED:
        assert planted not in out
    spans = json.loads(out)["pii_spans"]["text"]
    assert spans and all("text" not in s and "replacement" in s for s in spans)


def test_cli_threshold_and_output_errors_are_usage_errors(shared_models, tmp_path):
    pii = str(shared_models / "rampart-pii")
    bad = cli("detect", "--threshold", "1.5", "--path", pii, stdin='{"text": "x"}\n')
    assert bad.returncode == 2 and b"--threshold must be between 0 and 1" in bad.stderr
    nli = cli("classify", "--assertion", "It is.", "--threshold", "2", "--path",
              str(shared_models / "tiny-nli"), "x")
    assert nli.returncode == 2 and b"--threshold" in nli.stderr
    out = cli("embed", "--output", str(tmp_path / "missing" / "v.npy"), "--path",
              str(shared_models / "all-minilm-l6-v2"), "x")
    assert out.returncode == 2 and b"cannot write: folder" in out.stderr and b"missing" in out.stderr


MIXED = (b'{"id": 1, "text": "mail alex.rivera@example.com"}\n'
         b"\n"
         b"not json at all\r\n"
         b'["an", "array"]\n'
         b'{"id": 5, "other": "no text field"}\n'
         b'{"id": 6, "text": 42}\n'
         b'{"id": 7, "text": "plain words"}\n')


def run_redact(shared_models, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rsinfer_cli", "redact", "--path", str(shared_models / "rampart-pii"),
                           *args], input=MIXED, capture_output=True, timeout=180)


def test_on_error_modes_over_every_bad_line_kind(shared_models):
    fail = run_redact(shared_models)
    assert fail.returncode == 3 and b"line 3: not valid JSON" in fail.stderr
    assert [json.loads(x)["id"] for x in fail.stdout.splitlines()] == [1]  # what came before the bad line

    skip = run_redact(shared_models, "--on-error", "skip", "--allow-missing")
    assert skip.returncode == 0, skip.stderr
    assert [json.loads(x)["id"] for x in skip.stdout.splitlines()] == [1, 5, 6, 7]  # only malformed lines dropped
    assert b"line 3" in skip.stderr and b"line 4" in skip.stderr and b"skipped 2 malformed line(s): 3, 4" in skip.stderr
    assert json.loads(skip.stdout.splitlines()[2]) == {"id": 6, "text": 42}  # non-string: through unchanged

    strict = run_redact(shared_models, "--on-error", "skip")  # a missing field is not malformed: an error
    assert strict.returncode == 3 and b"line 5: no field 'text'" in strict.stderr
    assert [json.loads(x)["id"] for x in strict.stdout.splitlines()] == [1]

    keep = run_redact(shared_models, "--on-error", "keep", "--allow-missing")
    assert keep.returncode == 0, keep.stderr
    lines = keep.stdout.splitlines(keepends=True)
    assert lines[1:4] == [b"\n", b"not json at all\r\n", b'["an", "array"]\n']  # byte for byte, blank line kept
    assert len(lines) == 7 and b"alex.rivera" not in keep.stdout


@pytest.mark.parametrize(("command", "extra"), [
    ("embed", ["--path", "all-minilm-l6-v2"]),
    ("classify", ["--labels", "a,b", "--path", "tiny-nli"]),
    ("detect", ["--path", "rampart-pii"]),
])
def test_commands_write_everything_before_a_bad_line(shared_models, command, extra):
    extra = [str(shared_models / x) if x in ("all-minilm-l6-v2", "tiny-nli", "rampart-pii") else x for x in extra]
    stdin = '{"text": "one"}\n{"text": "two"}\n{broken\n{"text": "four"}\n'
    proc = cli(command, *extra, stdin=stdin)
    assert proc.returncode == 3 and b"line 3" in proc.stderr
    assert len(proc.stdout.splitlines()) == 2  # the two records before the bad line, nothing after


@pytest.mark.parametrize(("route", "body", "status"), [
    ("/v1/embeddings", b"not json", 400), ("/v1/embeddings", b"", 400), ("/v1/embeddings", b"[1, 2]", 422),
    ("/v1/embeddings", b'{"input": 5}', 422), ("/infer", b"not json", 400), ("/infer", b'{"input": 5}', 422),
    ("/batch", b"[1, 2]", 422), ("/v2/models/add/infer", b"not json", 400), ("/v2/models/add/infer", b"[1, 2]", 400),
])
def test_the_documented_400_422_rule(shared_models, route, body, status):
    """README "Errors": not JSON → 400; JSON without the request's shape → 422; KServe v2 routes: 400 for both."""
    cfg = parse_config({"models": [
        {"name": "add", "kind": "tensor", "path": str(shared_models / "tensor-models" / "add_one")},
        {"name": "mini", "kind": "embedding", "path": str(shared_models / "all-minilm-l6-v2")}]})
    with ServerThread(cfg) as srv:
        r = httpx.post(srv.url + route, content=body, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == status, r.text
