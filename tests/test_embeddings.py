"""Embedding parity with sentence-transformers (all-MiniLM-L6-v2) and the decoder embedder (tiny-qwen-embed),
through the pipeline, `rsinfer embed` and HTTP; plus pooling unit tests on synthetic arrays."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from rsinfer_cli.config import ModelConfig
from rsinfer_cli.engine.model import load_model
from rsinfer_cli.errors import InputError
from rsinfer_cli.pipelines.embedding import EmbeddingPipeline, pool
from rsinfer_cli.pipelines.stmodules import Pooling

import synth

FP32_COS, FP32_ABS = 0.9999, 1e-4          # models README: measured 0.9999995 / 8e-7
INT8_COS = 0.97                             # models README: measured min 0.978 on AVX2 without VNNI


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def minilm_ref(shared_models) -> dict:
    return json.loads((shared_models / "all-minilm-l6-v2" / "reference.json").read_text())


@pytest.fixture(scope="module")
def minilm(shared_models) -> EmbeddingPipeline:
    cfg = ModelConfig(name="mini", kind="embedding", path=str(shared_models / "all-minilm-l6-v2"), replicas=1)
    return EmbeddingPipeline(load_model(cfg))


class TestPooling:
    def test_modes(self):
        h = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)
        mask = np.array([[1, 1, 0], [1, 1, 1]])
        assert pool(h, mask, "cls").tolist() == [[0, 1], [6, 7]]
        assert pool(h, mask, "last").tolist() == [[2, 3], [10, 11]]  # mask [1,1,0] → token 1
        assert pool(h, mask, "mean").tolist() == [[1, 2], [8, 9]]
        assert pool(h, np.zeros((2, 3)), "mean").tolist() == [[0, 0], [0, 0]]  # all-zero mask divides by 1

    @pytest.mark.parametrize(("cfg", "modes"), [
        ({}, ("mean",)), ({"pooling_mode_cls_token": True}, ("cls",)), ({"pooling_mode_lasttoken": True}, ("last",)),
        ({"pooling_mode_mean_tokens": True}, ("mean",)), ({"pooling_mode_max_tokens": True}, ("max",)),
        ({"pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True}, ("mean",)),
        # several flags: concatenated in sentence-transformers' legacy order, whatever order the file lists them in
        ({"pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": True}, ("max", "mean")),
        ({"pooling_mode": "lasttoken"}, ("last",)), ({"pooling_mode": ["mean", "cls"]}, ("mean", "cls")),
        ({"pooling_mode": "weightedmean", "pooling_mode_cls_token": True}, ("weightedmean",)),
    ])
    def test_from_sentence_transformers_config(self, cfg, modes):
        assert Pooling.from_config(cfg, "1_Pooling/config.json").modes == modes

    def test_unknown_pooling_mode_is_refused(self):
        with pytest.raises(ValueError, match="unknown pooling mode 'median'"):
            Pooling.from_config({"pooling_mode": "median"}, "1_Pooling/config.json")

    def test_pooling_in_graph_is_checked_against_the_output(self, tmp_path):
        from rsinfer_cli.config import parse_config
        from rsinfer_cli.errors import ModelLoadError

        root = synth.write_model_dir(tmp_path / "m")          # last_hidden_state [batch, seq, dim]: not pooled

        def with_key(value):
            return parse_config({"models": [{"name": "m", "kind": "embedding", "path": str(root), "replicas": 1,
                                             "pooling_in_graph": value}]}).models[0]

        assert EmbeddingPipeline(load_model(with_key(False))).pooled_in_graph is False   # agrees: loads
        with pytest.raises(ModelLoadError, match=r"pooling_in_graph is true but the graph's output "
                                                 r"'last_hidden_state' has shape \[.*\]: not pooled"):
            EmbeddingPipeline(load_model(with_key(True)))

    def test_synthetic_graph_end_to_end(self, tmp_path):
        root = synth.write_model_dir(tmp_path / "m", pooling="pooling_mode_cls_token")
        pipe = EmbeddingPipeline(load_model(ModelConfig(name="m", kind="embedding", path=str(root), replicas=1)))
        table = synth.embedding_table()
        res = pipe.embed(["hello world", "cat"])
        cls = table[2] / np.linalg.norm(table[2])
        assert np.allclose(res.vectors, [cls, cls], atol=1e-6)
        assert res.tokens == 4 + 3
        raw = pipe.embed(["hello world"], normalize=False).vectors[0]
        assert np.allclose(raw, table[2], atol=1e-6)


@pytest.mark.shared
class TestMiniLMParity:
    def test_fp32_matches_sentence_transformers(self, minilm, minilm_ref):
        cases = minilm_ref["cases"]
        res = minilm.embed([c["text"] for c in cases])
        worst = min(cosine(v, np.array(c["embedding"])) for v, c in zip(res.vectors, cases, strict=True))
        assert worst >= FP32_COS
        assert np.abs(res.vectors - np.array([c["embedding"] for c in cases])).max() <= FP32_ABS
        assert res.truncated == sum(c["truncated"] for c in cases) == 1

    def test_max_len_wins_over_tokenizer_preset(self, minilm, minilm_ref):
        long = next(c for c in minilm_ref["cases"] if c["truncated"])
        enc = minilm.encode([long["text"]])
        assert enc.ids[0] == long["input_ids"] and len(enc.ids[0]) == 256

    def test_unnormalized(self, minilm, minilm_ref):
        cases = minilm_ref["cases"]
        raw = minilm.embed([c["text"] for c in cases], normalize=False).vectors
        assert np.abs(raw - np.array([c["embedding_unnormalized"] for c in cases])).max() <= FP32_ABS

    def test_matryoshka_dimensions(self, minilm, minilm_ref):
        cases = minilm_ref["matryoshka"]
        res = minilm.embed([c["text"] for c in cases], dimensions=cases[0]["dimensions"])
        assert res.vectors.shape == (len(cases), cases[0]["dimensions"])
        assert np.abs(res.vectors - np.array([c["embedding"] for c in cases])).max() <= FP32_ABS

    def test_batched_equals_one_at_a_time(self, minilm, minilm_ref):
        texts = [c["text"] for c in minilm_ref["cases"]]
        together = minilm.embed(texts).vectors
        alone = np.stack([minilm.embed([t]).vectors[0] for t in texts])
        assert np.abs(together - alone).max() <= 1e-5

    def test_token_ids_reproduce_text(self, minilm, minilm_ref):
        case = minilm_ref["cases"][1]
        by_ids = minilm.embed(ids=[case["input_ids"]]).vectors[0]
        assert cosine(by_ids, np.array(case["embedding"])) >= FP32_COS
        with pytest.raises(InputError, match=r"input\[0\] has token id 999999 outside the vocabulary"):
            minilm.embed(ids=[[101, 999999, 102]])
        assert minilm.embed(ids=[[101] * 300]).truncated == 1

    def test_dimensions_out_of_range(self, minilm):
        for bad in (0, 385):
            with pytest.raises(InputError, match="`dimensions` must be between 1 and 384"):
                minilm.embed(["x"], dimensions=bad)

    def test_int8_within_documented_tolerance(self, shared_models, minilm_ref):
        cfg = ModelConfig(name="q", kind="embedding", path=str(shared_models / "all-minilm-l6-v2"), dtype="int8",
                          replicas=1)
        pipe = EmbeddingPipeline(load_model(cfg))
        assert pipe.model.resolved.graph_file == "onnx/model_quantized.onnx"
        cases = minilm_ref["cases"]
        res = pipe.embed([c["text"] for c in cases])
        assert min(cosine(v, np.array(c["embedding"])) for v, c in zip(res.vectors, cases, strict=True)) >= INT8_COS


@pytest.mark.shared
def test_decoder_embedder_last_token_with_kv_cache(shared_models):
    ref = json.loads((shared_models / "tiny-qwen-embed" / "reference.json").read_text())
    cfg = ModelConfig(name="qwen", kind="embedding", path=str(shared_models / "tiny-qwen-embed"), replicas=1)
    pipe = EmbeddingPipeline(load_model(cfg))
    assert pipe.pooling == "last"
    cases = ref["cases"]
    res = pipe.embed([c["text"] for c in cases])  # mixed lengths: right padding, per-row last token
    assert np.abs(res.vectors - np.array([c["embedding"] for c in cases])).max() <= 1e-4
    assert pipe.encode([cases[0]["text"]]).ids[0] == cases[0]["input_ids"]


# ---------------------------------------------------------------- rsinfer embed


def run_embed(*args: str, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rsinfer_cli", "embed", *args], input=stdin, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.shared
class TestEmbedCli:
    def test_jsonl_parity_order_and_fields(self, shared_models, minilm_ref):
        cases = minilm_ref["cases"]
        lines = "".join(json.dumps({"id": c["id"], "meta": {"k": i}, "text": c["text"]}) + "\n"
                        for i, c in enumerate(cases))
        proc = run_embed("--path", str(shared_models / "all-minilm-l6-v2"), "--batch-size", "4", stdin=lines)
        assert proc.returncode == 0, proc.stderr
        out = [json.loads(line) for line in proc.stdout.splitlines()]
        assert [o["index"] for o in out] == list(range(len(cases)))
        assert [o["id"] for o in out] == [c["id"] for c in cases]
        assert out[3]["meta"] == {"k": 3} and out[3]["text"] == cases[3]["text"]
        worst = min(cosine(np.array(o["embedding"]), np.array(c["embedding"])) for o, c in zip(out, cases, strict=True))
        assert worst >= FP32_COS

    def test_arguments_plain_lines_and_npy(self, shared_models, minilm_ref, tmp_path):
        texts = [c["text"] for c in minilm_ref["cases"] if "\n" not in c["text"]]
        path = str(shared_models / "all-minilm-l6-v2")
        by_args = run_embed("--path", path, *texts[:2])
        assert [json.loads(x)["index"] for x in by_args.stdout.splitlines()] == [0, 1]
        src = tmp_path / "in.txt"
        src.write_text("\n".join(texts) + "\n")
        npy = tmp_path / "v.npy"
        proc = run_embed("--path", path, "--input", str(src), "--output", str(npy), "--dimensions", "64")
        assert proc.returncode == 0, proc.stderr
        arr = np.load(npy)
        assert arr.shape == (len(texts), 64) and arr.dtype == np.float32
        assert np.allclose(np.linalg.norm(arr, axis=1), 1, atol=1e-5)

    def test_bad_line_names_its_number(self, shared_models):
        proc = run_embed("--path", str(shared_models / "all-minilm-l6-v2"),
                         stdin='{"text": "ok"}\n{"text": "ok"}\n{"txt": "no"}\n')
        assert proc.returncode == 3
        assert "<stdin>: line 3: no field 'text' (use --field)" in proc.stderr
        proc = run_embed("--path", str(shared_models / "all-minilm-l6-v2"), stdin='{"text": "ok"}\n{nope\n')
        assert proc.returncode == 3 and "line 2: not valid JSON" in proc.stderr

    def test_dotted_field(self, shared_models):
        proc = run_embed("--path", str(shared_models / "all-minilm-l6-v2"), "--field", "msg.body",
                         stdin='{"msg": {"body": "hello"}}\n')
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["msg"] == {"body": "hello"}

    def test_streams_before_input_ends(self, shared_models):
        """Output for the first records arrives while stdin is still open: constant memory on any input size."""
        with subprocess.Popen([sys.executable, "-m", "rsinfer_cli", "embed", "--path",
                               str(shared_models / "all-minilm-l6-v2"), "--batch-size", "8"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True) as proc:
            self._stream_check(proc)

    @staticmethod
    def _stream_check(proc: subprocess.Popen) -> None:
        try:
            assert proc.stdin and proc.stdout
            for i in range(64):  # two chunks of 32 (batch-size 8 × 4)
                proc.stdin.write(f"line number {i}\n")
            proc.stdin.flush()
            deadline = time.monotonic() + 60
            first = proc.stdout.readline()  # blocks until the first chunk is embedded
            assert time.monotonic() < deadline
            assert json.loads(first)["index"] == 0
            proc.stdin.close()
            rest = proc.stdout.read().splitlines()
            assert len(rest) == 63 and json.loads(rest[-1])["index"] == 63
            assert proc.wait(60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)

    def test_no_input_is_a_usage_error(self, shared_models, tmp_path):
        proc = run_embed("--path", str(shared_models / "all-minilm-l6-v2"), "--input", str(tmp_path / "nope.txt"))
        assert proc.returncode == 2 and "no such file" in proc.stderr
