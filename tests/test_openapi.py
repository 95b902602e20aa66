"""The API as a contract: /openapi.json (OpenAPI 3.1, validated) lists every route the app registers, `rsinfer
openapi` prints the same document, /docs renders it in a real headless browser from local files, and schemathesis
finds no 5xx and no response outside the documented schemas against a live server with every family."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import httpx
import pytest
from openapi_spec_validator import validate

from rsinfer_cli.config import parse_config
from rsinfer_cli.server.openapi import document

from serverutil import ServerThread

SERVE_MODES = ("single", "workers")  # every test here also runs against the front-end/engine split

pytestmark = pytest.mark.shared


@pytest.fixture(scope="module")
def server(shared_models, serve_mode):
    s = shared_models
    cfg = parse_config({"server": {"max_texts": 64, "max_text_chars": 2000}, "models": [
        {"name": "mini", "kind": "embedding", "path": str(s / "all-minilm-l6-v2"), "replicas": 1},
        {"name": "rr", "kind": "rerank", "path": str(s / "tiny-reranker-1"), "replicas": 1},
        {"name": "pii", "kind": "pii", "path": str(s / "rampart-pii"), "replicas": 1},
        {"name": "nli", "kind": "zeroshot", "path": str(s / "tiny-nli"), "replicas": 1},
        {"name": "t", "kind": "tensor", "path": str(s / "tensor-models" / "add_one"), "replicas": 1,
         "max_batch_size": 8}]})
    with ServerThread(cfg, mode=serve_mode) as srv:
        yield srv


def test_document_is_valid_openapi_31():
    for secured in (False, True):
        doc = document(secured=secured)
        validate(doc)
        assert doc["openapi"] == "3.1.0"
    secured = document(secured=True)
    assert secured["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    assert secured["paths"]["/health"]["get"]["security"] == []  # open routes stay open


def test_every_registered_route_is_documented(server):
    doc = httpx.get(server.url + "/openapi.json").json()
    registered = set()
    for route in server.app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter")
        if route.method == "HEAD" or "prefix" in info:  # HEAD mirrors GET; the static assets of /docs
            continue
        registered.add((route.method.lower(), path))
    documented = {(m, p) for p, ops in doc["paths"].items() for m in ops}
    assert registered == documented


def test_cli_prints_the_same_document(server):
    proc = subprocess.run([sys.executable, "-m", "rsinfer_cli", "openapi"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == httpx.get(server.url + "/openapi.json").json()


def test_docs_are_served_from_local_files(server):
    html = httpx.get(server.url + "/docs").text
    assert "/docs/assets/swagger-ui-bundle.js" in html and "http" not in html.replace("/openapi.json", "")
    js = httpx.get(server.url + "/docs/assets/swagger-ui-bundle.js")
    assert js.status_code == 200 and len(js.content) > 500_000
    assert httpx.get(server.url + "/docs/assets/swagger-ui.css").status_code == 200


def test_docs_render_in_a_headless_browser(server):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        if os.environ.get("RSINFER_REQUIRE_CHROMIUM") == "1":
            pytest.fail("chromium is not installed and RSINFER_REQUIRE_CHROMIUM=1", pytrace=False)
        pytest.skip("chromium is not installed (apt-get install chromium)")
    proc = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000",
                           "--dump-dom", server.url + "/docs"], capture_output=True, text=True, timeout=120)
    dom = proc.stdout
    for path in ("/v1/embeddings", "/pii/redact", "/v2/models/{model}/infer", "/classify/zero-shot"):
        assert f'data-path="{path}"' in dom, path  # the page rendered the operations, from local assets only


@pytest.mark.slow
def test_schemathesis_finds_no_5xx_and_no_undocumented_response(server, tmp_path):
    server_tmp = tmp_path  # schemathesis keeps a cache in its working directory: never the checkout
    cli = shutil.which("schemathesis", path=os.path.dirname(sys.executable)) or shutil.which("schemathesis")
    assert cli is not None, "schemathesis is a test dependency"
    proc = subprocess.run([cli, "run", server.url + "/openapi.json", "--checks",
                           "not_a_server_error,response_schema_conformance,status_code_conformance,"
                           "content_type_conformance", "-n", "20", "--seed", "7", "--request-timeout", "20",
                           "--phases", "coverage,fuzzing", "--generation-database", "none"],
                          capture_output=True, text=True, timeout=300, cwd=server_tmp)
    assert proc.returncode == 0, proc.stdout[-6000:]
