"""The command line's answers to bad input: the documented exit codes (2 usage, 5 model), never "internal error";
`quantize` never replaces a graph it did not write; warm-up shapes checked before anything is allocated."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rsinfer_cli.engine.warmup import _check_dims
from rsinfer_cli.errors import ModelLoadError

import synth


def rsinfer(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rsinfer_cli", *args], capture_output=True, text=True, timeout=300,
                          input=stdin)


@pytest.mark.shared
@pytest.mark.parametrize("flag", ["--patterns", "--allow"])
def test_a_non_utf8_rules_file_is_a_usage_error(shared_models, tmp_path, flag):
    bad = tmp_path / "rules.txt"
    bad.write_bytes(b"- entity_type: X\n  regex: \xff\xfe\n")
    r = rsinfer("detect", "--path", str(shared_models / "rampart-pii"), flag, str(bad), stdin="hello\n")
    assert r.returncode == 2, r.stderr
    assert "not UTF-8" in r.stderr and "internal error" not in r.stderr


@pytest.fixture
def folder(tmp_path) -> Path:
    return synth.add_graph(tmp_path / "m" / "model.onnx").parent


@pytest.mark.parametrize("content", [b"not an onnx graph at all", None], ids=["garbage", "truncated"])
def test_quantize_an_unreadable_graph_exits_5(folder, content):
    graph = folder / "model.onnx"
    graph.write_bytes(content if content is not None else graph.read_bytes()[:40])
    r = rsinfer("quantize", str(folder), "--dtype", "int8", "--no-check")
    assert r.returncode == 5, r.stderr
    assert "internal error" not in r.stderr


@pytest.mark.parametrize("out", ["/proc/rsinfer/x.onnx", "FILE/x.onnx"])
def test_quantize_into_a_place_it_cannot_write_exits_2(folder, out):
    if out.startswith("FILE"):
        (folder / "FILE").write_text("a file, not a folder")
        out = str(folder / out)
    r = rsinfer("quantize", str(folder), "--dtype", "int8", "--no-check", "--out", out)
    assert r.returncode == 2, r.stderr
    assert "cannot write" in r.stderr and "internal error" not in r.stderr


def test_quantize_never_replaces_a_shipped_graph_without_overwrite(folder, tmp_path):
    shipped = folder / "model_quantized.onnx"
    synth.add_graph(tmp_path / "other" / "model.onnx", 5.0)
    shutil.copy(tmp_path / "other" / "model.onnx", shipped)
    before = shipped.read_bytes()
    r = rsinfer("quantize", str(folder), "--dtype", "int8", "--no-check")
    assert r.returncode == 2 and "--overwrite" in r.stderr, r.stderr
    assert shipped.read_bytes() == before                              # the upstream graph is intact
    r = rsinfer("quantize", str(folder), "--dtype", "int8", "--no-check", "--overwrite")
    assert r.returncode == 0, r.stderr
    assert shipped.read_bytes() != before and f"wrote {shipped}" in r.stdout
    again = rsinfer("quantize", str(folder), "--dtype", "int8", "--no-check")   # its own output: no flag needed
    assert again.returncode == 0, again.stderr


@pytest.mark.parametrize(("dims", "says"), [((15000, 15000), "warmup.max_elements"),
                                            ((100_000, 100_000), "warmup.max_elements"),
                                            ((4, 3), "fixed at 2")])
def test_a_model_whose_warmup_is_too_large_does_not_load(tmp_path, dims, says):
    """The load refuses the warm-up shape, naming its key, before numpy allocates it (a [15000, 15000] warm-up
    loaded and kept 3.5 GB; [100000, 100000] failed on numpy's allocation with no word of the warm-up)."""
    from rsinfer_cli.config import parse_config
    from rsinfer_cli.engine.model import load_model

    width = dims[1] if says != "fixed at 2" else 2      # the graph takes the shape: only the bound refuses it
    folder = synth.add_graph(tmp_path / "m" / "model.onnx", width=width).parent
    cfg = parse_config({"models": [{"name": "m", "kind": "tensor", "path": str(folder), "replicas": 1,
                                    "warmup": {"inputs": {"X": {"dims": list(dims)}}}}]}).models[0]
    with pytest.raises(ModelLoadError, match=says):
        load_model(cfg)


def test_warmup_dims_checked_before_allocation():
    with pytest.raises(ModelLoadError, match=r"warmup.max_elements"):
        _check_dims("X", ("batch", "n"), (100_000, 100_000), 16_777_216)
    with pytest.raises(ModelLoadError, match=r"warmup.inputs.X.dims: \[2\] has 1 dimensions; the input has 2"):
        _check_dims("X", ("batch", 2), (2,), 16_777_216)
    with pytest.raises(ModelLoadError, match=r"warmup.inputs.X.dims\[1\]: 3, but the input's dimension 1 is fixed"):
        _check_dims("X", ("batch", 2), (1, 3), 16_777_216)
    _check_dims("X", ("batch", 2), (8, 2), 16_777_216)
