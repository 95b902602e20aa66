"""OpenVINO for real: in a venv where onnxruntime-openvino replaces onnxruntime (`make .venv-openvino`; CI builds
it and sets RSINFER_OPENVINO_PYTHON to its interpreter), `rsinfer bench --eps cpu,openvino` measures both providers,
`inspect` shows OpenVINO resolved, `serve` with it first in a model's providers answers with it - the vectors those
of all-MiniLM-L6-v2's reference - and the quality gate compares the CPU and OpenVINO providers. Skipped without the
venv; a failure with RSINFER_REQUIRE_OPENVINO=1 (CI)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from serverutil import ServeProcess, free_port

pytestmark = pytest.mark.shared


@pytest.fixture(scope="module")
def python() -> str:
    exe = os.environ.get("RSINFER_OPENVINO_PYTHON", "")
    if not exe or not Path(exe).exists():
        msg = "no OpenVINO venv (RSINFER_OPENVINO_PYTHON: a python with rsinfer and onnxruntime-openvino)"
        if os.environ.get("RSINFER_REQUIRE_OPENVINO") == "1":
            pytest.fail(msg + " and RSINFER_REQUIRE_OPENVINO=1", pytrace=False)
        pytest.skip(msg)
    probe = subprocess.run([exe, "-c", "import onnxruntime as o; print(o.get_available_providers())"],
                           capture_output=True, text=True, timeout=60)
    assert "OpenVINOExecutionProvider" in probe.stdout, probe.stdout + probe.stderr
    return exe


@pytest.fixture(scope="module")
def minilm(shared_models) -> Path:
    return shared_models / "all-minilm-l6-v2"


def rsinfer(python: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, "-m", "rsinfer_cli", *args], capture_output=True, text=True, timeout=600)


def test_bench_measures_both_providers(python, minilm):
    proc = rsinfer(python, "bench", "--path", str(minilm), "--eps", "cpu,openvino", "--batch-sizes", "1,8",
                   "--seq-lens", "16", "--repeats", "5", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["results"]
    by_ep = {(r["ep"], r.get("batch")): r for r in rows}
    assert {"cpu", "openvino"} == {r["ep"] for r in rows} and not any("skipped" in r for r in rows), rows
    assert by_ep[("openvino", 8)]["rows_per_s"] > 0 and by_ep[("cpu", 8)]["rows_per_s"] > 0


def test_inspect_and_serve_with_openvino_first(python, minilm, tmp_path):
    port = free_port()
    cfg = tmp_path / "ov.yaml"
    cfg.write_text(yaml.safe_dump({"server": {"bind": f"127.0.0.1:{port}"}, "models": [
        {"name": "mini", "kind": "embedding", "path": str(minilm), "eps": ["openvino", "cpu"]}]}))
    inspected = rsinfer(python, "inspect", "mini", "--config", str(cfg), "--json")
    assert inspected.returncode == 0, inspected.stderr
    assert json.loads(inspected.stdout)["execution_providers"]["resolved"][0] == "openvino"
    ref = json.loads((minilm / "reference.json").read_text())["cases"][:4]
    srv = ServeProcess(cfg, port, python=python)
    try:
        srv.wait_ready(180)
        cards = httpx.get(f"{srv.url}/v1/models", timeout=30).json()["data"]
        assert cards[0]["execution_providers"][0] == "openvino"
        got = httpx.post(f"{srv.url}/v1/embeddings", json={"model": "mini", "input": [c["text"] for c in ref]},
                         timeout=60).json()["data"]
    finally:
        srv.stop()
    for item, case in zip(got, ref, strict=True):
        assert float(np.dot(item["embedding"], case["embedding"])) > 0.9999       # OpenVINO's fp32 kernels


def test_the_quality_gate_compares_the_providers(python, minilm):
    proc = rsinfer(python, "bench", "--path", str(minilm), "--compare", "@cpu", "@openvino", "--min-cosine", "0.999",
                   "--min-recall", "0.98", "--speed-seconds", "0.5", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check = json.loads(proc.stdout)["check"]
    assert check["min_cosine"] > 0.999 and check["rows/s b b32"] > 0
