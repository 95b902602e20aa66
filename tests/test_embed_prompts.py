"""Sentence-transformers folders through every front door, against reference.json from SentenceTransformer.encode:
OpenAI `/v1/embeddings` (the openai SDK, `prompt_name` as an extra body field), TEI `/embed`, Cohere embed (the
cohere SDK's ClientV2, `input_type` picking the prompt), the Hugging Face InferenceClient and `rsinfer embed`; every
case, the default prompt, each prompt and `prompt=""`. Also the 400 for an unknown prompt, Matryoshka sizes, and what
/info and /v1/models say."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from rsinfer_cli.config import parse_config

from serverutil import ServerThread

SERVE_MODES = ("single", "workers")   # include_prompt's masks travel to the engine with the rows
FIXTURES = Path(__file__).parent / "fixtures"
COS, ABS = 0.99999, 1e-4              # the bar; per component (measured <= 7e-7)

pytestmark = pytest.mark.shared


def reference_path(shared_models: Path, name: str) -> Path:
    return shared_models / name if name == "tiny-st-prompts" else FIXTURES / name


@pytest.fixture(scope="module", params=["tiny-st-prompts", "st-cls-dense", "st-legacy"])
def folder(request, shared_models) -> Path:
    return reference_path(shared_models, request.param)


@pytest.fixture(scope="module")
def ref(folder) -> dict:
    return json.loads((folder / "reference.json").read_text())


@pytest.fixture(scope="module")
def server(folder, serve_mode):
    cfg = parse_config({"models": [{"name": "m", "kind": "embedding", "path": str(folder), "replicas": 1,
                                    "matryoshka_dimensions": [8, 16]}]})
    with ServerThread(cfg, mode=serve_mode) as srv:
        yield srv


def calls(ref: dict) -> list[str]:
    return [k for k in ref["cases"][0] if k != "text" and not k.endswith(":tokens")]


def body(call: str) -> dict:
    """A reference call → the request fields that make it."""
    if call.startswith("prompt:"):
        return {"prompt_name": call.partition(":")[2]}
    return {"prompt": ""} if call == "no_prompt" else {}


def check(got, ref: dict, call: str) -> None:
    got = np.asarray(got, dtype=np.float32)
    want = np.array([c[call] for c in ref["cases"]], dtype=np.float32)
    assert got.shape == want.shape, call
    worst = min(float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b))) for a, b in zip(got, want, strict=True))
    assert worst >= COS, (call, worst)
    assert np.abs(got - want).max() <= ABS, call


def texts(ref: dict) -> list[str]:
    return [c["text"] for c in ref["cases"]]


def test_openai_sdk_with_prompt_name_as_extra_body(server, ref):
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    for call in calls(ref):
        r = client.embeddings.create(model="m", input=texts(ref), extra_body=body(call))
        check([d.embedding for d in r.data], ref, call)
        if f"{call}:tokens" in ref["cases"][0]:
            assert r.usage.prompt_tokens == sum(c[f"{call}:tokens"] for c in ref["cases"])


def test_tei_embed(server, ref):
    for call in calls(ref):
        r = httpx.post(server.url + "/embed", json={"inputs": texts(ref), **body(call)}, timeout=30)
        assert r.status_code == 200, r.text
        check(r.json(), ref, call)


def test_cohere_client_v2_input_type(server, ref, folder):
    """input_type picks the prompt as sentence-transformers' encode_query / encode_document do (document, else
    passage, else corpus), and classification / clustering a prompt of that name, else the default prompt."""
    import cohere

    saved = json.loads((folder / "config_sentence_transformers.json").read_text())["prompts"]
    doc = next((n for n in ("document", "passage", "corpus") if n in saved), None)
    expect = {"search_query": "prompt:query", "search_document": f"prompt:{doc}" if doc else "prompt:document",
              "classification": "prompt:classification" if "classification" in saved else "default",
              "clustering": "default"}
    with httpx.Client(timeout=30) as http:
        co = cohere.ClientV2(api_key="unused", base_url=server.url, httpx_client=http)
        for input_type, call in expect.items():
            r = co.embed(model="m", texts=texts(ref), input_type=input_type, embedding_types=["float"])
            check(r.embeddings.float_, ref, call)


def test_huggingface_inference_client(server, ref):
    from huggingface_hub import InferenceClient

    client = InferenceClient(model=f"{server.url}/models/m")
    for call in calls(ref):
        if call == "no_prompt":      # the client has no `prompt`: the same route, as its payload
            got = httpx.post(server.url + "/models/m", json={"inputs": texts(ref), "prompt": ""}).json()
        else:
            got = client.feature_extraction(texts(ref), prompt_name=body(call).get("prompt_name"))
        check(got, ref, call)


def test_unknown_prompt_and_matryoshka_sizes_are_400s(server, ref):
    r = httpx.post(server.url + "/v1/embeddings", json={"model": "m", "input": ["x"], "prompt_name": "summary"})
    names = ", ".join(sorted({*ref["prompts"], "query", "document"}))
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_name"
    assert r.json()["error"]["message"] == f"unknown prompt_name 'summary' for model 'm'; its prompts: {names}"
    bad = httpx.post(server.url + "/embed", json={"inputs": ["x"], "dimensions": 12})
    sizes = ", ".join(str(d) for d in sorted({8, 16, ref["dimension"]}))
    assert bad.status_code == 400 and bad.json()["error"]["message"].endswith(f"its sizes: {sizes}")
    for route, field in (("/v1/embeddings", "input"), ("/embed", "inputs")):
        ok = httpx.post(server.url + route, json={"model": "m", field: ["x"], "dimensions": 8})
        assert ok.status_code == 200
    cohere = httpx.post(server.url + "/v2/embed", json={"texts": ["x"], "input_type": "search_query",
                                                         "output_dimension": 12, "embedding_types": ["float"]})
    assert cohere.status_code == 400


def test_info_and_models_show_prompts_and_width(server, ref):
    info = httpx.get(server.url + "/info").json()["model_type"]["embedding"]
    model = httpx.get(server.url + "/v1/models").json()["data"][0]["pipeline"]
    for seen in (info, model):
        assert seen["dimensions"] == ref["dimension"]
        assert set(seen["prompts"]) == {k for k, v in ref["prompts"].items() if v}
        assert seen["default_prompt_name"] == ref["default_prompt_name"]
        assert seen["matryoshka_dimensions"] == [8, 16] and seen["normalize"] is ref["normalized"]


def test_rsinfer_embed_prompt_name(folder, ref):
    lines = "".join(json.dumps({"text": t}) + "\n" for t in texts(ref))
    for call in ("default", "prompt:query", "no_prompt"):
        flags = ["--prompt-name", "query"] if call == "prompt:query" else ["--prompt", ""] if call == "no_prompt" \
            else []
        proc = subprocess.run([sys.executable, "-m", "rsinfer_cli", "embed", "--path", str(folder), *flags],
                              input=lines, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        check([json.loads(x)["embedding"] for x in proc.stdout.splitlines()], ref, call)
    bad = subprocess.run([sys.executable, "-m", "rsinfer_cli", "embed", "--path", str(folder), "--prompt-name",
                          "summary", "x"], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "unknown prompt_name 'summary'" in bad.stderr and not bad.stdout


def test_hugging_face_parameters_are_checked(server):
    for params, says in (({"prompt_name": 3}, "`prompt_name` must be a string"),
                         ({"normalize": "yes"}, "`normalize` must be a boolean"),
                         ({"dimensions": True}, "`dimensions` must be an integer"),
                         ({"truncation_direction": "middle"}, "must be right or left")):
        r = httpx.post(server.url + "/models/m", json={"inputs": "x", "parameters": params})
        assert r.status_code in (400, 422) and says in r.json()["error"]["message"], (params, r.text)
    ok = httpx.post(server.url + "/models/m", json={"inputs": "x", "parameters": {"prompt_name": "query",
                                                                                   "dimensions": 8}})
    assert ok.status_code == 200 and np.asarray(ok.json()).shape == (1, 8)


def test_tei_similarity_and_tokenize_take_the_prompt(server, ref):
    """TEI's /similarity (`parameters.prompt_name`) and /tokenize (`prompt_name`), and Hugging Face's
    sentence-similarity with the same parameters: the sentences are embedded with the prompt, as /embed does."""
    source, sentences = ref["cases"][0]["text"], [c["text"] for c in ref["cases"][1:4]]
    want = np.array([c["prompt:query"] for c in ref["cases"][:4]])
    want = want / np.linalg.norm(want, axis=1, keepdims=True)
    pair = {"source_sentence": source, "sentences": sentences}
    tei = httpx.post(server.url + "/similarity", json={"inputs": pair, "parameters": {"prompt_name": "query"}})
    hf = httpx.post(server.url + "/models/m", json={"inputs": pair, "parameters": {"prompt_name": "query"}})
    for r in (tei, hf):
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(r.json(), want[1:] @ want[0], atol=1e-4)
    bad = httpx.post(server.url + "/similarity", json={"inputs": pair, "parameters": {"prompt_name": "summary"}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt_name"
    tokens = httpx.post(server.url + "/tokenize", json={"inputs": "hello", "prompt_name": "query"}).json()[0]
    plain = httpx.post(server.url + "/tokenize", json={"inputs": "hello"}).json()[0]
    prompt = ref["prompts"]["query"]
    assert [t["text"] for t in tokens][1:-1] != [t["text"] for t in plain][1:-1]
    assert tokens[-2]["stop"] == len(prompt) + len("hello")      # offsets in the text the model sees
