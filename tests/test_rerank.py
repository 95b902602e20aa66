"""Rerank parity with sentence-transformers CrossEncoder (tiny-reranker-1: one logit, tiny-reranker-2: two),
through the pipeline, `rsinfer rerank` and every HTTP shape; the yes/no path on a synthetic [B,S,V] graph;
the official cohere SDK (v1 and v2 clients) against the daemon."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import numpy as np
import pytest

from rsinfer_cli.config import ModelConfig, parse_config
from rsinfer_cli.engine.model import load_model
from rsinfer_cli.errors import ModelLoadError
from rsinfer_cli.pipelines.rerank import RerankOptions, RerankPipeline, ranked
from test_server import assert_error

import synth
from serverutil import ServerThread

SERVE_MODES = ("single", "workers")  # every test here also runs against the front-end/engine split

SCORE_ABS = 1e-5     # scores: measured <= 5.7e-6 against the PyTorch reference (models README)
LOGIT_ABS = 1e-4     # raw logits reach +-5; the ONNX export itself differs from PyTorch by up to 3.4e-5


def load_ref(shared_models, name: str) -> dict:
    return json.loads((shared_models / name / "reference.json").read_text())


def pipeline_for(root, scoring: str = "auto", **cfg) -> RerankPipeline:
    return RerankPipeline(load_model(ModelConfig(name="r", kind="rerank", path=str(root), replicas=1,
                                                 options=RerankOptions(scoring=scoring), **cfg)))


def raw_of(name: str, q: dict) -> np.ndarray:
    logits = np.array(q["logits"], dtype=np.float64)
    return logits if name == "tiny-reranker-1" else logits[:, 1] - logits[:, 0]


@pytest.fixture(scope="module", params=["tiny-reranker-1", "tiny-reranker-2"])
def reranker(request, shared_models):
    return request.param, pipeline_for(shared_models / request.param), load_ref(shared_models, request.param)


@pytest.mark.shared
class TestParity:
    def test_scores_raw_and_ranking(self, reranker):
        name, pipe, ref = reranker
        worst_score = worst_raw = 0.0
        for q in ref["queries"]:
            res = pipe.rerank(q["query"], q["documents"])
            worst_score = max(worst_score, np.abs(res.scores - q["scores"]).max())
            assert ranked(res.scores) == q["ranking"]
            raw = pipe.rerank(q["query"], q["documents"], raw=True).scores
            worst_raw = max(worst_raw, np.abs(raw - raw_of(name, q)).max())
            assert res.tokens == sum(t["num_tokens"] for t in q["tokenization"])
            assert res.truncated == sum(t["truncated"] for t in q["tokenization"])
        assert worst_score <= SCORE_ABS, worst_score
        assert worst_raw <= LOGIT_ABS, worst_raw

    def test_auto_scoring_rule(self, reranker):
        name, pipe, _ = reranker
        assert pipe.describe()["scoring"] == ("sigmoid" if name == "tiny-reranker-1" else "softmax")

    def test_query_kept_when_document_is_cut(self, reranker):
        _, pipe, _ = reranker
        enc = pipe.encode_pairs(["what is the capital of france"], ["word " * 600])
        ids = enc.ids[0]
        assert len(ids) == 512 and ids.count(102) == 2  # [SEP] after the whole query and at the end
        assert enc.type_ids[0][:8] == [0] * 8 and enc.type_ids[0][8] == 1  # the whole query, then the document

    @pytest.mark.parametrize("direction", ["right", "left"])
    def test_a_long_query_is_cut_once_and_scores_as_whole(self, reranker, direction):
        """The query is tokenized once, cut to what a pair can keep (bounded_query): the scores and token counts are
        those of the whole query against each document, over every truncation case (a short document keeps the
        query longest, a long one splits max_len between them)."""
        _, pipe, _ = reranker
        rng = np.random.default_rng(7)
        words = ["capital", "of", "France", "Paris", "weather,", "x9z", "naïve", "café", "über", "résumé", "(a)"]
        query = " ".join(rng.choice(words, 3000))
        docs = ["Paris is in France.", " ".join(rng.choice(words, 200)), " ".join(rng.choice(words, 700)),
                " ".join(rng.choice(words, 255)), ""]
        cut = pipe.bounded_query(query, direction)
        assert len(cut) < len(query) // 4
        whole = pipe.run(pipe.plan_pairs([query] * len(docs), docs, direction=direction))
        once = pipe.run(pipe.plan_rerank(query, docs, direction=direction))
        assert once.scores.tolist() == whole.scores.tolist()
        assert (once.tokens, once.truncated) == (whole.tokens, whole.truncated)

    def test_query_longer_than_max_len_still_scores(self, reranker):
        _, pipe, _ = reranker
        res = pipe.rerank("query " * 600, ["short document"])
        assert res.truncated == 1 and 0 < res.scores[0] < 1


class TestScoringRules:
    def make(self, tmp_path, labels: int, **cfg):
        model, table = synth.classifier_graph(labels)
        root = synth.write_model_dir(tmp_path / f"c{labels}", model=model, pooling=None)
        return pipeline_for(root, **cfg), table

    def expected_logits(self, pipe, table, query, doc):
        enc = pipe.encode_pairs([query], [doc])
        ids = np.array(enc.ids[0]) + np.array(enc.type_ids[0]) * len(synth.VOCAB)
        return table[ids].mean(axis=0).astype(np.float64)

    def test_one_logit_sigmoid_and_logit(self, tmp_path):
        pipe, table = self.make(tmp_path, 1)
        logit = self.expected_logits(pipe, table, "the cat", "sat on the mat")[0]
        assert pipe.rerank("the cat", ["sat on the mat"]).scores[0] == pytest.approx(1 / (1 + np.exp(-logit)), abs=1e-6)
        assert pipe.rerank("the cat", ["sat on the mat"], raw=True).scores[0] == pytest.approx(logit, abs=1e-6)

    @pytest.mark.parametrize("scoring", ["auto", "softmax", "sigmoid"])
    def test_two_logits_probability_of_label_1(self, tmp_path, scoring):
        pipe, table = self.make(tmp_path, 2, scoring=scoring)
        l0, l1 = self.expected_logits(pipe, table, "a dog", "ran")
        p1 = np.exp(l1) / (np.exp(l0) + np.exp(l1))
        assert pipe.rerank("a dog", ["ran"]).scores[0] == pytest.approx(p1, abs=1e-6)
        assert pipe.rerank("a dog", ["ran"], raw=True).scores[0] == pytest.approx(l1 - l0, abs=1e-6)

    def test_zero_logits_score_half(self, tmp_path):
        pipe, _ = self.make(tmp_path, 2)
        assert pipe._scores(np.zeros((1, 2)), raw=False)[0] == 0.5
        one, _ = self.make(tmp_path / "one", 1)
        assert one._scores(np.zeros((1, 1)), raw=False)[0] == 0.5  # sigmoid(0)

    def test_logit_config_on_two_columns_is_the_difference(self, tmp_path):
        pipe, table = self.make(tmp_path, 2, scoring="logit")
        l0, l1 = self.expected_logits(pipe, table, "a", "b")
        assert pipe.rerank("a", ["b"]).scores[0] == pytest.approx(l1 - l0, abs=1e-6)

    @pytest.mark.parametrize(("labels", "scoring"), [(1, "softmax"), (1, "yes_no"), (2, "yes_no")])
    def test_scoring_that_does_not_fit_is_a_load_error(self, tmp_path, labels, scoring):
        with pytest.raises(ModelLoadError, match=f"scoring '{scoring}' does not fit output 'logits'"):
            self.make(tmp_path, labels, scoring=scoring)

    def test_batches_sorted_and_restored(self, tmp_path):
        from rsinfer_cli.config import BatchingConfig
        from rsinfer_cli.engine.scheduler import Runner

        pipe, _ = self.make(tmp_path, 1, batching=BatchingConfig(max_rows=2))
        docs = ["the cat sat on the mat", "a", "dog ran", "hello world the cat", "on"]
        together = pipe.rerank("hello", docs).scores
        alone = [pipe.rerank("hello", [d]).scores[0] for d in docs]
        assert np.allclose(together, alone, atol=1e-6)
        forwards: list[int] = []

        class Observer:
            def forward(self, rows, padded, seconds):
                forwards.append(rows)

            def waited(self, seconds):
                pass

        pipe.run(pipe.plan_rerank("hello", docs), Runner(pipe.model.sessions[0], pipe.forward, Observer()))
        assert forwards == [2, 2, 1]


class TestYesNo:
    def test_softmax_over_no_yes_at_last_real_token(self, tmp_path):
        root = synth.write_model_dir(tmp_path / "dec", model=synth.vocab_logits_graph(), pooling=None)
        pipe = pipeline_for(root)
        assert pipe.scoring == "yes_no" and pipe.layout == "vocab"
        table = synth.vocab_table()
        yes, no = synth.VOCAB["yes"], synth.VOCAB["no"]
        docs = ["the cat sat on the mat", "dog", "hello world"]
        scores = pipe.rerank("a dog", docs).scores  # different lengths: padding must not leak into the score
        for doc, score in zip(docs, scores, strict=True):
            ids = pipe.encode_pairs(["a dog"], [doc]).ids[0]
            last = table[ids].sum(axis=0).astype(np.float64)
            assert score == pytest.approx(1 / (1 + np.exp(-(last[yes] - last[no]))), abs=1e-5)
        raw = pipe.rerank("a dog", docs[:1], raw=True).scores[0]
        ids = pipe.encode_pairs(["a dog"], docs[:1]).ids[0]
        assert raw == pytest.approx(table[ids].sum(axis=0)[yes] - table[ids].sum(axis=0)[no], abs=1e-4)
        assert pipe.describe()["yes_no_token_ids"] == {"no": no, "yes": yes}

    def test_yes_split_into_pieces_is_a_load_error(self, tmp_path):
        from tokenizers import Tokenizer, models, pre_tokenizers

        root = synth.write_model_dir(tmp_path / "dec", model=synth.vocab_logits_graph(), pooling=None)
        vocab = {**synth.VOCAB}
        vocab.pop("yes")
        vocab["y"], vocab["##es"] = len(synth.VOCAB), len(synth.VOCAB) + 1
        tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        (root / "tokenizer.json").write_text(tok.to_str())
        with pytest.raises(ModelLoadError, match="'yes' to be a single token.*splits it into 2 tokens"):
            pipeline_for(root)

    def test_yes_unknown_is_a_load_error(self, tmp_path):
        from tokenizers import Tokenizer, models, pre_tokenizers

        root = synth.write_model_dir(tmp_path / "dec", model=synth.vocab_logits_graph(), pooling=None)
        vocab = {k: v for k, v in synth.VOCAB.items() if k != "no"}
        tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        (root / "tokenizer.json").write_text(tok.to_str())
        with pytest.raises(ModelLoadError, match="'no' in the vocabulary"):
            pipeline_for(root)


# ---------------------------------------------------------------- CLI


@pytest.mark.shared
class TestRerankCli:
    def test_jsonl_sorted_with_records(self, shared_models):
        ref = load_ref(shared_models, "tiny-reranker-1")
        q = ref["queries"][0]
        lines = "".join(json.dumps({"id": f"d{i}", "text": d}) + "\n" for i, d in enumerate(q["documents"]))
        proc = subprocess.run([sys.executable, "-m", "rsinfer_cli", "rerank", "--path",
                               str(shared_models / "tiny-reranker-1"), "--query", q["query"]],
                              input=lines, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        out = [json.loads(x) for x in proc.stdout.splitlines()]
        assert [o["index"] for o in out] == q["ranking"]
        assert [o["id"] for o in out] == [f"d{i}" for i in q["ranking"]]
        assert max(abs(o["score"] - q["scores"][o["index"]]) for o in out) <= SCORE_ABS

    def test_top_n_raw_and_table(self, shared_models):
        ref = load_ref(shared_models, "tiny-reranker-2")
        q = ref["queries"][1]
        base = [sys.executable, "-m", "rsinfer_cli", "rerank", "--path", str(shared_models / "tiny-reranker-2"),
                "-q", q["query"], *q["documents"]]
        proc = subprocess.run([*base, "--top-n", "2", "--raw"], capture_output=True, text=True, timeout=120)
        out = [json.loads(x) for x in proc.stdout.splitlines()]
        assert [o["index"] for o in out] == q["ranking"][:2]
        raw = raw_of("tiny-reranker-2", q)
        assert max(abs(o["score"] - raw[o["index"]]) for o in out) <= LOGIT_ABS
        table = subprocess.run([*base, "--table"], capture_output=True, text=True, timeout=120,
                               env={"COLUMNS": "160", "PATH": ""})
        assert table.returncode == 0 and "softmax(logits)[1]" in table.stdout


# ---------------------------------------------------------------- HTTP


@pytest.fixture(scope="module")
def rerank_server(shared_models, serve_mode):
    cfg = parse_config({"server": {"max_rerank_documents": 20}, "models": [
        {"name": "r1", "kind": "rerank", "path": str(shared_models / "tiny-reranker-1"), "replicas": 1,
         "default": True},
        {"name": "r2", "kind": "rerank", "path": str(shared_models / "tiny-reranker-2"), "replicas": 1},
        {"name": "mini", "kind": "embedding", "path": str(shared_models / "all-minilm-l6-v2"), "replicas": 1}]})
    with ServerThread(cfg, mode=serve_mode) as srv:
        yield srv


@pytest.fixture
def http(rerank_server):
    with httpx.Client(base_url=rerank_server.url, timeout=60) as c:
        yield c


@pytest.mark.shared
class TestHttp:
    @pytest.mark.parametrize("route", ["/v1/rerank", "/rerank"])
    def test_jina_cohere_v1_shape(self, http, shared_models, route):
        q = load_ref(shared_models, "tiny-reranker-1")["queries"][0]
        docs = [d if i % 2 else {"text": d, "id": i, "meta": {"k": i}} for i, d in enumerate(q["documents"])]
        body = http.post(route, json={"query": q["query"], "documents": docs}).json()
        assert set(body) == {"id", "model", "results", "usage"} and body["model"] == "r1"
        assert [r["index"] for r in body["results"]] == q["ranking"]
        for r in body["results"]:
            assert list(r) == ["index", "document", "relevance_score"]
            assert r["document"] == ({"text": docs[r["index"]]} if r["index"] % 2 else docs[r["index"]])
            assert abs(r["relevance_score"] - q["scores"][r["index"]]) <= SCORE_ABS
        assert body["usage"]["prompt_tokens"] == sum(t["num_tokens"] for t in q["tokenization"])

    def test_top_n_and_return_documents(self, http):
        body = http.post("/v1/rerank", json={"model": "r2", "query": "q", "documents": ["a", "b", "c"], "top_n": 2,
                                             "return_documents": False}).json()
        assert len(body["results"]) == 2 and all(set(r) == {"index", "relevance_score"} for r in body["results"])
        assert http.post("/v1/rerank", json={"query": "q", "documents": ["a"], "top_n": 0}).json()["results"] == []

    def test_ties_keep_input_order(self, http):
        body = http.post("/v1/rerank", json={"query": "q", "documents": ["same", "other", "same"]}).json()
        same = [r["index"] for r in body["results"] if r["index"] in (0, 2)]
        assert same == [0, 2]

    def test_rank_fields(self, http):
        docs = [{"title": "Paris", "body": "capital of France"}, {"title": "bread", "body": "flour and water"}]
        body = http.post("/v1/rerank", json={"query": "capital", "documents": docs, "rank_fields": ["title", "body"]})
        assert body.status_code == 200 and body.json()["results"][0]["document"] in docs

    def test_tei_shape(self, http, shared_models):
        q = load_ref(shared_models, "tiny-reranker-2")["queries"][2]
        out = http.post("/rerank", json={"model": "r2", "query": q["query"], "texts": q["documents"],
                                         "return_text": True}).json()
        assert isinstance(out, list) and [o["index"] for o in out] == q["ranking"]
        assert all(o["text"] == q["documents"][o["index"]] for o in out)
        assert max(abs(o["score"] - q["scores"][o["index"]]) for o in out) <= SCORE_ABS
        raw = http.post("/rerank", json={"model": "r2", "query": q["query"], "texts": q["documents"],
                                         "raw_scores": True}).json()
        expected = raw_of("tiny-reranker-2", q)
        assert max(abs(o["score"] - expected[o["index"]]) for o in raw) <= LOGIT_ABS
        assert "text" not in raw[0]
        top = http.post("/rerank", json={"model": "r2", "query": q["query"], "texts": q["documents"], "top_n": 2})
        assert [o["index"] for o in top.json()] == q["ranking"][:2]        # top_n holds in TEI's shape too

    def test_cohere_v2_shape(self, http, shared_models):
        q = load_ref(shared_models, "tiny-reranker-1")["queries"][3]
        body = http.post("/v2/rerank", json={"model": "r1", "query": q["query"], "documents": q["documents"],
                                             "top_n": 3}).json()
        assert set(body) == {"id", "results", "meta"}
        assert [r["index"] for r in body["results"]] == q["ranking"][:3]
        assert body["meta"]["billed_units"]["search_units"] == 1
        cut = http.post("/v2/rerank", json={"model": "r1", "query": "q", "documents": ["word " * 50],
                                            "max_tokens_per_doc": 5}).json()
        assert cut["meta"]["tokens"]["input_tokens"] == 1 + 1 + 1 + 5 + 1  # [CLS] q [SEP] 5 words [SEP]

    def test_vllm_score_pairing(self, http, shared_models):
        q = load_ref(shared_models, "tiny-reranker-2")["queries"][0]
        one_n = http.post("/v1/score", json={"model": "r2", "text_1": q["query"], "text_2": q["documents"]}).json()
        assert one_n["object"] == "list" and [d["index"] for d in one_n["data"]] == list(range(len(q["documents"])))
        assert all(d["object"] == "score" for d in one_n["data"])
        assert max(abs(d["score"] - s) for d, s in zip(one_n["data"], q["scores"], strict=True)) <= SCORE_ABS
        n_n = http.post("/v1/score", json={"model": "r2", "text_1": [q["query"]] * 2,
                                           "text_2": q["documents"][:2]}).json()
        assert [d["score"] for d in n_n["data"]] == [d["score"] for d in one_n["data"][:2]]
        one = http.post("/v1/score", json={"model": "r2", "text_1": q["query"], "text_2": q["documents"][0]}).json()
        assert len(one["data"]) == 1
        assert_error(http.post("/v1/score", json={"text_1": ["a", "b"], "text_2": ["x", "y", "z"]}), 400,
                     "invalid_request_error", "text_2", "1:1, 1:N or N:N; got 2:3")
        assert_error(http.post("/v1/score", json={"text_1": [], "text_2": ["x"]}), 400, "invalid_request_error",
                     "text_1")

    def test_errors(self, http):
        assert_error(http.post("/v1/rerank", json={"query": "q", "documents": []}), 400, "invalid_request_error",
                     "documents", "`documents` is empty")
        assert_error(http.post("/v1/rerank", json={"query": "q", "documents": ["a"] * 21}), 413,
                     "invalid_request_error", "documents", "has 21 documents; at most 20")
        assert_error(http.post("/v1/rerank", json={"query": "q", "documents": [{"title": "x"}]}), 422,
                     "invalid_request_error", "documents[0]")
        assert_error(http.post("/v1/rerank", json={"documents": ["a"]}), 422, "invalid_request_error", "query")
        assert_error(http.post("/v1/rerank", json={"query": "q", "documents": ["a"], "top_n": -1}), 400,
                     "invalid_request_error", "top_n")
        assert_error(http.post("/v1/rerank", json={"model": "mini", "query": "q", "documents": ["a"]}), 400,
                     "invalid_request_error", "model", "'mini' is an embedding model but was used for a rerank")
        assert_error(http.post("/v1/embeddings", json={"model": "r1", "input": "a"}), 400, "invalid_request_error",
                     "model", "'r1' is a rerank model but was used for an embedding request")
        assert_error(http.post("/rerank", json={"query": "q", "texts": []}), 400, "invalid_request_error", "texts")
        assert_error(http.post("/v1/rerank", json={"query": "q", "documents": ["a " * 600], "truncate": False}),
                     400, "invalid_request_error", "documents[0]", "max_len is 512")

    def test_models_card_reports_scoring(self, http):
        cards = {c["id"]: c for c in http.get("/v1/models").json()["data"]}
        assert cards["r1"]["pipeline"]["scoring"] == "sigmoid"
        assert cards["r2"]["pipeline"]["rule"] == "softmax(logits)[1]"


@pytest.mark.shared
class TestCohereSdk:
    def test_v1_and_v2_clients(self, rerank_server, shared_models):
        import cohere

        q = load_ref(shared_models, "tiny-reranker-1")["queries"][0]
        with httpx.Client(timeout=60) as transport:
            self.check(cohere, rerank_server.url, transport, q)

    @staticmethod
    def check(cohere, url, transport, q):
        v1 = cohere.Client(api_key="unused", base_url=url, httpx_client=transport)
        res = v1.rerank(model="r1", query=q["query"], documents=q["documents"], top_n=3, return_documents=True)
        assert [r.index for r in res.results] == q["ranking"][:3]
        assert res.results[0].document.text == q["documents"][q["ranking"][0]]
        scores = [r.relevance_score for r in res.results]
        assert scores == sorted(scores, reverse=True)
        v2 = cohere.ClientV2(api_key="unused", base_url=url, httpx_client=transport)
        res2 = v2.rerank(model="r1", query=q["query"], documents=q["documents"])
        assert [r.index for r in res2.results] == q["ranking"]
        assert abs(res2.results[0].relevance_score - q["scores"][q["ranking"][0]]) <= SCORE_ABS


@pytest.mark.shared
def test_inspect_reports_scoring_rule(shared_models):
    proc = subprocess.run([sys.executable, "-m", "rsinfer_cli", "inspect", "--path",
                           str(shared_models / "tiny-reranker-2"), "--json"], capture_output=True, text=True,
                          timeout=120)
    rep = json.loads(proc.stdout)
    assert rep["kind"] == "rerank" and rep["pipeline"]["scoring"] == "softmax"
    assert rep["pipeline"]["rule"] == "softmax(logits)[1]"
