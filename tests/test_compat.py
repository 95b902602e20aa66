"""Clients that must work unmodified: Cohere embed (v1 and v2 SDK clients) and TEI's /info, /tokenize, /decode,
/similarity; exact values against the in-process pipeline."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest

from rsinfer_cli.config import parse_config

from serverutil import ServerThread

SERVE_MODES = ("single", "workers")  # every test here also runs against the front-end/engine split

pytestmark = pytest.mark.shared
TEXTS = ["where is my parcel", "the cat sat on the mat"]


@pytest.fixture(scope="module")
def server(shared_models, serve_mode):
    cfg = parse_config({"models": [{"name": "mini", "kind": "embedding",
                                    "path": str(shared_models / "all-minilm-l6-v2"), "replicas": 1}]})
    with ServerThread(cfg, mode=serve_mode) as srv:
        yield srv


@pytest.fixture(scope="module")
def vectors(server) -> np.ndarray:
    r = httpx.post(server.url + "/v1/embeddings", json={"input": TEXTS, "encoding_format": "float"})
    return np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)


def test_cohere_v2_embed_every_type(server, vectors):
    import cohere

    with httpx.Client() as http:
        co = cohere.ClientV2(api_key="unused", base_url=server.url, httpx_client=http)
        r = co.embed(model="mini", texts=TEXTS, input_type="search_document",
                     embedding_types=["float", "int8", "uint8", "binary", "ubinary", "base64"])
    e = r.embeddings
    assert np.array_equal(np.array(e.float_, dtype=np.float32), vectors)
    # sentence-transformers' quantize_embeddings with ranges [-1, 1] (tests/test_outtypes.py checks it against the
    # library's own output)
    scaled = np.clip(np.floor((vectors - np.float32(-1)) / (np.float32(2) / np.float32(255))), 0, 255)
    assert np.array_equal(np.array(e.int8), scaled - 128)
    assert np.array_equal(np.array(e.uint8), scaled)
    bits = np.packbits(vectors > 0, axis=1)
    assert np.array_equal(np.array(e.ubinary), bits) and np.array_equal(np.array(e.binary), bits.astype(int) - 128)
    assert np.array_equal(np.frombuffer(base64.b64decode(e.base64[0]), "<f4"), vectors[0])
    assert r.texts == TEXTS and r.meta.billed_units.input_tokens > 0


def test_cohere_v1_embed_and_options(server, vectors):
    import cohere

    with httpx.Client() as http:
        r = cohere.Client(api_key="unused", base_url=server.url, httpx_client=http).embed(
            model="mini", texts=TEXTS, input_type="search_query")
    assert np.array_equal(np.array(r.embeddings, dtype=np.float32), vectors)  # v1 without types: float lists
    small = httpx.post(server.url + "/v2/embed", json={"texts": TEXTS, "input_type": "search_query",
                                                       "output_dimension": 64, "embedding_types": ["float"]})
    assert len(small.json()["embeddings"]["float"][0]) == 64
    bad = httpx.post(server.url + "/v2/embed", json={"texts": TEXTS, "embedding_types": ["int4"]})
    assert bad.status_code == 400 and bad.json()["error"]["param"].startswith("embedding_types")
    assert httpx.post(server.url + "/v2/embed", json={}).status_code == 422
    long = httpx.post(server.url + "/v2/embed", json={"texts": ["word " * 400], "truncate": "NONE"})
    assert long.status_code == 400 and "max_len is 256" in long.json()["error"]["message"]


def test_tei_info_tokenize_decode_similarity(server, vectors):
    info = httpx.get(server.url + "/info").json()
    assert info["model_id"] == "mini" and info["kind"] == "embedding" and info["max_input_length"] == 256
    assert info["model_type"]["embedding"]["pooling"] == "mean" and info["max_client_batch_size"] == 2048
    tokens = httpx.post(server.url + "/tokenize", json={"inputs": ["Hello world"]}).json()[0]
    assert [t["text"] for t in tokens] == ["[CLS]", "hello", "world", "[SEP]"]
    assert [t["special"] for t in tokens] == [True, False, False, True] and tokens[2]["start"] == 6
    ids = [t["id"] for t in tokens]
    assert httpx.post(server.url + "/decode", json={"ids": ids}).json() == ["hello world"]
    assert httpx.post(server.url + "/decode", json={"ids": [ids, ids[:2]], "skip_special_tokens": False}).json() \
        == ["[CLS] hello world [SEP]", "[CLS] hello"]
    assert httpx.post(server.url + "/decode", json={"ids": [10**9]}).status_code == 400
    sims = httpx.post(server.url + "/similarity", json={"inputs": {"source_sentence": TEXTS[0],
                                                                   "sentences": TEXTS}}).json()
    assert sims == pytest.approx([1.0, float(vectors[1] @ vectors[0])], abs=1e-6)


@pytest.fixture(scope="module")
def four(shared_models, serve_mode):
    cfg = parse_config({"models": [
        {"name": "mini", "kind": "embedding", "path": str(shared_models / "all-minilm-l6-v2"), "replicas": 1},
        {"name": "rr", "kind": "rerank", "path": str(shared_models / "tiny-reranker-1"), "replicas": 1},
        {"name": "pii", "kind": "pii", "path": str(shared_models / "rampart-pii"), "replicas": 1},
        {"name": "nli", "kind": "zeroshot", "path": str(shared_models / "tiny-nli"), "replicas": 1}]})
    with ServerThread(cfg, mode=serve_mode) as srv:
        yield srv


def hf(srv, name: str):
    from huggingface_hub import InferenceClient

    return InferenceClient(model=f"{srv.url}/models/{name}")


def test_huggingface_inference_client_every_task(four):
    """The real huggingface_hub.InferenceClient, pointed at /models/NAME: the answers equal rsinfer's own routes."""
    emb = np.asarray(hf(four, "mini").feature_extraction("where is my parcel"))
    own = httpx.post(four.url + "/v1/embeddings", json={"model": "mini", "input": ["where is my parcel"],
                                                        "encoding_format": "float"}).json()["data"][0]["embedding"]
    assert emb.shape == (1, 384) and np.array_equal(emb[0].astype(np.float32), np.array(own, dtype=np.float32))
    sims = hf(four, "mini").sentence_similarity("a cat", ["a cat", "tax law"])
    assert sims[0] == pytest.approx(1.0, abs=1e-6) and sims[1] < 0.5
    scores = hf(four, "rr").sentence_similarity("where is my parcel", ["it shipped", "cats"])
    ranked = httpx.post(four.url + "/v1/rerank", json={"model": "rr", "query": "where is my parcel",
                                                       "documents": ["it shipped", "cats"]}).json()["results"]
    assert scores == pytest.approx([r["relevance_score"] for r in sorted(ranked, key=lambda r: r["index"])],
                                   abs=1e-9)
    ents = hf(four, "pii").token_classification("Mail alex.rivera@example.com now")
    assert [(e.entity_group, e.word, e.start, e.end) for e in ents] == [("EMAIL", "alex.rivera@example.com", 5, 28)]
    zs = hf(four, "nli").zero_shot_classification("my parcel is late", ["shipping", "food"])
    own_zs = httpx.post(four.url + "/classify/zero-shot", json={"model": "nli", "input": "my parcel is late",
                                                                "candidate_labels": ["shipping", "food"]}).json()
    assert [e.label for e in zs] == own_zs["labels"]
    assert [e.score for e in zs] == pytest.approx(own_zs["scores"], abs=1e-9)


def test_per_model_base_url_has_tei_info_health_and_routes(four):
    """/models/NAME is a model's base URL: huggingface_hub's get_endpoint_info() and health_check() read TEI's /info
    and /health under it, and TEI's own routes answer under it as at the root for that model."""
    from huggingface_hub import InferenceClient

    def endpoint(name: str) -> InferenceClient:     # these two calls are the hf-inference provider's (a URL's)
        return InferenceClient(model=f"{four.url}/models/{name}", provider="hf-inference")

    info = endpoint("rr").get_endpoint_info()
    assert info["model_id"] == "rr" and info["kind"] == "rerank"
    assert endpoint("mini").health_check() and endpoint("pii").get_endpoint_info()["model_id"] == "pii"
    assert httpx.get(four.url + "/models/nope/health").status_code == 404
    assert httpx.get(four.url + "/models/nope/info").status_code == 404
    embed = httpx.post(four.url + "/models/mini/embed", json={"inputs": ["a cat"]})
    assert embed.status_code == 200
    root = httpx.post(four.url + "/v1/embeddings", json={"model": "mini", "input": ["a cat"]}).json()
    assert np.allclose(embed.json()[0], root["data"][0]["embedding"], atol=1e-6)
    ranked = httpx.post(four.url + "/models/rr/rerank", json={"query": "parcel", "texts": ["it shipped", "cats"]})
    assert ranked.status_code == 200 and sorted(r["index"] for r in ranked.json()) == [0, 1]
    tokens = httpx.post(four.url + "/models/mini/tokenize", json={"inputs": "a cat"})
    assert tokens.status_code == 200 and tokens.json()[0][0]["text"]
    wrong = httpx.post(four.url + "/models/rr/embed", json={"inputs": ["a"]})
    assert wrong.status_code == 400 and "is a rerank model" in wrong.json()["error"]["message"]


def test_root_post_needs_a_single_model(four, server):
    r = httpx.post(four.url + "/", json={"inputs": "x"})
    assert r.status_code == 400 and "/models/{name}" in r.json()["error"]["message"]
    one = httpx.post(server.url + "/", json={"inputs": ["a", "b"]})
    assert one.status_code == 200 and np.asarray(one.json()).shape == (2, 384)
    assert httpx.post(four.url + "/models/nope", json={"inputs": "x"}).status_code == 404
    assert httpx.post(four.url + "/models/nli", json={"inputs": "x"}).status_code == 422  # no candidate_labels


@pytest.fixture(scope="module")
def limited(shared_models, serve_mode):
    cfg = parse_config({"server": {"max_rerank_documents": 3, "max_candidate_labels": 2, "max_texts": 100},
                        "models": [
        {"name": "rr", "kind": "rerank", "path": str(shared_models / "tiny-reranker-1"), "replicas": 1},
        {"name": "nli", "kind": "zeroshot", "path": str(shared_models / "tiny-nli"), "replicas": 1}]})
    with ServerThread(cfg, mode=serve_mode) as srv:
        yield srv


def test_hugging_face_routes_apply_each_familys_own_limits(limited):
    """/models/{name} checks what the family's own routes check: rerank documents against max_rerank_documents
    (not max_texts), zero-shot labels against max_candidate_labels, blanks and duplicates."""
    def both(hf_body: dict, own_route: str, own_body: dict) -> tuple[httpx.Response, httpx.Response]:
        return (httpx.post(limited.url + hf_body.pop("_to"), json=hf_body),
                httpx.post(limited.url + own_route, json=own_body))

    docs = ["a", "b", "c", "d"]
    hf_r, own = both({"_to": "/models/rr", "inputs": {"source_sentence": "q", "sentences": docs}},
                     "/v1/rerank", {"model": "rr", "query": "q", "documents": docs})
    assert hf_r.status_code == own.status_code == 413
    assert "(max_rerank_documents)" in hf_r.json()["error"]["message"]
    ok = httpx.post(limited.url + "/models/rr", json={"inputs": {"source_sentence": "q", "sentences": docs[:3]}})
    assert ok.status_code == 200 and len(ok.json()) == 3
    for labels, says in ((["a", "b", "c"], "(max_candidate_labels)"), (["a", "a"], "duplicates"),
                         (["a", " "], "is blank"), ([], "is empty")):
        hf_r, own = both({"_to": "/models/nli", "inputs": "text", "parameters": {"candidate_labels": labels}},
                         "/classify/zero-shot", {"model": "nli", "input": "text", "candidate_labels": labels})
        assert hf_r.status_code == own.status_code == 400, (labels, hf_r.text, own.text)
        assert says in hf_r.json()["error"]["message"] and says in own.json()["error"]["message"]
