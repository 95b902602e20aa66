"""Sentence-transformers folders computed as sentence-transformers computes them (pipelines/stmodules.py): the module
pipeline of modules.json (Pooling in both layouts and every mode, Dense, LayerNorm, Normalize), prompts with
`include_prompt`, `do_lower_case`, the sequence limit, Matryoshka sizes; load errors for what cannot be computed; a
graph that already holds its Dense gets it once. Parity against reference.json from SentenceTransformer.encode:
shared/models/tiny-st-prompts and the two fixtures tests/fixtures/build_st_fixtures.py builds."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from rsinfer_cli.config import ModelConfig, parse_config
from rsinfer_cli.engine.model import load_model
from rsinfer_cli.errors import ConfigError, InputError, ModelLoadError
from rsinfer_cli.pipelines.embedding import EmbeddingPipeline
from rsinfer_cli.pipelines.stmodules import _erf, pool_modes

import synth

FIXTURES = Path(__file__).parent / "fixtures"
COS = 0.99999            # the bar; measured 0.9999999 on every case
ABS = 1e-4               # per component (measured <= 7e-7): unnormalised vectors are held to values, not just angles


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def call_kwargs(call: str) -> dict:
    """A reference.json call name → the request's prompt arguments."""
    if call.startswith("prompt:"):
        return {"prompt_name": call.partition(":")[2]}
    return {"prompt": ""} if call == "no_prompt" else {}


def calls_of(ref: dict) -> list[str]:
    return [k for k in ref["cases"][0] if k != "text" and not k.endswith(":tokens")]


def load(path: Path | str, **keys) -> EmbeddingPipeline:
    cfg = parse_config({"models": [{"name": "m", "kind": "embedding", "path": str(path), "replicas": 1,
                                    **keys}]}).models[0]
    return EmbeddingPipeline(load_model(cfg))


@pytest.fixture(scope="module", params=["tiny-st-prompts", "st-cls-dense", "st-legacy"])
def folder(request, shared_models) -> Path:
    return shared_models / request.param if request.param == "tiny-st-prompts" else FIXTURES / request.param


@pytest.mark.shared
class TestParity:
    def test_every_case_and_prompt(self, folder):
        ref = json.loads((folder / "reference.json").read_text())
        pipe = load(folder)
        assert pipe.dim == ref["dimension"] and pipe.normalize == ref["normalized"]
        texts = [c["text"] for c in ref["cases"]]
        for call in calls_of(ref):
            res = pipe.embed(texts, **call_kwargs(call))
            want = np.array([c[call] for c in ref["cases"]], dtype=np.float32)
            assert res.vectors.shape == want.shape, call
            assert min(cosine(a, b) for a, b in zip(res.vectors, want, strict=True)) >= COS, call
            assert np.abs(res.vectors - want).max() <= ABS, call
            if f"{call}:tokens" in ref["cases"][0]:       # usage counts the prompt, as sentence-transformers does
                assert res.tokens == sum(c[f"{call}:tokens"] for c in ref["cases"]), call

    def test_one_at_a_time_equals_batched(self, folder):
        """Rows of several prompts and lengths in one forward give what each gives alone (padding, prompt masks)."""
        ref = json.loads((folder / "reference.json").read_text())
        pipe = load(folder)
        texts = [c["text"] for c in ref["cases"]]
        together = pipe.embed(texts, prompt_name="query").vectors
        alone = np.stack([pipe.embed([t], prompt_name="query").vectors[0] for t in texts])
        assert np.abs(together - alone).max() <= 1e-5


class TestFixtures:
    """What the two fixtures exercise, checked on their files so the parity tests above cannot pass vacuously."""

    def test_cls_dense_is_unnormalised_with_a_default_prompt(self):
        ref = json.loads((FIXTURES / "st-cls-dense" / "reference.json").read_text())
        norms = [np.linalg.norm(c["default"]) for c in ref["cases"]]
        assert min(abs(n - 1) for n in norms) > 0.05          # no Normalize: a server that normalises fails parity
        assert ref["default_prompt_name"] == "query"
        assert all(c["default"] == c["prompt:query"] and c["default"] != c["no_prompt"] for c in ref["cases"])
        pipe = load(FIXTURES / "st-cls-dense")
        assert pipe.pooling == "cls" and [s.kind for s in pipe.steps] == ["Dense", "Dense"]
        assert pipe.describe()["default_prompt_name"] == "query" and pipe.normalize is False

    def test_legacy_layout(self):
        pipe = load(FIXTURES / "st-legacy")
        assert pipe.pooler.modes == ("max", "mean") and pipe.pooler.include_prompt is False
        assert [s.kind for s in pipe.steps] == ["Dense", "LayerNorm"] and pipe.normalize is True
        assert (pipe.model.max_len, pipe.model.max_len_source) == (20, "sentence_bert_config.json max_seq_length")
        # do_lower_case: the tokenizer itself is cased; rsinfer puts sentence-transformers' Lowercase in front
        vocab = json.loads((FIXTURES / "st-legacy" / "tokenizer.json").read_text())["model"]["vocab"]
        assert "The" in vocab and "the" in vocab
        assert pipe.encode(["The Museum"]).ids == pipe.encode(["the museum"]).ids
        ref = json.loads((FIXTURES / "st-legacy" / "reference.json").read_text())
        assert ref["checks"]["mixed_vs_lowercased_max_abs"] == 0.0
        assert max(c["default:tokens"] for c in ref["cases"]) == 20      # one case is cut at max_seq_length


# ---------------------------------------------------------------- the arithmetic


def test_pooling_modes_against_their_definitions():
    rng = np.random.default_rng(3)
    h = rng.standard_normal((2, 5, 3)).astype(np.float32)
    mask = np.array([[0, 0, 1, 1, 0], [1, 1, 1, 1, 1]])       # row 0: a 2-token prompt left out, one padding
    kept = [h[0, 2:4], h[1]]
    np.testing.assert_allclose(pool_modes(h, mask, ("mean",)), [k.mean(0) for k in kept], atol=1e-6)
    np.testing.assert_allclose(pool_modes(h, mask, ("max",)), [k.max(0) for k in kept], atol=1e-6)
    np.testing.assert_allclose(pool_modes(h, mask, ("cls",)), [h[0, 2], h[1, 0]], atol=1e-6)   # first kept token
    np.testing.assert_allclose(pool_modes(h, mask, ("last",)), [h[0, 3], h[1, 4]], atol=1e-6)
    np.testing.assert_allclose(pool_modes(h, mask, ("mean_sqrt_len_tokens",)),
                               [k.sum(0) / math.sqrt(len(k)) for k in kept], atol=1e-6)
    w0, w1 = np.array([3.0, 4.0]), np.arange(1.0, 6.0)          # positions keep their weights past the prompt
    np.testing.assert_allclose(pool_modes(h, mask, ("weightedmean",)),
                               [(kept[0] * w0[:, None]).sum(0) / w0.sum(), (h[1] * w1[:, None]).sum(0) / w1.sum()],
                               atol=1e-6)
    both = pool_modes(h, mask, ("cls", "mean"))
    assert both.shape == (2, 6) and np.allclose(both[:, :3], pool_modes(h, mask, ("cls",)))


def test_gelu_uses_erf_to_float32_precision():
    x = np.linspace(-6, 6, 2001)
    assert np.abs(_erf(x) - np.array([math.erf(v) for v in x])).max() < 2e-7


# ---------------------------------------------------------------- what cannot be computed fails at load


def st_folder(tmp_path: Path, modules: list, **kw) -> Path:
    root = synth.write_model_dir(tmp_path / "m", pooling=None)
    synth.write_st_modules(root, modules, **kw)
    return root


POOL = ("Pooling", "1_Pooling", {"word_embedding_dimension": synth.DIM, "pooling_mode_mean_tokens": True})


@pytest.mark.parametrize(("module", "says"), [
    (("CNN", "2_CNN", {"in_word_embedding_dimension": 4}), "module 2 (sentence_transformers.models.CNN, path '2_CNN')"),
    (("WordWeights", "2_WordWeights", {}), "module 2 (sentence_transformers.models.WordWeights"),
    (("my_package.modules.Whitening", "2_Whitening", {}), "module 2 (my_package.modules.Whitening, path "
                                                          "'2_Whitening'): rsinfer does not compute this module"),
    (("Dense", "2_Dense", {"in_features": 4, "out_features": 2, "activation_function": "my.custom.Swish"}),
     "activation_function 'my.custom.Swish' is not one rsinfer computes"),
    (("Dense", "2_Dense", {"in_features": 4, "out_features": 2}), "no 2_Dense/model.safetensors; rsinfer reads "
                                                                   "module weights from safetensors only"),
])
def test_a_module_rsinfer_cannot_compute_fails_to_load_naming_it(tmp_path, module, says):
    root = st_folder(tmp_path, [("Transformer", "", None), POOL, module])
    with pytest.raises(ModelLoadError, match="model 'm': ") as err:
        load(root)
    assert says in str(err.value)


def test_widths_are_checked_at_load(tmp_path):
    dense = ("Dense", "2_Dense", {"in_features": 8, "out_features": 2})
    root = st_folder(tmp_path, [("Transformer", "", None), POOL, dense],
                     weights={"2_Dense": {"linear.weight": np.ones((2, 8)), "linear.bias": np.zeros(2)}})
    with pytest.raises(ModelLoadError, match=r"Dense 8→2 Tanh \(2_Dense\) takes 8-wide vectors; it gets 4"):
        load(root)
    (root / "1_Pooling" / "config.json").write_text(json.dumps({"embedding_dimension": 16, "pooling_mode": "mean"}))
    with pytest.raises(ModelLoadError, match="Pooling is for 16-wide token vectors; the graph's 'last_hidden_state' "
                                             "gives 4"):
        load(root)
    (root / "2_Dense" / "model.safetensors").write_bytes(b"not safetensors")
    (root / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "mean"}))
    with pytest.raises(ModelLoadError, match="cannot read 2_Dense/model.safetensors"):
        load(root)


# ---------------------------------------------------------------- a graph that holds its Dense gets it once


def dense_folder(tmp_path: Path, out: int, graph, **dense_cfg) -> tuple[Path, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    w, b = rng.standard_normal((out, synth.DIM)).astype(np.float32), rng.standard_normal(out).astype(np.float32)
    root = synth.write_model_dir(tmp_path / "m", pooling=None, model=graph(w, b))
    synth.write_st_modules(root, [("Transformer", "", None), POOL,
                                  ("Dense", "2_Dense", {"in_features": synth.DIM, "out_features": out,
                                                        **dense_cfg}), ("Normalize", "3_Normalize", {})],
                           weights={"2_Dense": {"linear.weight": w, "linear.bias": b}})
    return root, w, b


def expected(texts: list[str], w: np.ndarray | None, b: np.ndarray | None) -> np.ndarray:
    """Masked mean of the synthetic table (every word known), then tanh(x Wᵀ + b), unit length."""
    table = synth.embedding_table()
    rows = []
    for t in texts:
        ids = [synth.VOCAB["[CLS]"], *(synth.VOCAB[word] for word in t.split()), synth.VOCAB["[SEP]"]]
        v = table[ids].mean(0)
        rows.append(np.tanh(v @ w.T + b) if w is not None else v)
    out = np.array(rows)
    return out / np.linalg.norm(out, axis=1, keepdims=True)


TEXTS = ["hello world", "the cat sat on the mat", "dog"]


def test_dense_in_the_graph_by_width_runs_once(tmp_path):
    root, w, b = dense_folder(tmp_path, 3, lambda w, b: synth.pooled_graph(w, b))      # 4 → 3: widths tell
    pipe = load(root)
    assert pipe.output == "sentence_embedding" and pipe.steps == []
    assert "3 wide, the width after the modules: the graph holds them" in pipe.describe()["modules_reason"]
    np.testing.assert_allclose(pipe.embed(TEXTS).vectors, expected(TEXTS, w, b), atol=1e-5)


def test_a_pooled_graph_without_the_dense_gets_it_in_rsinfer(tmp_path):
    root, w, b = dense_folder(tmp_path, 3, lambda w, b: synth.pooled_graph())         # gives 4: pooling only
    pipe = load(root)
    assert [s.kind for s in pipe.steps] == ["Dense"] and "the modules run in rsinfer" in pipe.modules_reason
    np.testing.assert_allclose(pipe.embed(TEXTS).vectors, expected(TEXTS, w, b), atol=1e-5)


@pytest.mark.parametrize("baked", [True, False])
def test_same_width_is_decided_by_a_trial_forward(tmp_path, baked):
    """Dense 4→4: the width cannot tell; the graph's token output, pooled (and through the Dense), can."""
    root, w, b = dense_folder(tmp_path, 4, lambda w, b: synth.pooled_graph(w, b) if baked else synth.pooled_graph())
    pipe = load(root)
    assert "a trial forward compared the graph's outputs" in pipe.modules_reason
    assert pipe.model.stats["dense_in_graph"] is baked           # remembered: front ends decide without a session
    assert ([s.kind for s in pipe.steps] == []) is baked
    np.testing.assert_allclose(pipe.embed(TEXTS).vectors, expected(TEXTS, w, b), atol=1e-5)


def test_same_width_without_token_output_needs_the_key(tmp_path):
    root, w, b = dense_folder(tmp_path, 4, lambda w, b: synth.pooled_graph(w, b, tokens=False))
    with pytest.raises(ModelLoadError, match="as wide before the Dense modules as after them, and the graph has no "
                                             "token output to tell them apart; set dense_in_graph: true or false"):
        load(root)
    np.testing.assert_allclose(load(root, dense_in_graph=True).embed(TEXTS).vectors, expected(TEXTS, w, b),
                               atol=1e-5)
    wide, _, _ = dense_folder(tmp_path / "w", 3, lambda w, b: synth.pooled_graph(w, b))
    with pytest.raises(ModelLoadError, match="dense_in_graph is false but the graph's 'sentence_embedding' is 3 wide, "
                                             "the width after the Dense modules"):
        load(wide, dense_in_graph=False)


# ---------------------------------------------------------------- prompts


@pytest.mark.shared
class TestPrompts:
    def test_unknown_and_conflicting(self, shared_models):
        pipe = load(shared_models / "tiny-st-prompts")
        with pytest.raises(InputError, match="unknown prompt_name 'passage' for model 'm'; its prompts: document, "
                                             "query") as err:
            pipe.embed(["x"], prompt_name="passage")
        assert err.value.param == "prompt_name"
        with pytest.raises(InputError, match="give `prompt` or `prompt_name`, not both"):
            pipe.embed(["x"], prompt_name="query", prompt="q: ")
        with pytest.raises(InputError, match="a prompt applies to texts; token ids are embedded as given"):
            pipe.embed(ids=[[101, 102]], prompt_name="query")

    def test_sentence_transformers_query_and_document_always_exist(self):
        """Every model has sentence-transformers' query and document prompts, empty unless defined: naming them on
        a model without prompts embeds the text as given (what encode_query / encode_document do)."""
        pipe = load(FIXTURES / "st-legacy")               # defines query and passage, not document
        ref = json.loads((FIXTURES / "st-legacy" / "reference.json").read_text())
        assert ref["prompts"]["document"] == ""
        assert np.array_equal(pipe.embed(["x y"], prompt_name="document").vectors, pipe.embed(["x y"]).vectors)

    def test_the_entry_overrides_the_folder(self, shared_models):
        pipe = load(shared_models / "tiny-st-prompts", prompts={"query": "search_query: ", "doc": "d: "},
                    default_prompt_name="doc")
        assert pipe.prompts == {"query": "search_query: ", "document": "passage: ", "doc": "d: "}
        assert pipe.prompt_text() == "d: " and pipe.prompt_text("query") == "search_query: "
        assert np.array_equal(pipe.embed(["x"]).vectors, pipe.embed(["x"], prompt="d: ").vectors)
        cls = load(FIXTURES / "st-cls-dense", default_prompt_name="")          # "": the folder's default is off
        ref = json.loads((FIXTURES / "st-cls-dense" / "reference.json").read_text())
        case = ref["cases"][0]
        assert np.abs(cls.embed([case["text"]]).vectors[0] - case["no_prompt"]).max() <= ABS

    def test_bad_prompt_keys_fail_at_start(self, shared_models):
        with pytest.raises(ModelLoadError, match="default_prompt_name 'summary' is not one of its prompts \\(document, "
                                                 "query\\)"):
            load(shared_models / "tiny-st-prompts", default_prompt_name="summary")
        with pytest.raises(ModelLoadError, match="input_type_prompts.clustering 'cluster' is not one of its prompts"):
            load(shared_models / "tiny-st-prompts", input_type_prompts={"clustering": "cluster"})
        with pytest.raises(ConfigError, match=r"models\[0\].input_type_prompts.search: not a Cohere input_type"):
            load(shared_models / "tiny-st-prompts", input_type_prompts={"search": "query"})
        with pytest.raises(ConfigError, match=r"models\[0\].prompts.query: expected a string, got an integer 3"):
            load(shared_models / "tiny-st-prompts", prompts={"query": 3})
        with pytest.raises(ConfigError, match=r"models\[0\].prompts: expected a mapping, got a list"):
            load(shared_models / "tiny-st-prompts", prompts=["query: "])

    def test_cohere_input_types(self, shared_models):
        st = load(shared_models / "tiny-st-prompts")
        legacy = load(FIXTURES / "st-legacy")
        cls = load(FIXTURES / "st-cls-dense")
        assert [st.prompt_for_input_type(t) for t in ("search_query", "search_document", "clustering")] == \
            ["query", "document", None]
        assert legacy.prompt_for_input_type("search_document") == "passage"      # no document: passage
        assert cls.prompt_for_input_type("classification") == "classification"
        assert cls.prompt_for_input_type("clustering") is None                   # → the default prompt (query)
        mapped = load(FIXTURES / "st-cls-dense", input_type_prompts={"clustering": "classification"})
        assert mapped.prompt_for_input_type("clustering") == "classification"

    def test_the_prompt_counts_toward_max_len_and_left_truncation_keeps_it(self):
        pipe = load(FIXTURES / "st-legacy")                                     # max_seq_length 20
        long = " ".join(["the cat sat on the mat"] * 6)
        right = pipe.plan([long], prompt_name="query").rows[0]
        left = pipe.plan([long], prompt_name="query", direction="left").rows[0]
        query = pipe.encode(["query: x"]).ids[0][:3]                             # [CLS] query :
        assert len(right[0]) == len(left[0]) == 20 and right[0][:3] == left[0][:3] == query
        assert left[0][-1] == right[0][-1] == pipe.encoder.tokenizer.token_to_id("[SEP]")
        assert left[0][3:-1] == pipe.encode([long], direction="left").ids[0][1:-1][-16:]
        assert right[2] == left[2] == 3                           # include_prompt false: 3 tokens left out

    def test_a_prompt_that_fills_max_len_is_refused(self):
        pipe = load(FIXTURES / "st-legacy", max_len=3)                          # [CLS] query : [SEP] > 3
        with pytest.raises(InputError, match=r"input\[0\]: the prompt takes 3 of its 3 tokens"):
            pipe.embed(["hello"], prompt_name="query")
        with pytest.raises(InputError, match="the prompt alone has 3 tokens and max_len is 3"):
            pipe.embed(["hello"], prompt_name="query", direction="left")

    def test_only_the_models_own_prompts_are_remembered(self):
        """A request's made-up `prompt` is measured each time, never kept: clients cannot grow the server's memory."""
        pipe = load(FIXTURES / "st-legacy")
        for i in range(50):
            pipe.plan(["x"], prompt=f"made up {i}: ")
        pipe.plan(["x"], prompt_name="query")
        assert pipe._prompt_lengths == {"query: ": 3}

    def test_cache_keys_include_the_prompt(self):
        """Same token ids, different prompt: `include_prompt: false` pools them differently, so they are cached
        apart (and a different prompt gives different ids anyway)."""
        pipe = load(FIXTURES / "st-legacy")
        as_prompt = pipe.plan(["x"], prompt="query: ")
        in_text = pipe.plan(["query: x"], prompt="")
        assert as_prompt.rows[0][0] == in_text.rows[0][0]
        assert pipe.row_keys(as_prompt) != pipe.row_keys(in_text)
        assert not np.allclose(pipe.run(as_prompt).vectors, pipe.run(in_text).vectors)


# ---------------------------------------------------------------- Matryoshka


def test_matryoshka_sizes_and_truncate_dim(tmp_path):
    ref = json.loads((FIXTURES / "st-legacy" / "reference.json").read_text())
    texts = [c["text"] for c in ref["cases"]]
    full = np.array([c["default"] for c in ref["cases"]])
    pipe = load(FIXTURES / "st-legacy", matryoshka_dimensions=[8, 16])
    small = pipe.embed(texts, dimensions=8).vectors
    np.testing.assert_allclose(small, full[:, :8] / np.linalg.norm(full[:, :8], axis=1, keepdims=True), atol=ABS)
    assert pipe.embed(texts, dimensions=24).vectors.shape == (len(texts), 24)       # the full width is allowed
    with pytest.raises(InputError, match="`dimensions` 12 is not a size model 'm' was trained for; its sizes: 8, "
                                         "16, 24"):
        pipe.embed(texts, dimensions=12)
    with pytest.raises(ModelLoadError, match="matryoshka_dimensions 32 is wider than the model's 24-dimensional"):
        load(FIXTURES / "st-legacy", matryoshka_dimensions=[8, 32])
    copy = shutil.copytree(FIXTURES / "st-legacy", tmp_path / "legacy")
    st_cfg = json.loads((copy / "config_sentence_transformers.json").read_text())
    (copy / "config_sentence_transformers.json").write_text(json.dumps({**st_cfg, "truncate_dim": 12}))
    cut = load(copy)
    assert cut.dim == 12 and cut.describe()["dimensions"] == 12
    np.testing.assert_allclose(cut.embed(texts).vectors, full[:, :12] / np.linalg.norm(full[:, :12], axis=1,
                                                                                       keepdims=True), atol=ABS)


def test_dimensions_keep_an_unnormalised_model_unnormalised():
    ref = json.loads((FIXTURES / "st-cls-dense" / "reference.json").read_text())
    pipe = load(FIXTURES / "st-cls-dense")
    texts = [c["text"] for c in ref["cases"]]
    full = np.array([c["default"] for c in ref["cases"]])
    np.testing.assert_allclose(pipe.embed(texts, dimensions=6).vectors, full[:, :6], atol=ABS)
    unit = pipe.embed(texts, normalize=True).vectors
    np.testing.assert_allclose(unit, full / np.linalg.norm(full, axis=1, keepdims=True), atol=ABS)


# ---------------------------------------------------------------- the Hub


def test_the_hub_fetches_module_files_but_no_torch_weights(fake_hub, tmp_path):
    from rsinfer_cli.hub import ModelSource, download, resolve

    files = synth.dir_files(FIXTURES / "st-cls-dense")
    files["pytorch_model.bin"] = b"torch pickle"                 # the transformer's torch weights: never fetched
    files["2_Dense/pytorch_model.bin"] = b"torch pickle"
    fake_hub.add("org/st-cls-dense", files)
    resolved = resolve(ModelSource(hf="org/st-cls-dense"), tmp_path / "cache")
    assert {"modules.json", "config_sentence_transformers.json", "2_Dense/config.json", "2_Dense/model.safetensors",
            "3_Dense/config.json", "3_Dense/model.safetensors", "1_Pooling/config.json"} <= set(resolved.aux)
    fetched = {path for method, path, _ in fake_hub.requests if "/resolve/" in path}
    assert any(p.endswith("2_Dense/model.safetensors") for p in fetched)
    assert not [p for p in fetched if p.endswith(".bin")], fetched
    cfg = ModelConfig(name="hub", kind="embedding", hf="org/st-cls-dense", replicas=1)
    pipe = EmbeddingPipeline(load_model(cfg, cache_dir=tmp_path / "cache"))
    ref = json.loads((FIXTURES / "st-cls-dense" / "reference.json").read_text())
    assert np.abs(pipe.embed([ref["cases"][0]["text"]]).vectors[0] - ref["cases"][0]["default"]).max() <= ABS
    out = download(ModelSource(hf="org/st-cls-dense"), tmp_path / "dl", tmp_path / "cache").out
    offline = load(out)
    assert [s.label for s in offline.steps] == [s.label for s in pipe.steps]
    assert not (out / "2_Dense" / "pytorch_model.bin").exists()


def test_options_are_hashable_and_comparable():
    """The model entry stays a frozen, comparable value with mapping keys in it."""
    a = parse_config({"models": [{"name": "m", "kind": "embedding", "path": "x",
                                  "prompts": {"query": "q: "}}]}).models[0]
    b = dataclasses.replace(a)
    assert a == b and hash(a.options) == hash(b.options) and a.options.prompts == {"query": "q: "}


def test_inspect_shows_the_pipeline_prompts_and_width():
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "rsinfer_cli", "inspect", "--path", str(FIXTURES / "st-legacy"),
                           "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    pipe = json.loads(proc.stdout)["pipeline"]
    assert pipe["modules"] == ["Transformer (the ONNX graph)", "Pooling max+mean, prompt excluded (1_Pooling)",
                               "Dense 64→24 Sigmoid (2_Dense)", "LayerNorm 24 (3_LayerNorm)", "Normalize"]
    assert pipe["modules_run"] == ["Dense 64→24 Sigmoid (2_Dense)", "LayerNorm 24 (3_LayerNorm)"]
    assert pipe["dimensions"] == 24 and pipe["prompts"] == {"query": "query: ", "passage": "passage: "}
    table = subprocess.run([sys.executable, "-m", "rsinfer_cli", "inspect", "--path", str(FIXTURES / "st-legacy")],
                           capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert "Pooling max+mean, prompt excluded (1_Pooling) → Dense 64→24 Sigmoid" in table.stdout
    assert "query: 'query: ', passage: 'passage: '" in table.stdout
