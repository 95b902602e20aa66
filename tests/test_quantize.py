"""`rsinfer quantize` and the quality gate: int8 and fp16 of all-MiniLM-L6-v2, a reranker and the PII model are
written beside the original (in a scratch copy: ../shared is read-only), load with `dtype:`, serve, and pass the gate
at the bars docs/faster.md documents; a graph with scrambled weights fails it (exit 7); `bench --compare`; external
data; what is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from rsinfer_cli.config import parse_config
from rsinfer_cli.errors import ConfigError

from serverutil import ServerThread

pytest.importorskip("onnx")
pytest.importorskip("sympy")

# the bars docs/faster.md documents, per model and dtype (measured: see the note on each)
BARS = {
    ("all-minilm-l6-v2", "int8"): ["--min-cosine", "0.97", "--min-recall", "0.9"],   # min 0.985, recall 0.95
    ("all-minilm-l6-v2", "fp16"): ["--min-cosine", "0.999", "--min-recall", "0.98"],  # 1.0000, 0.999
    ("tiny-reranker-1", "int8"): ["--min-rho", "0.9", "--min-agreement", "0.85"],     # mean rho 0.94, top-1 0.92
    ("tiny-reranker-1", "fp16"): ["--min-rho", "0.99", "--min-agreement", "0.95"],    # 0.9995, 1.0
    ("rampart-pii", "int8"): ["--min-f1", "0.98"],                                   # 1.0 over 174 spans
    ("rampart-pii", "fp16"): ["--min-f1", "0.98"],                                   # 1.0
}
NAMES = {"int8": "model_quantized.onnx", "fp16": "model_fp16.onnx"}


def scratch(shared_models: Path, name: str, root: Path) -> Path:
    """A copy of a shared model folder made of links, without any graph rsinfer quantize would write."""
    src, dst = shared_models / name, root / name
    for f in src.rglob("*"):
        if f.is_file() and f.name not in NAMES.values():
            (dst / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            (dst / f.relative_to(src)).symlink_to(f)
    return dst


def rsinfer(*args: str, timeout: int = 300, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rsinfer_cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


@pytest.fixture(scope="module")
def models(shared_models, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("quantize")
    for name in {n for n, _ in BARS}:
        scratch(shared_models, name, root)
    return root


@pytest.mark.shared
@pytest.mark.parametrize(("name", "dtype"), list(BARS), ids=lambda v: str(v))
def test_written_beside_the_original_and_passing_the_gate(models, name, dtype, tmp_path):
    folder = models / name
    before = {p.name for p in folder.rglob("*.onnx")}
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    proc = rsinfer("quantize", str(folder), "--dtype", dtype, "--json", "--speed-seconds", "0.2", *BARS[(name, dtype)],
                   cwd=cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)                       # stdout is the JSON alone (the converters print elsewhere)
    assert Path(out["output"]).name == NAMES[dtype] and Path(out["output"]).parent == Path(out["source"]).parent
    assert Path(out["source"]).name in before and NAMES[dtype] not in before      # the original is untouched
    assert out["gate"] == {"passed": True, "failed": []}
    assert out["bytes"] < out["source_bytes"] or name == "rampart-pii"             # already 4-bit: about the same
    assert out["check"]["b / a b1"] > 0 and out["check"]["b / a b32"] > 0
    assert not list(folder.rglob(".rsinfer-quantize-*"))                      # no scratch left behind
    assert not list(cwd.iterdir())         # nor the converters' temporary graph and weights in the working directory


@pytest.mark.shared
def test_the_written_graphs_load_with_dtype_and_serve(models):
    for name, dtype in BARS:
        if not (models / name / "onnx" / NAMES[dtype]).exists():
            pytest.skip("runs after the quantize tests of this module")
    kinds = {"all-minilm-l6-v2": "embedding", "tiny-reranker-1": "rerank", "rampart-pii": "pii"}
    entries = [{"name": f"{kinds[n]}-{d}", "kind": kinds[n], "path": str(models / n), "dtype": d}
               for n, d in BARS]
    with ServerThread(parse_config({"models": entries})) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        cards = {m["id"]: m for m in c.get("/v1/models").json()["data"]}
        for n, d in BARS:
            assert cards[f"{kinds[n]}-{d}"]["graph_file"].endswith(NAMES[d]), cards[f"{kinds[n]}-{d}"]
        emb = c.post("/v1/embeddings", json={"model": "embedding-int8", "input": ["hello world"]})
        assert emb.status_code == 200 and len(emb.json()["data"][0]["embedding"]) == 384
        rr = c.post("/v1/rerank", json={"model": "rerank-fp16", "query": "q", "documents": ["a", "b"]})
        assert rr.status_code == 200 and len(rr.json()["results"]) == 2
        pii = c.post("/pii/detect", json={"model": "pii-int8", "text": "Mail Jane Doe at jane.doe@example.com today"})
        assert pii.status_code == 200, pii.text


def scrambled(source: Path, dest: Path) -> None:
    """The graph with every large weight matrix's values shuffled (fixed seed): same shapes, a broken model."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(source))
    rng = np.random.default_rng(0)
    for i, t in enumerate(model.graph.initializer):
        arr = numpy_helper.to_array(t)
        if arr.dtype == np.float32 and arr.size > 10_000:
            flat = arr.reshape(-1).copy()
            rng.shuffle(flat)
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(flat.reshape(arr.shape), t.name))
    onnx.save(model, str(dest))


@pytest.mark.shared
def test_a_broken_graph_fails_the_gate(shared_models, tmp_path):
    folder = scratch(shared_models, "all-minilm-l6-v2", tmp_path)
    scrambled(folder / "onnx" / "model.onnx", folder / "onnx" / "broken.onnx")
    proc = rsinfer("bench", "--path", str(folder), "--compare", "onnx/model.onnx", "onnx/broken.onnx",
                   "--min-cosine", "0.9", "--speed-seconds", "0", "--json")
    assert proc.returncode == 7, proc.stdout + proc.stderr
    assert "quality gate failed: min_cosine" in proc.stderr
    out = json.loads(proc.stdout)
    assert out["gate"]["passed"] is False and out["check"]["min_cosine"] < 0.9


@pytest.mark.shared
def test_bench_compare_across_providers_and_on_a_tensor_model(shared_models):
    same = rsinfer("bench", "--path", str(shared_models / "tensor-models" / "add_one"), "--compare", "@cpu", "@cpu",
                   "--max-error", "0", "--speed-seconds", "0.1", "--json")
    assert same.returncode == 0, same.stderr
    check = json.loads(same.stdout)["check"]
    assert check["kind"] == "tensor" and check["max_abs_error"] == 0 and "rows/s b b32" in check
    wrong = rsinfer("bench", "--path", str(shared_models / "tensor-models" / "add_one"), "--compare", "@cpu",
                    "@cpu", "--min-cosine", "0.9", "--speed-seconds", "0")
    assert wrong.returncode == 2 and "gates min_cosine, which a tensor model's check does not measure" in wrong.stderr
    bad = rsinfer("bench", "--path", str(shared_models / "tensor-models" / "add_one"), "--compare", "@cpu", "@gpu")
    assert bad.returncode == 2 and "unknown execution provider 'gpu'" in bad.stderr


def test_external_data_graphs_stay_external(tmp_path):
    """A graph with external data (what a > 2 GB graph must have) is converted with its weights external too."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from rsinfer_cli.engine.quantize import quantize

    rng = np.random.default_rng(1)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 32])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (tmp_path / "onnx").mkdir()
    src = tmp_path / "onnx" / "model.onnx"
    onnx.save(model, str(src), save_as_external_data=True, location="model.onnx_data", size_threshold=0)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    for dtype, name in (("int8", "model_quantized.onnx"), ("fp16", "model_fp16.onnx")):
        done = quantize(src, dtype)
        assert done.output == tmp_path / "onnx" / name
        assert (tmp_path / "onnx" / f"{name}_data").exists() and done.bytes > done.output.stat().st_size
        y = ort.InferenceSession(str(done.output), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_allclose(y, x @ w, atol=0.5 if dtype == "int8" else 0.05)


def test_what_is_refused(tmp_path, monkeypatch):
    import importlib.util

    from rsinfer_cli.engine import quantize as q

    src = tmp_path / "model.onnx"
    src.write_bytes(b"")
    with pytest.raises(ConfigError, match="is the source graph; rsinfer quantize never writes over it"):
        q.output_path(src, "int8", False, src)
    with pytest.raises(ConfigError, match="--dtype must be int8 or fp16"):
        q.output_path(src, "fp32", False)
    with pytest.raises(ConfigError, match="--out must end in .onnx"):
        q.output_path(src, "int8", False, tmp_path / "x.bin")
    typo = rsinfer("quantize", str(tmp_path), "--dtype", "int8", "--kind", "embeddings")
    assert typo.returncode == 2 and "Invalid value for '--kind': 'embeddings' is not one of" in typo.stderr
    assert not (tmp_path / "model_quantized.onnx").exists()            # refused before any conversion
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sympy" else real(name, *a))
    with pytest.raises(ConfigError, match=r"needs the sympy package: pip install 'rsinfer\[quantize\]'"):
        q.require_onnx()


def test_progress_on_a_terminal(tmp_path):
    """On a terminal, quantize shows each long step (rich, on stderr): the conversion, then the check's loading,
    comparing and timing, each with its elapsed time; in a pipe (every other test) nothing but the result."""
    import os
    import pty
    import select
    import time

    import synth

    folder = synth.write_model_dir(tmp_path / "m")
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "rsinfer_cli", "quantize", str(folder), "--dtype", "fp16",
                             "--speed-seconds", "0.1", "--json"], stdout=subprocess.PIPE, stderr=slave,
                            stdin=subprocess.DEVNULL, env={**os.environ, "TERM": "xterm", "COLUMNS": "160"})
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:       # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, seen.decode(errors="replace")
    assert json.loads(out)["check"]["kind"] == "embedding"
    screen = seen.decode("utf-8", errors="replace")
    for step in ("converting model.onnx to fp16", "loading both graphs", "comparing the two graphs on 300 texts",
                 "timing both graphs (0.1 s per batch size and round)"):
        assert step in screen, screen[-2000:]
