"""int8, uint8, binary and ubinary vectors (pipelines/outtypes.py) against sentence-transformers' own
quantize_embeddings (tests/fixtures/st-quantize.json, built by build_quantize_reference.py over the shared MiniLM
vectors), through the Cohere and OpenAI SDKs, the Python API and the CLI, with a model's calibration file."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rsinfer_cli.errors import InputError, ModelLoadError
from rsinfer_cli.pipelines.outtypes import Ranges, quantize

FIXTURE = Path(__file__).parent / "fixtures" / "st-quantize.json"
TEXTS = ["How do I reset my password?", "The cat sat on the mat.", "Paris is the capital of France.",
         "A completely different sentence about the weather, which is sunny."]


@pytest.fixture(scope="module")
def st():
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


def test_every_type_is_sentence_transformers(st):
    vectors = np.array(st["vectors"], dtype=np.float32)
    cases = st["cases"]
    for t in ("binary", "ubinary"):
        assert quantize(vectors, t).tolist() == cases[t], t
    for t in ("int8", "uint8"):
        assert quantize(vectors, t).tolist() == cases[f"{t}_unit"], t
        calibrated = Ranges.calibrated(vectors, "the vectors")
        assert quantize(vectors, t, calibrated).tolist() == cases[f"{t}_calibrated"], t
    assert quantize(vectors, "binary").dtype == np.int8 and quantize(vectors, "ubinary").shape == (len(vectors), 48)


def test_out_of_range_values_saturate_and_bad_types_are_refused():
    ranges = Ranges.calibrated(np.array([[0.0, 0.0], [0.5, 0.5]], dtype=np.float32), "two")
    got = quantize(np.array([[-1.0, 1.0]], dtype=np.float32), "int8", ranges)
    assert got.tolist() == [[-128, 127]]                     # saturated, as sentence-transformers clips
    with pytest.raises(InputError, match="unknown embedding type 'int4'"):
        quantize(np.zeros((1, 4), np.float32), "int4")
    with pytest.raises(InputError, match="ranges are for 2 dimensions"):
        quantize(np.zeros((1, 4), np.float32), "int8", ranges)


@pytest.mark.shared
def test_the_sdks_read_every_type(shared_models, tmp_path):
    import cohere
    import httpx
    import openai

    from rsinfer_cli.config import parse_config

    from serverutil import ServerThread

    folder = str(shared_models / "all-minilm-l6-v2")
    calib = tmp_path / "calibration.npy"
    rng = np.random.default_rng(7)
    sample = rng.normal(size=(64, 384)).astype(np.float32)
    np.save(calib, sample / np.linalg.norm(sample, axis=1, keepdims=True) * 0.5)
    cfg = parse_config({"models": [{"name": "mini", "kind": "embedding", "path": folder, "replicas": 1},
                                   {"name": "calibrated", "kind": "embedding", "path": folder, "replicas": 1,
                                    "quantization_calibration": str(calib)}]})
    with ServerThread(cfg) as srv, httpx.Client() as http:
        oa = openai.OpenAI(api_key="unused", base_url=srv.url + "/v1", http_client=http)
        floats = np.array([d.embedding for d in oa.embeddings.create(model="mini", input=TEXTS,
                                                                     encoding_format="float").data], np.float32)
        co = cohere.ClientV2(api_key="unused", base_url=srv.url, httpx_client=http)
        for model, ranges in (("mini", None), ("calibrated", Ranges.load(calib, 384))):
            e = co.embed(model=model, texts=TEXTS, input_type="search_document",
                         embedding_types=["int8", "uint8", "binary", "ubinary"]).embeddings
            for t in ("int8", "uint8", "binary", "ubinary"):
                assert np.array_equal(np.array(getattr(e, t)), quantize(floats, t, ranges)), (model, t)
        for t in ("int8", "ubinary"):
            ints = oa.embeddings.create(model="mini", input=TEXTS, encoding_format="float",
                                        extra_body={"embedding_type": t}).data
            assert np.array_equal(np.array([d.embedding for d in ints]), quantize(floats, t)), t
            packed = oa.embeddings.create(model="mini", input=TEXTS, encoding_format="base64",
                                          extra_body={"embedding_type": t}).data
            raw = np.array([np.frombuffer(base64.b64decode(d.embedding), quantize(floats, t).dtype) for d in packed])
            assert np.array_equal(raw, quantize(floats, t)), t
        bad = http.post(srv.url + "/v1/embeddings", json={"input": "x", "embedding_type": "int4"})
        assert bad.status_code == 400


@pytest.mark.shared
def test_the_api_and_the_cli_write_each_precision(shared_models, tmp_path):
    import rsinfer_cli

    folder = shared_models / "all-minilm-l6-v2"
    with rsinfer_cli.load(folder) as model:
        floats = model.embed(TEXTS)
        for t in ("int8", "uint8", "binary", "ubinary"):
            assert np.array_equal(model.embed(TEXTS, precision=t), quantize(floats, t)), t
        with pytest.raises(InputError, match="`precision` must be"):
            model.embed(TEXTS, precision="int4")
    out = tmp_path / "v.npy"
    proc = subprocess.run([sys.executable, "-m", "rsinfer_cli", "embed", "--path", str(folder), "--precision",
                           "ubinary", "-o", str(out), *TEXTS], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert np.array_equal(np.load(out), quantize(floats, "ubinary")) and "uint8" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "rsinfer_cli", "embed", "--path", str(folder), "--precision",
                           "int8", *TEXTS], capture_output=True, text=True, timeout=120)
    got = np.array([json.loads(line)["embedding"] for line in proc.stdout.splitlines()])
    assert np.array_equal(got, quantize(floats, "int8"))


@pytest.mark.shared
def test_a_calibration_file_that_does_not_fit_is_a_load_error(shared_models, tmp_path):
    import rsinfer_cli

    np.save(tmp_path / "narrow.npy", np.ones((4, 8), np.float32) * np.arange(4)[:, None])
    with pytest.raises(ModelLoadError, match="vectors of 8 dimensions; the model's are 384"):
        rsinfer_cli.load(shared_models / "all-minilm-l6-v2", quantization_calibration=str(tmp_path / "narrow.npy"))
