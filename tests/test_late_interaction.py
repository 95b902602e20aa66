"""`kind: late_interaction`: ColBERT against PyLate's `encode(is_query=…)` and `colbert_scores` (reference.json of
tiny-colbert) through the pipeline, TEI's /embed_all, /v1/embeddings/tokens, every rerank route (the cohere SDK's
v1 and v2 clients, Jina's and TEI's shapes, vLLM's /v1/score), the Hugging Face InferenceClient and the CLI."""

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
from rsinfer_cli.pipelines.late_interaction import LateInteractionOptions, LateInteractionPipeline

from serverutil import ServerThread

SERVE_MODES = ("single", "workers")
TOL = 1e-4      # the tolerance; measured ≤ 1e-6 on vectors and ≤ 4e-6 on scores


@pytest.fixture(scope="module")
def folder(shared_models):
    return shared_models / "tiny-colbert"


@pytest.fixture(scope="module")
def ref(folder) -> dict:
    return json.loads((folder / "reference.json").read_text())


def load(folder, **options) -> LateInteractionPipeline:
    return LateInteractionPipeline(load_model(ModelConfig(name="colbert", kind="late_interaction", path=str(folder),
                                                          replicas=1, options=LateInteractionOptions(**options))))


@pytest.fixture(scope="module")
def pipe(folder) -> LateInteractionPipeline:
    return load(folder)


def assert_vectors(got, want) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape                      # the same count of vectors per text
    np.testing.assert_allclose(got, want, atol=TOL)


def order(scores) -> list[int]:
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))


# ---------------------------------------------------------------- the pipeline


def test_query_and_document_vectors_match_pylate(pipe, ref):
    queries = pipe.vectors([q["query"] for q in ref["queries"]], is_query=True)
    for got, want, q in zip(queries.vectors, ref["query_vectors"], ref["queries"], strict=True):
        assert_vectors(got, want)
        assert len(got) == q["tokens"] == 32             # [MASK] expansion to query_length
    docs = pipe.vectors(ref["documents"])
    for got, want, n in zip(docs.vectors, ref["document_vectors"], ref["document_tokens"], strict=True):
        assert_vectors(got, want)
        assert len(got) == n                              # punctuation dropped
    np.testing.assert_allclose(np.linalg.norm(docs.vectors[0], axis=1), 1, atol=1e-6)


def test_maxsim_scores_and_order_match_pylate(pipe, ref):
    for q in ref["queries"]:
        res = pipe.rerank(q["query"], ref["documents"])
        np.testing.assert_allclose(res.scores, q["scores"], atol=TOL)
        assert order(res.scores) == order(q["scores"])
    pairs = pipe.run(pipe.plan_pairs([q["query"] for q in ref["queries"]], ref["documents"][:2]))
    np.testing.assert_allclose(pairs.scores, [ref["queries"][0]["scores"][0], ref["queries"][1]["scores"][1]],
                               atol=TOL)
    mean = load(pipe.model.resolved.graph_path.parent.parent, maxsim="mean")
    q = ref["queries"][0]
    np.testing.assert_allclose(mean.rerank(q["query"], ref["documents"]).scores, np.array(q["scores"]) / 32,
                               atol=TOL)
    assert mean.rerank(q["query"], ref["documents"], raw=True).scores[0] == pytest.approx(q["scores"][0], abs=TOL)


def test_the_folders_settings_and_what_overrides_them(folder, ref, pipe):
    info = pipe.describe()
    assert info["query_prefix"] == "[Q] " and info["query_length"] == 32 and info["document_length"] == 180
    assert info["settings_from"]["skiplist_words"] == "config_sentence_transformers.json"
    assert info["modules_run"] == ["Dense 32→16 Identity (1_Dense)"] and info["dimensions"] == 16
    text = ref["documents"][0]
    short = load(folder, query_length=8).vectors([ref["queries"][0]["query"]], is_query=True).vectors[0]
    assert len(short) == 8
    plain = load(folder, do_query_expansion=False).vectors(["how do I reset"], is_query=True).vectors[0]
    assert len(plain) == len(pipe.encoder.tokenizer.encode("how do I reset").ids) + 1   # + the [Q] prefix
    attended = load(folder, attend_to_expansion_tokens=True).vectors(["reset"], is_query=True).vectors[0]
    assert len(attended) == 32 and not np.allclose(attended, pipe.vectors(["reset"], is_query=True).vectors[0])
    every = load(folder, skiplist_words=()).vectors([text]).vectors[0]
    assert len(every) == len(pipe.vectors([text]).vectors[0]) + 2               # its comma and full stop kept
    none = load(folder, document_prefix="").vectors([text]).vectors[0]
    assert len(none) == len(pipe.vectors([text]).vectors[0]) - 1


def test_load_errors_name_what_is_wrong(folder, tmp_path):
    with pytest.raises(ModelLoadError, match=r"query_prefix '\[X\] ' \(config\) is not a token of its tokenizer"):
        load(folder, query_prefix="[X] ")
    copy = tmp_path / "odd"
    for f in folder.rglob("*"):
        if f.is_file() and f.name != "modules.json":
            (copy / f.relative_to(folder)).parent.mkdir(parents=True, exist_ok=True)
            (copy / f.relative_to(folder)).symlink_to(f)
    modules = json.loads((folder / "modules.json").read_text())
    (copy / "modules.json").write_text(json.dumps([*modules, {"idx": 2, "name": "2", "path": "",
                                                              "type": "sentence_transformers.models.Pooling"}]))
    with pytest.raises(ModelLoadError, match=r"module 2 \(sentence_transformers.models.Pooling\) is not one rsinfer"):
        load(copy)


def test_config_keys(folder):
    cfg = parse_config({"models": [{"name": "c", "kind": "late_interaction", "path": str(folder), "query_length": 16,
                                    "max_rerank_documents": 50, "skiplist_words": [".", ","]}]})
    assert cfg.models[0].options.query_length == 16 and cfg.models[0].options.skiplist_words == (".", ",")
    with pytest.raises(ConfigError, match=r"models\[0\]\.maxsim: must be one of sum, mean"):
        parse_config({"models": [{"name": "c", "kind": "late_interaction", "path": "x", "maxsim": "max"}]})
    with pytest.raises(ConfigError, match=r"models\[0\]\.query_length: applies to kind late_interaction only"):
        parse_config({"models": [{"name": "e", "kind": "embedding", "path": "x", "query_length": 3}]})


def test_the_folder_is_recognised(folder):
    from rsinfer_cli.hub import ModelSource, resolve

    r = resolve(ModelSource.of(ModelConfig(name="c", kind="late_interaction", path=str(folder)), True), None)
    assert families.guess_kind(families.Folder.read(r.aux, True)) == (
        "late_interaction", "config_sentence_transformers.json model_type: ColBERT")


# ---------------------------------------------------------------- the server


@pytest.fixture(scope="module")
def server(folder, serve_mode):
    cfg = parse_config({"server": {"max_texts": 8, "cache": {"backend": "memory"}},
                        "models": [{"name": "colbert", "kind": "late_interaction", "path": str(folder),
                                    "max_rerank_documents": 4}]})
    with ServerThread(cfg, mode=serve_mode) as srv:
        yield srv


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def test_tei_embed_all_and_token_embeddings(client, ref):
    docs = client.post("/embed_all", json={"inputs": ref["documents"]})
    assert docs.status_code == 200, docs.text
    for got, want in zip(docs.json(), ref["document_vectors"], strict=True):
        assert_vectors(got, want)
    queries = client.post("/v1/embeddings/tokens", json={"input": [q["query"] for q in ref["queries"]],
                                                          "is_query": True, "model": "colbert"})
    body = queries.json()
    assert body["object"] == "list" and body["model"] == "colbert" and body["usage"]["prompt_tokens"] > 0
    for item, want in zip(body["data"], ref["query_vectors"], strict=True):
        assert item["object"] == "token_embeddings"
        assert_vectors(item["embedding"], want)


def test_cohere_sdk_v1_and_v2_rerank(server, ref):
    import cohere

    q = ref["queries"][0]
    with httpx.Client(timeout=60) as transport:
        v1 = cohere.Client(api_key="unused", base_url=server.url, httpx_client=transport)
        res = v1.rerank(model="colbert", query=q["query"], documents=ref["documents"], return_documents=True)
        assert [r.index for r in res.results] == order(q["scores"])
        np.testing.assert_allclose([r.relevance_score for r in res.results], sorted(q["scores"], reverse=True),
                                   atol=TOL)
        assert res.results[0].document.text == ref["documents"][order(q["scores"])[0]]
        v2 = cohere.ClientV2(api_key="unused", base_url=server.url, httpx_client=transport)
        res2 = v2.rerank(model="colbert", query=q["query"], documents=ref["documents"], top_n=2)
        assert [r.index for r in res2.results] == order(q["scores"])[:2]


def test_jina_tei_and_vllm_rerank_shapes(client, ref):
    q = ref["queries"][1]
    jina = client.post("/v1/rerank", json={"query": q["query"], "documents": ref["documents"], "top_n": 3}).json()
    assert [r["index"] for r in jina["results"]] == order(q["scores"])[:3]     # the default rerank model
    np.testing.assert_allclose([r["relevance_score"] for r in jina["results"]],
                               sorted(q["scores"], reverse=True)[:3], atol=TOL)
    tei = client.post("/rerank", json={"query": q["query"], "texts": ref["documents"], "return_text": True}).json()
    assert [r["index"] for r in tei] == order(q["scores"]) and tei[0]["text"] == ref["documents"][tei[0]["index"]]
    score = client.post("/v1/score", json={"text_1": q["query"], "text_2": ref["documents"]}).json()
    np.testing.assert_allclose([d["score"] for d in score["data"]], q["scores"], atol=TOL)


def test_huggingface_inference_client(server, ref):
    from huggingface_hub import InferenceClient

    hf = InferenceClient(model=f"{server.url}/models/colbert")
    q = ref["queries"][0]
    np.testing.assert_allclose(hf.sentence_similarity(q["query"], other_sentences=ref["documents"]), q["scores"],
                               atol=TOL)
    assert_vectors(np.asarray(hf.feature_extraction(ref["documents"][2]))[0], ref["document_vectors"][2])


@pytest.mark.parametrize(("path", "body", "status", "param"), [
    ("/embed_all", {"inputs": []}, 400, "inputs"),
    ("/v1/embeddings/tokens", {"input": ["a"] * 9}, 413, "input"),
    ("/v1/embeddings/tokens", {"input": "a", "prompt_name": "nope"}, 400, "prompt_name"),
    ("/v1/rerank", {"query": "q", "documents": ["a"] * 5}, 413, "documents"),
    ("/v2/rerank", {"query": "q", "documents": []}, 400, "documents"),
    ("/embed", {"inputs": "a"}, 400, "model"),          # no embedding model: the ColBERT does not answer /embed
])
def test_bad_input_is_a_4xx_naming_the_field(client, path, body, status, param):
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


def test_cache_and_openapi(client):
    body = {"input": ["a text only this test sends"]}
    first, second = client.post("/v1/embeddings/tokens", json=body), client.post("/v1/embeddings/tokens", json=body)
    assert first.headers["x-rsinfer-cache"] == "miss" and second.headers["x-rsinfer-cache"] == "hit"
    assert first.json()["data"] == second.json()["data"]
    doc = client.get("/openapi.json").json()
    assert doc["paths"]["/embed_all"]["post"]["tags"] == ["late_interaction"]
    models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert models["colbert"]["pipeline"]["query_length"] == 32
    info = client.get("/info").json()          # TEI's: a token-vector model is an embedding model to TEI clients
    assert info["kind"] == "late_interaction" and info["model_type"]["embedding"]["dimensions"] == 16


@pytest.mark.shared
def test_a_cross_encoder_stays_the_default_reranker(folder, shared_models):
    """With a rerank model configured, it answers the rerank routes by default; the ColBERT answers when named."""
    cfg = parse_config({"models": [{"name": "colbert", "kind": "late_interaction", "path": str(folder)},
                                   {"name": "ce", "kind": "rerank", "path": str(shared_models / "tiny-reranker-1")}]})
    with ServerThread(cfg) as srv:
        default = httpx.post(f"{srv.url}/v1/rerank", json={"query": "q", "documents": ["a", "b"]}, timeout=30)
        named = httpx.post(f"{srv.url}/v1/rerank", json={"query": "q", "documents": ["a"], "model": "colbert"},
                           timeout=30)
    assert default.json()["model"] == "ce" and named.json()["model"] == "colbert"
    assert named.json()["results"][0]["relevance_score"] > 1          # a MaxSim sum, not a probability


# ---------------------------------------------------------------- the CLI


def test_cli_colbert_and_rerank(folder, ref, tmp_path):
    src = tmp_path / "docs.txt"
    src.write_text("".join(d + "\n" for d in ref["documents"]))
    out = subprocess.run([sys.executable, "-m", "rsinfer_cli", "colbert", "--path", str(folder), "--input", str(src)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    assert [x["index"] for x in lines] == list(range(len(ref["documents"])))
    for line, want in zip(lines, ref["document_vectors"], strict=True):
        assert_vectors(line["vectors"], want)
    q = ref["queries"][0]
    ranked = subprocess.run([sys.executable, "-m", "rsinfer_cli", "rerank", "--path", str(folder), "-q", q["query"],
                             "--input", str(src)], capture_output=True, text=True, timeout=120)
    assert ranked.returncode == 0, ranked.stderr
    rows = [json.loads(x) for x in ranked.stdout.splitlines()]
    assert [r["index"] for r in rows] == order(q["scores"])
    np.testing.assert_allclose([r["score"] for r in rows], sorted(q["scores"], reverse=True), atol=TOL)
