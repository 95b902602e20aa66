"""The public Python API (`rsinfer_cli.load`): the same answers as the CLI, byte for byte, per family on the shared
models (the commands are built on it; this holds them to it), and typed errors for what a caller gets wrong."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import rsinfer_cli
from rsinfer_cli.errors import ConfigError, InputError
from rsinfer_cli.jsonio import dumps_line

# not the fixtures' own texts: unicode, an empty string, a long one, repeated ones
TEXTS = ["The invoice for order 1182 is overdue.", "", "naïve café — 東京 ✓", "Call Dr. Ana Souza on +44 20 7946 "
         "0958 or mail ana.souza@example.org", "password reset " * 30, "The invoice for order 1182 is overdue.",
         "Wire 500 EUR to DE89 3704 0044 0532 0130 00 by Friday."]


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rsinfer_cli", *args], capture_output=True, text=True, timeout=300,
                          input=stdin)


def cli_lines(*args: str, stdin: str | None = None) -> list[dict]:
    proc = cli(*args, stdin=stdin)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(x) for x in proc.stdout.splitlines()]


def same(value) -> object:
    """A value as the CLI writes it (the one JSON encoder), read back."""
    return json.loads(dumps_line(value))


def jsonl(texts: list[str]) -> str:
    return "".join(json.dumps({"text": t}) + "\n" for t in texts)


def test_import_loads_nothing_heavy():
    code = ("import sys, rsinfer_cli, rsinfer_cli.api, rsinfer_cli.ray, rsinfer_cli.spark\n"
            "heavy = [m for m in ('onnxruntime', 'numpy', 'pyarrow', 'ray', 'pyspark', 'pandas', 'aiohttp') "
            "if m in sys.modules]\nassert not heavy, heavy\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_embed_is_the_cli_byte_for_byte(shared_models, tmp_path):
    path = shared_models / "all-minilm-l6-v2"
    with rsinfer_cli.load(path) as model:
        got = model.embed(TEXTS, truncate=True)
        assert got.dtype == np.float32 and got.shape == (len(TEXTS), 384)
        cut = model.embed(TEXTS[:2], dimensions=64, truncate=True)
    out = tmp_path / "v.npy"
    proc = cli("embed", "--path", str(path), "--output", str(out), "--truncate", stdin=jsonl(TEXTS))
    assert proc.returncode == 0, proc.stderr
    assert np.load(out).tobytes() == got.tobytes()
    lines = cli_lines("embed", "--path", str(path), "--dimensions", "64", "--truncate", stdin=jsonl(TEXTS[:2]))
    assert [x["embedding"] for x in lines] == same(cut)
    reference = json.loads((path / "reference.json").read_text())
    assert reference  # the folder's own reference texts agree with the library too (tests/test_embeddings.py)


def test_embed_prompts_as_the_cli(shared_models):
    path = shared_models / "tiny-st-prompts"
    model = rsinfer_cli.load(path)
    got = model.embed(TEXTS[:3], prompt_name="query")
    lines = cli_lines("embed", "--path", str(path), "--prompt-name", "query", stdin=jsonl(TEXTS[:3]))
    assert [x["embedding"] for x in lines] == same(got)
    assert not np.array_equal(got, model.embed(TEXTS[:3], prompt=""))


def test_sparse_is_the_cli(shared_models):
    path = shared_models / "tiny-splade"
    model = rsinfer_cli.load(path)
    got = model.sparse(TEXTS, top_k=20, truncate=True)
    lines = cli_lines("sparse", "--path", str(path), "--top-k", "20", "--truncate", "--tokens", stdin=jsonl(TEXTS))
    assert [x["indices"] for x in lines] == same([v.indices for v in got])
    assert [x["values"] for x in lines] == same([v.values for v in got])
    assert [x["tokens"] for x in lines] == [model.tokens(v.indices) for v in got]
    assert all(len(v.indices) <= 20 and np.all(np.diff(v.indices) > 0) for v in got)


def test_colbert_is_the_cli(shared_models):
    path = shared_models / "tiny-colbert"
    model = rsinfer_cli.load(path)
    for query in (False, True):
        got = model.colbert(TEXTS[:4], is_query=query, truncate=True)
        args = ["--query"] if query else []
        lines = cli_lines("colbert", "--path", str(path), "--truncate", *args, stdin=jsonl(TEXTS[:4]))
        assert [x["vectors"] for x in lines] == same(list(got))


@pytest.mark.parametrize("folder", ["tiny-reranker-1", "tiny-colbert"])
def test_rerank_is_the_cli(shared_models, folder):
    path = shared_models / folder
    model = rsinfer_cli.load(path)
    got = model.rerank("overdue invoice", TEXTS, top_n=5, truncate=True)
    lines = cli_lines("rerank", "--path", str(path), "--query", "overdue invoice", "--top-n", "5", "--truncate",
                      stdin=jsonl(TEXTS))
    assert [(x["index"], x["score"]) for x in lines] == [(r.index, r.score) for r in got]
    assert [r.score for r in got] == sorted((r.score for r in got), reverse=True)
    pairs = model.score(["overdue invoice"] * len(TEXTS), TEXTS, truncate=True)
    assert [float(pairs[r.index]) for r in got] == pytest.approx([r.score for r in got], rel=1e-6)


def test_predict_is_the_cli(shared_models):
    path = shared_models / "tiny-textcls"
    model = rsinfer_cli.load(path)
    got = model.predict(TEXTS, top_k=2, truncate=True)
    lines = cli_lines("predict", "--path", str(path), "--top-k", "2", "--truncate", stdin=jsonl(TEXTS))
    assert [x["labels"] for x in lines] == same([[label._asdict() for label in r] for r in got])


def test_classify_is_the_cli(shared_models):
    path = shared_models / "tiny-nli"
    model = rsinfer_cli.load(path)
    got = model.classify(TEXTS[:4], ["billing", "travel", "security"])
    lines = cli_lines("classify", "--path", str(path), "--labels", "billing,travel,security", stdin=jsonl(TEXTS[:4]))
    assert [(x["labels"], x["scores"]) for x in lines] == [(r.labels, r.scores) for r in got]
    judged = model.classify(TEXTS[:4], question="Is this about money?")
    lines = cli_lines("classify", "--path", str(path), "--question", "Is this about money?", stdin=jsonl(TEXTS[:4]))
    assert [x["true_probability"] for x in lines] == [r.true_probability for r in judged]


@pytest.mark.parametrize("mode", ["mask", "replace", "hash"])
def test_redact_and_detect_are_the_cli(shared_models, mode):
    path = shared_models / "rampart-pii"
    model = rsinfer_cli.load(path)
    got = model.redact(TEXTS, mode=mode, salt="s3cret")
    lines = cli_lines("redact", "--path", str(path), "--mode", mode, "--hash-salt", "s3cret", "--spans",
                      stdin=jsonl(TEXTS))
    assert [x["text"] for x in lines] == [r.text for r in got]
    assert [x["pii_spans"]["text"] for x in lines] == same([[s.to_json() for s in r.spans] for r in got])
    assert any(r.spans for r in got) and "ana.souza@example.org" not in " ".join(r.text for r in got)
    found = model.detect(TEXTS)
    lines = cli_lines("detect", "--path", str(path), stdin=jsonl(TEXTS))
    assert [x["pii_spans"]["text"] for x in lines] == same([[e.to_json() for e in ents] for ents in found])


def test_pii_rules_and_model_keys(shared_models):
    model = rsinfer_cli.load(shared_models / "rampart-pii", pii_regions=["GB"])
    text = "ticket TCK-99812 for Ana"
    got = model.redact([text], mode="replace", patterns=[{"entity_type": "TICKET", "regex": r"TCK-\d{5}"}])
    assert got[0].text.startswith("ticket <TICKET>")
    assert model.redact([text], mode="replace", patterns=[{"entity_type": "TICKET", "regex": r"TCK-\d{5}"}],
                        allow=["TCK-99812"])[0].text.startswith("ticket TCK-99812")
    assert model.detect([text], deny={"TEAM": ["ana"]})[0][-1].entity_type == "TEAM"
    with pytest.raises(InputError, match=r"patterns\[0\]"):
        model.detect([text], patterns=[{"entity_type": "X"}])


def test_threads_and_batch_size_reach_the_model(shared_models):
    model = rsinfer_cli.load(shared_models / "all-minilm-l6-v2", threads=1, batch_size=8)
    assert model._loaded.config.intra_threads == 1 and model.pipeline.max_rows == 8
    assert model.chunk_rows == 64
    assert model.embed(TEXTS * 20).shape == (140, 384)       # several chunks, in order
    assert np.array_equal(model.embed(TEXTS * 20)[7:14], model.embed(TEXTS))
    with pytest.raises(ConfigError, match="threads must be >= 1, got 0"):
        rsinfer_cli.load(shared_models / "all-minilm-l6-v2", threads=0)


def test_a_caller_s_mistakes_are_typed_errors(shared_models):
    path = shared_models / "all-minilm-l6-v2"
    model = rsinfer_cli.load(path)
    assert model.kind == "embedding" and repr(model) == "<rsinfer Model 'all-minilm-l6-v2' (embedding)>"
    with pytest.raises(InputError, match=r"got one str \(wrap it: \[text\]\)"):
        model.embed("one text")
    with pytest.raises(InputError, match=r"`texts\[1\]` is int"):
        model.embed(["a", 3])
    with pytest.raises(ConfigError, match="redact\\(\\) needs a model of kind pii"):
        model.redact(["x"])
    with pytest.raises(ConfigError, match="poolling: not a key of a model of kind embedding"):
        rsinfer_cli.load(path, poolling="mean")
    with pytest.raises(ConfigError, match="give either path= or hf="):
        rsinfer_cli.load(path, hf="org/x")
    with pytest.raises(ConfigError, match="say which model: model= with config="):
        rsinfer_cli.load()
    with pytest.raises(InputError, match="dimensions"):
        model.embed(["a"], dimensions=100000)
    assert model.embed([]).shape == (0, 384)
    rerank = rsinfer_cli.load(shared_models / "tiny-reranker-1")
    with pytest.raises(InputError, match="one query per document"):
        rerank.score(["q"], ["a", "b"])


def test_config_entry_and_kind(shared_models, tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"models:\n  - name: m\n    kind: embedding\n    path: {shared_models / 'all-minilm-l6-v2'}\n"
                   "    max_len: 16\n  - name: p\n    kind: pii\n    path: "
                   f"{shared_models / 'rampart-pii'}\n")
    model = rsinfer_cli.load(config=cfg, model="m")
    assert model.name == "m" and model._loaded.config.max_len == 16
    with pytest.raises(ConfigError, match="several models are configured"):
        rsinfer_cli.load(config=cfg)
    assert rsinfer_cli.load(shared_models / "tiny-colbert", kind="late_interaction").kind == "late_interaction"


def test_help_reads_like_a_library():
    doc = rsinfer_cli.load.__doc__ or ""
    for key in ("path", "hf", "config", "threads", "batch_size", "model_keys"):
        assert key in doc
    for name in ("embed", "sparse", "colbert", "rerank", "score", "predict", "classify", "detect", "redact"):
        assert (getattr(rsinfer_cli.Model, name).__doc__ or "").strip(), name
