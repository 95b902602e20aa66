"""`rsinfer batch`: OpenAI batch files answered with the bodies `rsinfer serve` gives for the same requests, in
order, each custom_id exactly once across a kill and a rerun, and bad files refused by line before anything runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from rsinfer_cli.config import load_config

from serverutil import ServerThread

EXIT_INPUT = 3


def write_config(tmp_path: Path, shared: Path) -> Path:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"""models:
  - name: minilm
    kind: embedding
    path: {shared / 'all-minilm-l6-v2'}
  - name: pii
    kind: pii
    path: {shared / 'rampart-pii'}
  - name: rr
    kind: rerank
    path: {shared / 'tiny-reranker-1'}
""")
    return cfg


def requests_file(path: Path, n: int = 40) -> list[dict]:
    reqs = []
    for i in range(n):
        reqs.append({"custom_id": f"emb-{i}", "method": "POST", "url": "/v1/embeddings",
                     "body": {"model": "minilm", "input": [f"text number {i}", "naïve café"]}})
    reqs += [{"custom_id": "rerank", "method": "POST", "url": "/v1/rerank",
              "body": {"model": "rr", "query": "invoice", "documents": ["an overdue invoice", "a cat"]}},
             {"custom_id": "redact", "method": "POST", "url": "/pii/redact",
              "body": {"model": "pii", "text": "mail ana@example.org", "mode": "replace"}},
             {"custom_id": "analyze", "method": "POST", "url": "/analyze",
              "body": {"text": "call +44 20 7946 0958", "language": "en"}},
             {"custom_id": "missing-model", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": "nope", "input": "x"}},
             {"custom_id": "bad-body", "method": "POST", "url": "/v1/embeddings", "body": {"model": "minilm"}}]
    path.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    return reqs


def batch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rsinfer_cli", "batch", *args], capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)


def without_ids(body):
    """A response body without what differs per request (its id, timings)."""
    if isinstance(body, dict):
        return {k: without_ids(v) for k, v in body.items() if k not in ("id", "took", "created")}
    if isinstance(body, list):
        return [without_ids(x) for x in body]
    return body


def test_answers_are_the_server_s_in_order(shared_models, tmp_path):
    cfg = write_config(tmp_path, shared_models)
    reqs = requests_file(tmp_path / "in.jsonl")
    proc = batch(str(tmp_path / "in.jsonl"), "--config", str(cfg))
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(x) for x in proc.stdout.splitlines()]
    assert [x["custom_id"] for x in lines] == [r["custom_id"] for r in reqs]
    assert all(x["id"].startswith("batch_req_") and x["error"] is None for x in lines)
    assert "answered 45 request(s), 2 with an error status" in proc.stderr
    with ServerThread(load_config(cfg)) as srv, httpx.Client(base_url=srv.url, timeout=60) as client:
        for r, line in zip(reqs, lines, strict=True):
            resp = client.post(r["url"], json=r["body"])
            assert line["response"]["status_code"] == resp.status_code, r["custom_id"]
            assert without_ids(line["response"]["body"]) == without_ids(resp.json()), r["custom_id"]
    assert lines[-2]["response"]["status_code"] == 404 and lines[-1]["response"]["status_code"] == 422
    assert "ana@example.org" not in json.dumps(lines[-4])


def test_a_killed_run_resumes_with_every_id_once(shared_models, tmp_path):
    cfg = write_config(tmp_path, shared_models)
    reqs = requests_file(tmp_path / "in.jsonl", n=400)
    out = tmp_path / "out.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "rsinfer_cli", "batch", str(tmp_path / "in.jsonl"), "--config",
                             str(cfg), "--output", str(out), "--concurrency", "2"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not out.exists() or out.stat().st_size < 20_000):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    proc.stderr.close()
    with open(out, "ab") as f:          # as if the kill cut a line short
        f.write(b'{"id": "batch_req_x", "custom_id": "emb-3')
    first = len(out.read_bytes().splitlines()) - 1
    assert 0 < first < len(reqs)
    again = batch(str(tmp_path / "in.jsonl"), "--config", str(cfg), "--output", str(out))
    assert again.returncode == 0, again.stderr
    assert "answered before" in again.stderr
    ids = [json.loads(x)["custom_id"] for x in out.read_text().splitlines()]
    assert sorted(ids) == sorted(r["custom_id"] for r in reqs) and len(ids) == len(set(ids))
    done = batch(str(tmp_path / "in.jsonl"), "--config", str(cfg), "--output", str(out))
    assert done.returncode == 0 and "answered 0 request(s)" in done.stderr
    assert len(out.read_text().splitlines()) == len(reqs)


@pytest.mark.parametrize(("line", "message"), [
    ("not json", "line 2: not valid JSON"),
    ('["a"]', "line 2: expected a JSON object, got list"),
    ('{"custom_id": "a", "url": "/v1/embeddings", "body": {}}', "line 2: custom_id 'a' again (first on line 1)"),
    ('{"custom_id": "b", "method": "GET", "url": "/v1/models", "body": {}}', "line 2: `method` must be POST"),
    ('{"custom_id": "b", "url": "/v1/embeddings", "body": "x"}', "line 2: `body` must be a JSON object"),
    ('{"custom_id": "b", "url": "/v1/nothing", "body": {}}', "line 2: no POST route /v1/nothing (HTTP 404)"),
    ('{"custom_id": "b", "url": "/v1/models", "body": {}}', "line 2: no POST route /v1/models (HTTP 405)"),
])
def test_a_bad_line_is_refused_by_number_before_anything_runs(shared_models, tmp_path, line, message):
    cfg = write_config(tmp_path, shared_models)
    src = tmp_path / "in.jsonl"
    src.write_text('{"custom_id": "a", "url": "/v1/embeddings", "body": {"model": "minilm", "input": "x"}}\n'
                   + line + "\n")
    out = tmp_path / "out.jsonl"
    proc = batch(str(src), "--config", str(cfg), "--output", str(out))
    assert proc.returncode == EXIT_INPUT, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists() or out.read_text() == ""
