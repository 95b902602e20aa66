"""BGE-M3 (`kind: m3`) against FlagEmbedding's own outputs for tiny-bge-m3 (reference.json: dense vectors, lexical
weights, ColBERT vectors of 15 texts, compute_score of 12 pairs under two weightings), from the transformer graph
plus the heads (safetensors and BAAI's .pt) and from the graph with the heads baked in; through the API, every
route the family serves, one forward for all three outputs, the row cache, and what it refuses."""

from __future__ import annotations

import json
import pickle
import zipfile

import numpy as np
import pytest

from rsinfer_cli.errors import ModelLoadError
from rsinfer_cli.pipelines.tensorfile import TensorFileError, read_tensors

pytestmark = pytest.mark.shared
TOL = 1e-4


@pytest.fixture(scope="module")
def ref(shared_models):
    return json.loads((shared_models / "tiny-bge-m3" / "reference.json").read_text(encoding="utf-8"))


def _cases(ref):
    return [c for group in ("texts", "queries", "passages") for c in ref[group]]


def _lexical_dict(ids, weights):
    return dict(zip(map(str, ids.tolist()), weights.tolist(), strict=True))


def _same_lexical(got: dict, want: dict, where):
    """The same ids above 1e-4, weights within 1e-4."""
    assert {k for k, v in got.items() if v > TOL} == {k for k, v in want.items() if v > TOL}, where
    assert all(abs(got.get(k, 0.0) - want.get(k, 0.0)) <= TOL for k in {*got, *want}), where


@pytest.fixture(scope="module", params=["heads", "heads-pt", "graph"])
def m3(shared_models, request, tmp_path_factory):
    """The model three ways: onnx/model.onnx + safetensors heads, + BAAI's .pt heads only, onnx/model_m3.onnx."""
    import rsinfer_cli

    src = shared_models / "tiny-bge-m3"
    if request.param == "heads-pt":          # a folder as BAAI ships it: no safetensors heads
        folder = tmp_path_factory.mktemp("m3pt") / "tiny-bge-m3"
        for f in src.rglob("*"):
            if f.is_file() and not f.name.endswith(".safetensors"):
                (folder / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
                (folder / f.relative_to(src)).symlink_to(f)
        model = rsinfer_cli.load(folder)
    else:
        model = rsinfer_cli.load(src, **({"file": "onnx/model_m3.onnx"} if request.param == "graph" else {}))
    with model:
        yield model


def test_every_output_is_flagembeddings(m3, ref):
    pipe = m3.pipeline
    assert pipe.kind == "m3" and pipe.describe()["colbert_dim"] == 32
    cases = _cases(ref)
    res = pipe.run(pipe.plan_m3([c["text"] for c in cases], sparse=True, colbert=True))
    for i, c in enumerate(cases):
        where = repr(c["text"][:40])
        assert np.abs(res.dense[i] - np.array(c["dense_vecs"])).max() <= TOL, where
        ids, weights = res.lexical[i]
        _same_lexical(_lexical_dict(ids, weights), c["lexical_weights"], where)
        want = np.array(c["colbert_vecs"], dtype=np.float32).reshape(-1, 32)
        assert res.colbert[i].shape == want.shape == (c["num_tokens"] - 1, 32), where
        assert np.abs(res.colbert[i] - want).max(initial=0) <= TOL, where
        _same_lexical(pipe.convert_id_to_token(ids, weights), c["convert_id_to_token"], where)


def test_compute_score_and_rerank_are_flagembeddings(m3, ref):
    pipe = m3.pipeline
    queries = [ref["queries"][p["query_index"]]["text"] for p in ref["pairs"]]
    passages = [ref["passages"][p["passage_index"]]["text"] for p in ref["pairs"]]
    for weights, key in (((1, 1, 1), "compute_score_default"), ((0.4, 0.2, 0.4), "compute_score_other")):
        got = pipe.run(pipe.plan_scores(queries, passages, weights=weights)).scores
        for i, pair in enumerate(ref["pairs"]):
            for mode, want in pair[key].items():
                assert abs(got[mode][i] - want) <= TOL, (key, i, mode)
            assert abs(got["sparse"][i] - pair["lexical_matching_score"]) <= TOL
    ranked = pipe.run(pipe.plan_rerank(queries[0], passages[:4])).scores
    assert np.allclose(ranked, [p["compute_score_default"]["colbert+sparse+dense"] for p in ref["pairs"][:4]],
                       atol=TOL)


def test_a_folder_with_both_heads_is_recognised(shared_models):
    from rsinfer_cli import families
    from rsinfer_cli.families import Folder

    folder = shared_models / "tiny-bge-m3"
    aux = {name: folder / name for name in families.aux_files() if (folder / name).exists()}
    assert families.guess_kind(Folder.read(aux, True))[0] == "m3"


# ---------------------------------------------------------------- the routes


@pytest.fixture(scope="module")
def m3_server(shared_models):
    import httpx

    from rsinfer_cli.config import parse_config

    from serverutil import ServerThread

    folder = str(shared_models / "tiny-bge-m3")
    cfg = parse_config({"server": {"cache": {"backend": "memory"}}, "models": [
        {"name": "m3", "kind": "m3", "path": folder, "replicas": 1},
        {"name": "m3-graph", "kind": "m3", "path": folder, "file": "onnx/model_m3.onnx", "replicas": 1,
         "m3_score": "dense", "cache": False}]})
    with ServerThread(cfg) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        yield c


def test_every_route_serves_its_part(m3_server, ref):
    texts = ref["texts"]
    inputs = [c["text"] for c in texts]
    for model in ("m3", "m3-graph"):
        r = m3_server.post("/v1/embeddings/m3", json={"model": model, "input": inputs, "return_sparse": True,
                                                      "return_colbert_vecs": True, "return_tokens": True})
        assert r.status_code == 200, r.text
        for c, item in zip(texts, r.json()["data"], strict=True):
            assert np.abs(np.array(item["dense_vecs"]) - c["dense_vecs"]).max() <= TOL
            _same_lexical(item["lexical_weights"], c["lexical_weights"], c["text"][:30])
            _same_lexical(item["lexical_tokens"], c["convert_id_to_token"], c["text"][:30])
            assert np.abs(np.array(item["colbert_vecs"]).reshape(-1, 32) -
                          np.array(c["colbert_vecs"]).reshape(-1, 32)).max(initial=0) <= TOL
        dense = [m3_server.post("/v1/embeddings", json={"model": model, "input": inputs}).json()["data"][i]["embedding"]
                 for i in range(1)]
        assert np.abs(np.array(dense[0]) - texts[0]["dense_vecs"]).max() <= TOL
        hf = m3_server.post(f"/models/{model}", json={"inputs": inputs[0]}).json()      # feature-extraction
        assert np.abs(np.array(hf) - texts[0]["dense_vecs"]).max() <= TOL
        tei = m3_server.post(f"/models/{model}/embed", json={"inputs": inputs}).json()
        assert np.abs(np.array(tei) - np.array([c["dense_vecs"] for c in texts])).max() <= TOL
        sparse = m3_server.post("/v1/embeddings/sparse", json={"model": model, "input": inputs}).json()["data"]
        for c, item in zip(texts, sparse, strict=True):
            assert item["indices"] == sorted(item["indices"])           # the sparse routes: ids ascending
            _same_lexical(dict(zip(map(str, item["indices"]), item["values"], strict=True)), c["lexical_weights"],
                          c["text"][:30])
        tei_sparse = m3_server.post(f"/models/{model}/embed_sparse", json={"inputs": inputs[0]}).json()[0]
        _same_lexical({str(x["index"]): x["value"] for x in tei_sparse}, texts[0]["lexical_weights"], "tei")
        vecs = m3_server.post(f"/models/{model}/embed_all", json={"inputs": inputs}).json()
        for c, v in zip(texts, vecs, strict=True):
            assert np.abs(np.array(v).reshape(-1, 32) - np.array(c["colbert_vecs"]).reshape(-1, 32)).max(
                initial=0) <= TOL


def test_the_rerank_and_score_routes_give_compute_score(m3_server, ref):
    pairs = ref["pairs"]
    queries = [ref["queries"][p["query_index"]]["text"] for p in pairs]
    passages = [ref["passages"][p["passage_index"]]["text"] for p in pairs]
    body = {"model": "m3", "pairs": [list(x) for x in zip(queries, passages, strict=True)], "weights": [0.4, 0.2, 0.4]}
    r = m3_server.post("/v1/m3/score", json=body)
    assert r.status_code == 200, r.text
    body = r.json()
    for i, p in enumerate(pairs):
        want = p["compute_score_other"]
        assert abs(body["colbert_sparse_dense"][i] - want["colbert+sparse+dense"]) <= TOL
        assert abs(body["sparse_dense"][i] - want["sparse+dense"]) <= TOL
        assert abs(body["dense"][i] - p["dense_score"]) <= TOL and abs(body["colbert"][i] - p["colbert_score"]) <= TOL
    first = [i for i, p in enumerate(pairs) if p["query_index"] == 0]
    docs = [passages[i] for i in first]
    cohere = m3_server.post("/v2/rerank", json={"model": "m3", "query": queries[first[0]], "documents": docs})
    assert cohere.status_code == 200, cohere.text
    got = {x["index"]: x["relevance_score"] for x in cohere.json()["results"]}
    assert all(abs(got[k] - pairs[i]["compute_score_default"]["colbert+sparse+dense"]) <= TOL
               for k, i in enumerate(first))
    tei = m3_server.post("/models/m3-graph/rerank", json={"query": queries[first[0]], "texts": docs}).json()
    assert all(abs(x["score"] - pairs[first[x["index"]]]["dense_score"]) <= TOL for x in tei)   # m3_score: dense


def test_all_three_outputs_are_one_forward_and_one_cached_row(m3_server):
    """A request for all three runs each text's row once (rows and forwards counted by the batching metrics), and
    a later request for another output of the same text is answered from the cache."""
    import re

    def counts():
        text = m3_server.get("/metrics").text
        rows = re.search(r'rsinfer_batch_rows_sum\{model="m3",version=""\} (\S+)', text)
        return float(rows.group(1)) if rows else 0.0

    texts = ["one forward for three outputs", "and a second text", "a third"]
    before = counts()
    r = m3_server.post("/v1/embeddings/m3", json={"model": "m3", "input": texts, "return_sparse": True,
                                                  "return_colbert_vecs": True})
    assert r.status_code == 200 and r.headers["x-rsinfer-cache"] == "miss"
    assert counts() - before == 3
    again = m3_server.post("/v1/embeddings/sparse", json={"model": "m3", "input": texts})
    assert again.headers["x-rsinfer-cache"] == "hit" and counts() - before == 3


@pytest.mark.parametrize(("route", "body", "param"), [
    ("/v1/embeddings/m3", {"input": "x", "return_dense": False}, "return_dense"),
    ("/v1/m3/score", {"pairs": [["q", "p"]], "weights": [0, 0, 0]}, "weights"),
    ("/v1/m3/score", {"pairs": [["q", "p"]], "weights": [1, 1]}, "weights"),
    ("/v1/embeddings", {"input": "x", "dimensions": 8}, "dimensions"),
    ("/v2/embed", {"texts": ["x"], "input_type": "search_query", "embedding_types": ["int4"]}, None),
])
def test_bad_requests_are_400(m3_server, route, body, param):
    r = m3_server.post(route, json={"model": "m3", **body})
    assert r.status_code in (400, 422), r.text
    if param is not None:
        assert r.json()["error"]["param"] == param


# ---------------------------------------------------------------- what a folder may hold


def test_pt_heads_are_read_as_safetensors_are(shared_models):
    folder = shared_models / "tiny-bge-m3"
    for head in ("colbert_linear", "sparse_linear"):
        a, b = read_tensors(folder / f"{head}.pt"), read_tensors(folder / f"{head}.safetensors")
        assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)


class _Payload:
    def __reduce__(self):
        return (exec, ("open('PWNED', 'w').write('x')",))


def _archive(path, obj) -> None:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("head/data.pkl", pickle.dumps(obj, protocol=2))
        z.writestr("head/byteorder", "little")


def test_a_pt_that_holds_code_is_refused_before_it_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _archive(tmp_path / "evil.pt", {"weight": _Payload()})
    with pytest.raises(TensorFileError, match="holds (__builtin__|builtins).exec, not a tensor: refused"):
        read_tensors(tmp_path / "evil.pt")
    assert not (tmp_path / "PWNED").exists()
    (tmp_path / "legacy.pt").write_bytes(pickle.dumps({"weight": 1}))
    with pytest.raises(TensorFileError, match="not a torch zip archive"):
        read_tensors(tmp_path / "legacy.pt")
    _archive(tmp_path / "odd.pt", [1, 2, 3])
    with pytest.raises(TensorFileError, match="not a state dict of named tensors"):
        read_tensors(tmp_path / "odd.pt")


def _folder(shared_models, tmp_path, skip=()):
    src = shared_models / "tiny-bge-m3"
    folder = tmp_path / "m3"
    for f in src.rglob("*"):
        if f.is_file() and f.name not in skip:
            (folder / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            (folder / f.relative_to(src)).symlink_to(f)
    return folder


def test_heads_that_do_not_fit_are_load_errors(shared_models, tmp_path):
    from safetensors.numpy import save_file

    import rsinfer_cli

    folder = _folder(shared_models, tmp_path, skip=("colbert_linear.safetensors",))
    save_file({"weight": np.zeros((16, 24), np.float32), "bias": np.zeros(16, np.float32)},
              str(folder / "colbert_linear.safetensors"))
    with pytest.raises(ModelLoadError, match=r"colbert_linear.weight is \[16, 24\].*32 wide"):
        rsinfer_cli.load(folder)
    evil = _folder(shared_models, tmp_path / "evil", skip=("sparse_linear.safetensors", "sparse_linear.pt"))
    _archive(evil / "sparse_linear.pt", {"weight": _Payload()})
    with pytest.raises(ModelLoadError, match="sparse_linear.pt: holds (__builtin__|builtins).exec"):
        rsinfer_cli.load(evil, kind="m3")
    bare = _folder(shared_models, tmp_path / "bare", skip=("colbert_linear.safetensors", "colbert_linear.pt"))
    with pytest.raises(ModelLoadError, match="needs colbert_linear.safetensors"):
        rsinfer_cli.load(bare, kind="m3")


def test_the_buffer_reader_keeps_strides(tmp_path):
    """A transposed tensor (stride (1, rows)) comes back as its values, not its storage's order."""
    from rsinfer_cli.pipelines import tensorfile

    storage = np.arange(6, dtype="<f4")
    t = tensorfile._rebuild_tensor(storage, 0, (3, 2), (1, 3))
    assert t.tolist() == [[0, 3], [1, 4], [2, 5]]
    with pytest.raises(TensorFileError, match="reaches past its storage"):
        tensorfile._rebuild_tensor(storage, 4, (2, 2), (2, 1))


# ---------------------------------------------------------------- the Python API and the CLI


def test_api_m3_and_m3_score_are_flagembeddings(shared_models, ref):
    import rsinfer_cli

    cases = _cases(ref)
    with rsinfer_cli.load(shared_models / "tiny-bge-m3") as model:
        out = model.m3([c["text"] for c in cases], sparse=True, colbert=True)
        assert set(out) == {"dense_vecs", "lexical_weights", "colbert_vecs"}
        assert np.abs(out["dense_vecs"] - np.array([c["dense_vecs"] for c in cases])).max() <= TOL
        for c, lw, cv in zip(cases, out["lexical_weights"], out["colbert_vecs"], strict=True):
            _same_lexical(lw, c["lexical_weights"], c["text"][:30])
            assert np.abs(cv - np.array(c["colbert_vecs"]).reshape(-1, 32)).max(initial=0) <= TOL
        assert list(model.m3(["x"], dense=False, sparse=True)) == ["lexical_weights"]
        pairs = ref["pairs"]
        got = model.m3_score([ref["queries"][p["query_index"]]["text"] for p in pairs],
                             [ref["passages"][p["passage_index"]]["text"] for p in pairs], weights=[0.4, 0.2, 0.4])
        for i, p in enumerate(pairs):
            assert all(abs(got[mode][i] - want) <= TOL for mode, want in p["compute_score_other"].items())
        dense = model.embed([cases[0]["text"]])
        assert np.abs(dense[0] - cases[0]["dense_vecs"]).max() <= TOL
        sparse = model.sparse([cases[0]["text"]])[0]
        _same_lexical(_lexical_dict(sparse.indices, sparse.values), cases[0]["lexical_weights"], "sparse")
        assert model.tokens(sparse.indices) == [model.pipeline.tokens_of([i])[0] for i in sparse.indices]
        vecs = model.colbert([cases[0]["text"]])[0]
        assert np.abs(vecs - np.array(cases[0]["colbert_vecs"]).reshape(-1, 32)).max() <= TOL


def test_the_cli_gives_every_output(shared_models, ref):
    import subprocess
    import sys

    texts = ref["texts"]
    stdin = "".join(json.dumps({"id": i, "body": c["text"]}) + "\n" for i, c in enumerate(texts))
    path = str(shared_models / "tiny-bge-m3")

    def run(*args):
        proc = subprocess.run([sys.executable, "-m", "rsinfer_cli", *args, "--path", path, "--field", "body"],
                              input=stdin, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return [json.loads(line) for line in proc.stdout.splitlines()]

    for c, line in zip(texts, run("m3", "--sparse", "--colbert"), strict=True):
        assert np.abs(np.array(line["dense_vecs"]) - c["dense_vecs"]).max() <= TOL
        _same_lexical(line["lexical_weights"], c["lexical_weights"], c["text"][:30])
        assert np.abs(np.array(line["colbert_vecs"]).reshape(-1, 32) -
                      np.array(c["colbert_vecs"]).reshape(-1, 32)).max(initial=0) <= TOL
    for c, line in zip(texts, run("sparse"), strict=True):
        _same_lexical(dict(zip(map(str, line["indices"]), line["values"], strict=True)), c["lexical_weights"], "cli")
    for c, line in zip(texts, run("embed"), strict=True):
        assert np.abs(np.array(line["embedding"]) - c["dense_vecs"]).max() <= TOL


def test_from_the_hub_as_baai_ships_it(shared_models, fake_hub, tmp_path):
    """A repo with the heads as .pt only (BAAI/bge-m3's layout) downloads, is recognised and serves FlagEmbedding's
    vectors; `rsinfer download` keeps the heads."""
    import subprocess
    import sys

    import rsinfer_cli

    src = shared_models / "tiny-bge-m3"
    files = {str(f.relative_to(src)): f.read_bytes() for f in src.rglob("*")
             if f.is_file() and not f.name.endswith(".safetensors") and f.name != "reference.json"}
    fake_hub.add("BAAI/tiny-m3", files)
    ref = json.loads((src / "reference.json").read_text(encoding="utf-8"))
    with rsinfer_cli.load(hf="BAAI/tiny-m3") as model:
        assert model.kind == "m3" and model.pipeline.describe()["heads"] == "colbert_linear.pt, sparse_linear.pt"
        out = model.m3([ref["texts"][0]["text"]], sparse=True)
        _same_lexical(out["lexical_weights"][0], ref["texts"][0]["lexical_weights"], "hub")
    dest = tmp_path / "dl"
    proc = subprocess.run([sys.executable, "-m", "rsinfer_cli", "download", "BAAI/tiny-m3", str(dest)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert {p.name for p in dest.rglob("*.pt")} == {"colbert_linear.pt", "sparse_linear.pt"}
