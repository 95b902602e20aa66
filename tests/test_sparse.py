"""`kind: sparse`: SPLADE against sentence-transformers' `SparseEncoder.encode` and `decode` (reference.json of
tiny-splade) through the pipeline, TEI's /embed_sparse, /v1/embeddings/sparse, the Hugging Face InferenceClient
(installed package) and `rsinfer sparse`; max_active_dims and top_k; forwards held to max_logits_mb."""

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
from rsinfer_cli.errors import ConfigError, InputError, ModelLoadError
from rsinfer_cli.pipelines.sparse import SparseOptions, SparsePipeline

from serverutil import ServerThread

SERVE_MODES = ("single", "workers")
TOL = 1e-4        # the tolerance; measured ≤ 3e-6 (reference.json rounds to 6 decimals)
MIN_WEIGHT = 1e-4  # weights at or below it may round away in the reference


@pytest.fixture(scope="module")
def folder(shared_models):
    return shared_models / "tiny-splade"


@pytest.fixture(scope="module")
def ref(folder) -> dict:
    return json.loads((folder / "reference.json").read_text())


def load(folder, **options) -> SparsePipeline:
    return SparsePipeline(load_model(ModelConfig(name="splade", kind="sparse", path=str(folder), replicas=1,
                                                 options=SparseOptions(**options))))


@pytest.fixture(scope="module")
def pipe(folder) -> SparsePipeline:
    return load(folder)


def assert_sparse(indices, values, case) -> None:
    """The same ids for weights above MIN_WEIGHT, every weight within TOL of the reference's."""
    got = dict(zip(np.asarray(indices).tolist(), np.asarray(values, dtype=np.float64).tolist(), strict=True))
    want = dict(zip(case["indices"], case["values"], strict=True))
    assert {i for i, v in got.items() if v > MIN_WEIGHT} == {i for i, v in want.items() if v > MIN_WEIGHT}
    for i in set(got) | set(want):
        assert abs(got.get(i, 0.0) - want.get(i, 0.0)) <= TOL, i


# ---------------------------------------------------------------- the pipeline


def test_encode_matches_sparse_encoder(pipe, ref):
    res = pipe.encode([c["text"] for c in ref["cases"]])
    for i, case in enumerate(ref["cases"]):
        ids, values = res.rows[i]
        assert np.all(np.diff(ids) > 0)                 # ascending ids, as SparseEncoder's sparse tensor
        assert_sparse(ids, values, case)
        top = res.top_tokens(i, 10)                     # SparseEncoder.decode
        assert [t for t, _ in top] == [t for t, _ in case["top_tokens"]]
        np.testing.assert_allclose([w for _, w in top], [w for _, w in case["top_tokens"]], atol=TOL)
    assert ref["max_active_dims"] is None and pipe.max_active_dims is None


def test_a_long_text_is_truncated_as_sentence_transformers_truncates(pipe, ref):
    long = next(c for c in ref["cases"] if len(c["text"].split()) > 256)
    assert len(pipe.encoder.tokenizer.encode(long["text"]).ids) > 300
    res = pipe.encode([long["text"]])
    assert res.truncated == 1 and res.tokens == 256          # tokenizer_config.json model_max_length
    assert_sparse(*res.rows[0], long)
    with pytest.raises(InputError, match=r"input\[0\] has \d+ tokens but max_len is 256"):
        pipe.encode([long["text"]], truncate=False)


def test_the_folders_splade_pooling_and_what_overrides_it(pipe, folder, ref):
    assert pipe.describe()["splade"] == {"pooling_strategy": "max", "activation_function": "relu",
                                         "from": "1_SpladePooling/config.json"}
    text = ref["cases"][0]["text"]
    summed = load(folder, splade_pooling="sum").encode([text])
    twice = load(folder, splade_activation="log1p_relu").encode([text])
    base = pipe.encode([text])
    # sum ≥ max for non-negative weights over the same ids; log1p_relu is log1p of the relu weights
    ids, values = base.rows[0]
    s = dict(zip(*[a.tolist() for a in summed.rows[0]], strict=True))
    assert all(s[i] >= v - 1e-6 for i, v in zip(ids.tolist(), values.tolist(), strict=True))
    np.testing.assert_allclose(twice.rows[0][1], np.log1p(values), rtol=1e-6)
    assert "splade_pooling in config" in load(folder, splade_pooling="sum").describe()["splade"]["from"]


def test_max_active_dims_and_top_k(folder, pipe, ref):
    case = ref["cases"][1]
    k5 = load(folder, max_active_dims=5)
    ids, values = k5.encode([case["text"]]).rows[0]
    want = dict(zip(case["indices"], case["values"], strict=True))
    assert ids.tolist() == sorted(sorted(want, key=lambda i: -want[i])[:5])   # the 5 largest, in id order
    np.testing.assert_allclose(values, [want[i] for i in ids.tolist()], atol=TOL)
    # a request's top_k keeps fewer; never more than the model's max_active_dims
    assert len(k5.encode([case["text"]], top_k=3).rows[0][0]) == 3
    assert len(k5.encode([case["text"]], top_k=50).rows[0][0]) == 5
    assert len(pipe.encode([case["text"]], top_k=7).rows[0][0]) == 7
    with pytest.raises(InputError, match="`top_k` must be at least 1"):
        pipe.encode(["a"], top_k=0)


def test_max_active_dims_from_the_folders_config(folder, tmp_path):
    """config_sentence_transformers.json's max_active_dims applies unless the model entry sets its own."""
    copy = tmp_path / "splade"
    copy.mkdir()
    for f in folder.rglob("*"):
        if f.is_file():
            (copy / f.relative_to(folder)).parent.mkdir(parents=True, exist_ok=True)
            (copy / f.relative_to(folder)).symlink_to(f)
    st = json.loads((folder / "config_sentence_transformers.json").read_text())
    (copy / "config_sentence_transformers.json").unlink()
    (copy / "config_sentence_transformers.json").write_text(json.dumps({**st, "max_active_dims": 12}))
    assert load(copy).max_active_dims == 12 and len(load(copy).encode(["hello"]).rows[0][0]) == 12
    assert load(copy, max_active_dims=4).max_active_dims == 4


def test_forwards_hold_their_logits_to_max_logits_mb(folder, ref):
    """No forward's [rows, tokens, vocab] float32 passes its share of max_logits_mb, unless one text alone does."""
    small = load(folder, max_logits_mb=2)           # 2 MiB / (4 B × 30522) = 17 tokens per forward (one lane)
    assert small.model.replicas == 1 and small.max_tokens == 2 * (1 << 20) // (4 * 30522) == 17
    two = SparsePipeline(load_model(ModelConfig(name="s2", kind="sparse", path=str(folder), replicas=2,
                                                options=SparseOptions(max_logits_mb=2))))
    assert two.max_tokens == 8                      # two forwards at once share the budget
    shapes = []
    run = small.model.run

    def spy(session, feeds, outputs=None):
        shapes.append(feeds["input_ids"].shape)
        return run(session, feeds, outputs)

    small.model.run = spy
    texts = [c["text"] for c in ref["cases"]] * 3
    res = small.encode(texts)
    assert all(rows * width * 30522 * 4 <= 2 << 20 or rows == 1 for rows, width in shapes), shapes
    assert len(shapes) > 3            # the budget split the request
    for i, text in enumerate(texts):
        case = next(c for c in ref["cases"] if c["text"] == text)
        assert_sparse(*res.rows[i], case)
    assert load(folder).max_tokens == 512       # on CPU, batching's own 512 tokens are within the 256 MiB default


def test_config_keys_and_load_errors(folder, tmp_path):
    cfg = parse_config({"models": [{"name": "s", "kind": "sparse", "path": str(folder), "max_active_dims": 64,
                                    "prompts": {"query": "q: "}}]})
    assert cfg.models[0].options.max_active_dims == 64 and cfg.models[0].options.prompts == {"query": "q: "}
    with pytest.raises(ConfigError, match=r"models\[0\]\.splade_pooling: must be one of auto, max, sum"):
        parse_config({"models": [{"name": "s", "kind": "sparse", "path": "x", "splade_pooling": "mean"}]})
    with pytest.raises(ConfigError, match=r"models\[0\]\.max_active_dims: applies to kind sparse only"):
        parse_config({"models": [{"name": "e", "kind": "embedding", "path": "x", "max_active_dims": 3}]})
    # a module rsinfer would not compute is refused at load, with the module named
    copy = tmp_path / "odd"
    copy.mkdir()
    for f in folder.rglob("*"):
        if f.is_file() and f.name != "modules.json":
            (copy / f.relative_to(folder)).parent.mkdir(parents=True, exist_ok=True)
            (copy / f.relative_to(folder)).symlink_to(f)
    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "", "type": "sentence_transformers.sparse_encoder.modules."
                                                               "SparseStaticEmbedding"})
    (copy / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ModelLoadError, match=r"module 2 \(.*SparseStaticEmbedding\) is not one rsinfer computes"):
        load(copy)


def test_the_folder_is_recognised_as_sparse(folder):
    from rsinfer_cli.hub import ModelSource, resolve

    r = resolve(ModelSource.of(ModelConfig(name="s", kind="sparse", path=str(folder)), True), None)
    kind, why = families.guess_kind(families.Folder.read(r.aux, True))
    assert kind == "sparse" and "SparseEncoder" in why
    # config.json alone says BertForMaskedLM: without the sentence-transformers files it is not guessed sparse
    assert families.guess_kind(families.Folder(json.loads((folder / "config.json").read_text())))[0] != "sparse"


# ---------------------------------------------------------------- the server


@pytest.fixture(scope="module")
def server(folder, shared_models, serve_mode):
    cfg = parse_config({"server": {"max_texts": 8, "max_text_chars": 4000, "cache": {"backend": "memory"}},
                        "models": [{"name": "splade", "kind": "sparse", "path": str(folder)},
                                   {"name": "emb", "kind": "embedding",
                                    "path": str(shared_models / "all-minilm-l6-v2")}]})
    with ServerThread(cfg, mode=serve_mode) as srv:
        yield srv


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def test_tei_embed_sparse(client, ref):
    cases = ref["cases"]
    r = client.post("/embed_sparse", json={"inputs": [c["text"] for c in cases]})
    assert r.status_code == 200, r.text
    assert r.headers["x-rsinfer-truncated"] == "1"              # the long case
    for got, case in zip(r.json(), cases, strict=True):
        assert_sparse([x["index"] for x in got], [x["value"] for x in got], case)
    one = client.post("/embed_sparse", json={"inputs": cases[0]["text"], "truncation_direction": "Right"}).json()
    assert len(one) == 1 and len(one[0]) == len(cases[0]["indices"])


def test_rsinfer_sparse_route(client, ref):
    cases = ref["cases"][:3]
    r = client.post("/v1/embeddings/sparse", json={"input": [c["text"] for c in cases], "model": "splade",
                                                   "return_tokens": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == "splade" and body["usage"]["prompt_tokens"] > 0
    for item, case in zip(body["data"], cases, strict=True):
        assert item["object"] == "sparse_embedding"
        assert_sparse(item["indices"], item["values"], case)
        weight = dict(zip(item["tokens"], item["values"], strict=True))     # each index's vocabulary token
        for token, w in case["top_tokens"]:
            assert weight[token] == pytest.approx(w, abs=TOL)
    top = client.post("/v1/embeddings/sparse", json={"input": cases[0]["text"], "top_k": 4}).json()["data"][0]
    assert len(top["indices"]) == 4 and "tokens" not in top
    assert sorted(top["values"], reverse=True)[0] == pytest.approx(cases[0]["top_tokens"][0][1], abs=TOL)


def test_huggingface_inference_client(server, pipe, ref):
    from huggingface_hub import InferenceClient

    hf = InferenceClient(model=f"{server.url}/models/splade")
    case = ref["cases"][0]
    vec = np.asarray(hf.feature_extraction(case["text"]))
    assert vec.shape == (1, 30522)
    nz = np.flatnonzero(vec[0])
    assert_sparse(nz, vec[0][nz], case)
    texts = [c["text"] for c in ref["cases"][:3]]
    scores = hf.sentence_similarity(texts[0], other_sentences=texts[1:])
    dense = pipe.encode(texts).dense(30522)
    np.testing.assert_allclose(scores, dense[1:] @ dense[0], rtol=1e-5)   # SparseEncoder's dot product


@pytest.mark.parametrize(("path", "body", "status", "param"), [
    ("/embed_sparse", {"inputs": []}, 400, "inputs"),
    ("/embed_sparse", {"inputs": ["a"] * 9}, 413, "inputs"),
    ("/v1/embeddings/sparse", {"input": ["x" * 4001]}, 413, "input[0]"),
    ("/v1/embeddings/sparse", {"input": "a", "top_k": 0}, 400, "top_k"),
    ("/v1/embeddings/sparse", {"input": "a", "prompt_name": "nope"}, 400, "prompt_name"),
    ("/v1/embeddings/sparse", {"input": "a", "model": "emb"}, 400, "model"),
    ("/v1/embeddings/sparse", {"input": 3}, 422, "input"),
    ("/models/splade", {"inputs": "a", "parameters": {"top_k": "x"}}, 422, "top_k"),
])
def test_bad_input_is_a_4xx_naming_the_field(client, path, body, status, param):
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


def test_cache_info_and_openapi(client):
    body = {"input": ["a text only this test sends"]}
    first, second = client.post("/v1/embeddings/sparse", json=body), client.post("/v1/embeddings/sparse", json=body)
    assert first.headers["x-rsinfer-cache"] == "miss" and second.headers["x-rsinfer-cache"] == "hit"
    assert first.json()["data"] == second.json()["data"]
    doc = client.get("/openapi.json").json()
    assert doc["paths"]["/embed_sparse"]["post"]["tags"] == ["sparse"] and "/v1/embeddings/sparse" in doc["paths"]
    models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert models["splade"]["pipeline"]["splade"]["pooling_strategy"] == "max"


# ---------------------------------------------------------------- the CLI


def test_cli_sparse_jsonl_in_order(folder, ref, tmp_path):
    src = tmp_path / "in.jsonl"
    cases = ref["cases"]
    src.write_text("".join(json.dumps({"id": i, "body": c["text"]}) + "\n" for i, c in enumerate(cases)))
    out = subprocess.run([sys.executable, "-m", "rsinfer_cli", "sparse", "--path", str(folder), "--input", str(src),
                          "--field", "body", "--batch-size", "2", "--tokens"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    assert [x["id"] for x in lines] == list(range(len(cases))) == [x["index"] for x in lines]
    for line, case in zip(lines, cases, strict=True):
        assert_sparse(line["indices"], line["values"], case)
        assert len(line["tokens"]) == len(line["indices"])
    bad = subprocess.run([sys.executable, "-m", "rsinfer_cli", "sparse", "--path", str(folder), "--top-k", "0", "x"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--top-k must be >= 1" in bad.stderr

