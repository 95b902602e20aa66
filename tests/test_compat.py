"""Clients that must work unmodified: Cohere embed (v1 and v2 SDK clients) and TEI's /info, /tokenize, /decode,
/similarity; exact values against the in-process pipeline."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest

from rsinfer_cli.config import parse_config

from serverutil import ServerThread

pytestmark = pytest.mark.shared
TEXTS = ["where is my parcel", "the cat sat on the mat"]


@pytest.fixture(scope="module")
def server(shared_models):
    cfg = parse_config({"models": [{"name": "mini", "kind": "embedding",
                                    "path": str(shared_models / "all-minilm-l6-v2"), "replicas": 1}]})
    with ServerThread(cfg) as srv:
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
    assert np.array_equal(np.array(e.int8), np.rint(vectors * 127))
    assert np.array_equal(np.array(e.uint8), np.rint((vectors + 1) * 127.5))
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
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "embedding_types"
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
