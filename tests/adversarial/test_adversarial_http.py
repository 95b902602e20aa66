"""Every body of the adversarial corpus (corpus.py) against one server: the status and error it must get, never a
5xx, never a host path in an answer, and a redaction's text within its budget (4x its input + 4096 characters)."""

from __future__ import annotations

import json
import tempfile

import grpc
import httpx
import pytest
from corpus import CASES, Case

from rsinfer_cli.config import parse_config
from rsinfer_cli.pipelines.pii import ANSWER_GROWTH, ANSWER_SLACK

import synth
from serverutil import ServerThread

pytestmark = pytest.mark.shared


@pytest.fixture(scope="module")
def server(shared_models, tmp_path_factory):
    adder = synth.add_graph(tmp_path_factory.mktemp("adder") / "model.onnx").parent
    cfg = parse_config({"server": {"max_text_chars": 200_000}, "models": [
        {"name": "pii", "kind": "pii", "path": str(shared_models / "rampart-pii"), "replicas": 1},
        {"name": "minilm", "kind": "embedding", "path": str(shared_models / "all-minilm-l6-v2"), "replicas": 1},
        {"name": "ce", "kind": "rerank", "path": str(shared_models / "tiny-reranker-1"), "replicas": 1},
        {"name": "splade", "kind": "sparse", "path": str(shared_models / "tiny-splade"), "replicas": 1},
        {"name": "nli", "kind": "zeroshot", "path": str(shared_models / "tiny-nli"), "replicas": 1},
        {"name": "adder", "kind": "tensor", "path": str(adder), "max_batch_size": 8, "replicas": 1}]})
    with ServerThread(cfg, grpc=True) as srv:
        srv.host_paths = [str(shared_models), str(adder), tempfile.gettempdir() + "/"]
        yield srv


def message(resp: httpx.Response) -> str:
    err = resp.json()["error"]
    return err if isinstance(err, str) else err["message"]       # KServe's and Presidio's body, or OpenAI's


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_corpus(server, case: Case):
    made = case.body()
    body = made if isinstance(made, bytes) else json.dumps(made).encode()
    r = httpx.request(case.method, server.url + case.route, content=body,
                      headers={"content-type": "application/json"}, timeout=120)
    assert r.status_code < 500
    assert r.status_code == case.status, r.text[:500]
    if r.status_code >= 400:
        assert case.says in message(r), message(r)
    for path in server.host_paths:
        assert path not in r.text
    if r.status_code == 200 and case.route in ("/anonymize", "/pii/redact"):
        sent = json.loads(body)
        out = r.json()
        texts = [out["text"]] if "text" in out else [x["text"] for x in out["results"]]
        for text in texts:
            assert len(text) <= ANSWER_GROWTH * len(sent["text"]) + ANSWER_SLACK


def test_a_grpc_error_names_a_long_model_name_shortly(server):
    """A 20,000-character model name is NOT_FOUND (not RESOURCE_EXHAUSTED: the message echoed it whole), with the
    name cut in the message."""
    from rsinfer_cli.server.kserve import kserve_pb2, kserve_pb2_grpc

    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = kserve_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelMetadata(kserve_pb2.ModelMetadataRequest(name="m" * 20_000), timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert len(err.value.details()) < 300 and "(20000 characters)" in err.value.details()
    r = httpx.get(f"{server.url}/v2/models/{'m' * 5000}")
    assert r.status_code == 404 and len(r.text) < 400


def test_no_host_path_in_errors_of_a_missing_model_folder(server):
    """A repository load of a name the config lacks, a model that is not there: the answers name models, never the
    host's paths (the config file's, a folder's)."""
    for r in (httpx.post(server.url + "/v2/repository/models/nowhere/load"),
              httpx.get(server.url + "/v2/models/nowhere/ready"),
              httpx.post(server.url + "/v2/repository/index")):
        assert r.status_code < 500
        for path in server.host_paths:
            assert path not in r.text
