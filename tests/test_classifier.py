"""`kind: classifier`: sequence classification against the transformers text-classification pipeline's outputs
(reference.json of tiny-textcls), through the pipeline, TEI's /predict, infinity's /classify, the Hugging Face
InferenceClient (installed package) and `rsinfer predict`."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import numpy as np
import pytest

from rsinfer_cli import families
from rsinfer_cli.config import ModelConfig, parse_config
from rsinfer_cli.engine.model import load_model
from rsinfer_cli.errors import ConfigError, ModelLoadError
from rsinfer_cli.pipelines.classifier import ClassifierOptions, ClassifierPipeline, default_function

from serverutil import ServerThread

SERVE_MODES = ("single", "workers")
TOL = 2e-5   # reference.json rounds to 6 decimals; fp32 graph vs torch


@pytest.fixture(scope="module")
def folder(shared_models):
    return shared_models / "tiny-textcls"


@pytest.fixture(scope="module")
def ref(folder) -> dict:
    return json.loads((folder / "reference.json").read_text())


@pytest.fixture(scope="module")
def pipe(folder) -> ClassifierPipeline:
    return ClassifierPipeline(load_model(ModelConfig(name="cls", kind="classifier", path=str(folder), replicas=1)))


def assert_labels(got: list[dict], want: list[dict]) -> None:
    assert [g["label"] for g in got] == [w["label"] for w in want]
    np.testing.assert_allclose([g["score"] for g in got], [w["score"] for w in want], atol=TOL)


# ---------------------------------------------------------------- the pipeline


def test_every_label_top1_and_raw_logits_match_transformers(pipe, ref):
    texts = [c["text"] for c in ref["cases"]]
    every, top1, raw = (pipe.classify(texts).to_json(), pipe.classify(texts, top_k=1).to_json(),
                        pipe.classify(texts, raw=True).to_json())
    for case, a, b, c in zip(ref["cases"], every, top1, raw, strict=True):
        assert_labels(a, case["all_labels"])
        assert_labels(b, case["top1"])
        assert_labels(c, case["raw_logits"])
    assert pipe.describe()["function_to_apply"] == "softmax"   # single_label_classification, 3 labels


def test_function_to_apply_rules_of_the_transformers_pipeline():
    assert default_function({"problem_type": "multi_label_classification"}, 5) == "sigmoid"
    assert default_function({}, 1) == "sigmoid"
    assert default_function({"problem_type": "regression"}, 1) == "none"
    assert default_function({"problem_type": "single_label_classification"}, 2) == "softmax"
    assert default_function({}, 3) == "softmax"


def test_config_function_and_request_function(folder, ref):
    sig = ClassifierPipeline(load_model(ModelConfig(name="c", kind="classifier", path=str(folder), replicas=1,
                                                    options=ClassifierOptions(function_to_apply="sigmoid"))))
    case = ref["cases"][0]
    logits = {x["label"]: x["score"] for x in case["raw_logits"]}
    got = sig.classify([case["text"]]).to_json()[0]
    for item in got:
        assert item["score"] == pytest.approx(1 / (1 + np.exp(-logits[item["label"]])), abs=TOL)
    # a request's own function wins over the model's
    assert_labels(sig.classify([case["text"]], function="softmax").to_json()[0], case["all_labels"])


def test_config_keys_are_the_familys(folder):
    cfg = parse_config({"models": [{"name": "c", "kind": "classifier", "path": str(folder),
                                    "function_to_apply": "sigmoid"}]})
    assert cfg.models[0].options == ClassifierOptions(function_to_apply="sigmoid")
    with pytest.raises(ConfigError, match=r"models\[0\]\.function_to_apply: must be one of auto, sigmoid"):
        parse_config({"models": [{"name": "c", "kind": "classifier", "path": "x", "function_to_apply": "tanh"}]})
    with pytest.raises(ConfigError, match=r"models\[0\]\.function_to_apply: applies to kind classifier only"):
        parse_config({"models": [{"name": "e", "kind": "embedding", "path": "x", "function_to_apply": "none"}]})


def test_a_folder_is_recognised_as_a_classifier(shared_models):
    def kind(name: str) -> str:
        return families.guess_kind(families.Folder(json.loads((shared_models / name / "config.json").read_text())))[0]

    assert kind("tiny-textcls") == "classifier"
    assert kind("tiny-nli") == "zeroshot"            # entailment labels: still NLI
    assert kind("tiny-reranker-1") == "rerank"       # LABEL_0 / one score: still a cross-encoder


def test_labels_must_fit_the_output(shared_models):
    # an NLI graph has 3 logits: fine; an embedding graph's output is no [batch, labels]
    with pytest.raises(ModelLoadError, match="id2label|classifier output"):
        ClassifierPipeline(load_model(ModelConfig(name="e", kind="classifier",
                                                  path=str(shared_models / "all-minilm-l6-v2"), replicas=1)))


# ---------------------------------------------------------------- the routes


@pytest.fixture(scope="module")
def server(folder, shared_models, serve_mode):
    cfg = parse_config({"server": {"max_texts": 4, "max_text_chars": 200, "cache": {"backend": "memory"}},
                        "models": [{"name": "sentiment", "kind": "classifier", "path": str(folder)},
                                   {"name": "emb", "kind": "embedding",
                                    "path": str(shared_models / "all-minilm-l6-v2")}]})
    with ServerThread(cfg, mode=serve_mode) as srv:
        yield srv


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def test_tei_predict_single_batch_and_pair(client, pipe, ref):
    cases = ref["cases"][:3]
    one = client.post("/predict", json={"inputs": cases[0]["text"]})
    assert one.status_code == 200, one.text
    assert_labels(one.json(), cases[0]["all_labels"])
    batch = client.post("/predict", json={"inputs": [[c["text"]] for c in cases], "raw_scores": True}).json()
    for got, case in zip(batch, cases, strict=True):
        assert_labels(got, case["raw_logits"])
    # TEI reads a list of exactly two strings as one text pair
    pair = client.post("/predict", json={"inputs": ["It is a chair.", "It is a table."]}).json()
    want = pipe.classify(["It is a chair."], pairs=["It is a table."]).to_json()[0]
    assert_labels(pair, want)
    three = client.post("/predict", json={"inputs": [c["text"] for c in cases]}).json()
    assert len(three) == 3 and isinstance(three[0], list)


def test_infinity_classify(client, ref):
    cases = ref["cases"][:2]
    r = client.post("/classify", json={"input": [c["text"] for c in cases], "model": "sentiment"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "classify" and body["model"] == "sentiment" and body["usage"]["prompt_tokens"] > 0
    for got, case in zip(body["data"], cases, strict=True):
        assert_labels(got, case["all_labels"])
    top = client.post("/v1/classify", json={"input": cases[0]["text"], "top_k": 1}).json()
    assert_labels(top["data"][0], cases[0]["top1"])


def test_huggingface_inference_client(server, ref):
    from huggingface_hub import InferenceClient

    hf = InferenceClient(model=f"{server.url}/models/sentiment")
    case = ref["cases"][1]
    got = hf.text_classification(case["text"])
    assert_labels([{"label": x.label, "score": x.score} for x in got], case["all_labels"])
    top = hf.text_classification(case["text"], top_k=1)
    assert_labels([{"label": x.label, "score": x.score} for x in top], case["top1"])
    raw = hf.text_classification(case["text"], function_to_apply="none")
    assert_labels([{"label": x.label, "score": x.score} for x in raw], case["raw_logits"])


@pytest.mark.parametrize(("path", "body"), [
    ("/predict", {"inputs": [["a"]] * 5}),
    ("/classify", {"input": ["a"] * 5}),
    ("/predict", {"inputs": "x" * 201}),
    ("/classify", {"input": ["x" * 201]}),
    ("/models/sentiment", {"inputs": "x" * 201}),
])
def test_the_same_limits_on_every_route(client, path, body):
    r = client.post(path, json=body)
    assert r.status_code == 413, r.text
    assert "server.max_texts" in r.text or "max_text_chars" in r.text


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/predict", {"inputs": []}, "inputs"),
    ("/predict", {"inputs": [["a", "b", "c"]]}, "inputs[0]"),
    ("/predict", {"inputs": [["a"], ["a", "b"]]}, "inputs"),
    ("/classify", {"input": []}, "input"),
    ("/models/sentiment", {"inputs": "a", "parameters": {"top_k": 0}}, "parameters.top_k"),
    ("/models/sentiment", {"inputs": "a", "parameters": {"function_to_apply": "tanh"}},
     "parameters.function_to_apply"),
])
def test_bad_input_is_a_4xx_naming_the_field(client, path, body, param):
    r = client.post(path, json=body)
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["error"]["param"] == param


def test_cache_info_and_openapi(client, ref):
    body = {"input": [ref["cases"][3]["text"]]}
    first, second = client.post("/classify", json=body), client.post("/classify", json=body)
    assert first.headers["x-rsinfer-cache"] == "miss" and second.headers["x-rsinfer-cache"] == "hit"
    assert first.json()["data"] == second.json()["data"]
    doc = client.get("/openapi.json").json()
    assert doc["paths"]["/predict"]["post"]["tags"] == ["classifier"]
    assert "/v1/classify" in doc["paths"] and {"name": "classifier"} in doc["tags"]
    models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert models["sentiment"]["pipeline"]["labels"] == ["negative", "neutral", "positive"]


# ---------------------------------------------------------------- the CLI


def test_cli_predict_jsonl_in_order(folder, ref, tmp_path):
    src = tmp_path / "in.jsonl"
    cases = ref["cases"][:5]
    src.write_text("".join(json.dumps({"id": i, "body": c["text"]}) + "\n" for i, c in enumerate(cases)))
    out = subprocess.run([sys.executable, "-m", "rsinfer_cli", "predict", "--path", str(folder), "--input", str(src),
                          "--field", "body", "--top-k", "1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    assert [x["id"] for x in lines] == list(range(5))
    for line, case in zip(lines, cases, strict=True):
        assert_labels(line["labels"], case["top1"])
    bad = subprocess.run([sys.executable, "-m", "rsinfer_cli", "predict", "--path", str(folder), "--top-k", "0", "x"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--top-k must be >= 1" in bad.stderr
