"""Changing the served models at run time, and the Triton extensions its clients call: the KServe v2 repository
extension (index, load, unload) and Triton's statistics with the real tritonclient over HTTP and gRPC, readiness
that follows a model's state, `warmup:`, and what `server.model_control: false` refuses. The SIGHUP reload through
real `rsinfer serve` processes is in test_reload.py."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper

from rsinfer_cli.config import load_config

from serverutil import ServerThread
from synth import add_graph

SERVE_MODES = ("single", "workers")


def simple_graph(path: Path) -> Path:
    """Triton's `simple` model: INPUT0, INPUT1 INT32 [batch, 16] → OUTPUT0 = sum, OUTPUT1 = difference."""
    ins = [helper.make_tensor_value_info(n, TensorProto.INT32, ["batch", 16]) for n in ("INPUT0", "INPUT1")]
    outs = [helper.make_tensor_value_info(n, TensorProto.INT32, ["batch", 16]) for n in ("OUTPUT0", "OUTPUT1")]
    nodes = [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
             helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])]
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(helper.make_graph(nodes, "simple", ins, outs),
                                opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))
    return path


def write_config(path: Path, models: list[dict], **server) -> Path:
    path.write_text(yaml.safe_dump({"server": {"model_control": True, **server}, "models": models}))
    return path


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("control")
    return {"simple": simple_graph(root / "simple" / "model.onnx").parent,
            "plus1": add_graph(root / "plus1" / "model.onnx", 1.0).parent,
            "plus2": add_graph(root / "plus2" / "model.onnx", 2.0).parent,
            "root": root}


@pytest.fixture(scope="module")
def server(folders, serve_mode, tmp_path_factory):
    cfg = write_config(tmp_path_factory.mktemp("cfg") / "rsinfer.yaml", [
        {"name": "simple", "kind": "tensor", "path": str(folders["simple"]), "max_batch_size": 8, "replicas": 1},
        {"name": "counted", "kind": "tensor", "path": str(folders["simple"]), "max_batch_size": 8, "replicas": 1},
        {"name": "adder", "kind": "tensor", "path": str(folders["plus1"]), "max_batch_size": 8, "replicas": 1,
         "warmup": 2},
    ])
    with ServerThread(load_config(cfg), grpc=True, mode=serve_mode) as srv:
        srv.config_path = cfg
        yield srv


def simple_inputs(module, batch: int = 1):
    a = np.arange(16 * batch, dtype=np.int32).reshape(batch, 16)
    b = np.ones((batch, 16), dtype=np.int32)
    inputs = [module.InferInput("INPUT0", [batch, 16], "INT32"), module.InferInput("INPUT1", [batch, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs, a, b


def add_request(url: str, model: str) -> httpx.Response:
    return httpx.post(f"{url}/v2/models/{model}/infer", json={"inputs": [
        {"name": "X", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 1.0]}]}, timeout=30)


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_repository_index_unload_load_over_tritonclient(server, transport):
    """tritonclient's model-control calls as Triton's clients make them: the index lists every configured model
    with its state; unload makes the model unready (and its requests a 404 that says why), load brings it back
    and it infers again."""
    if transport == "grpc":
        import tritonclient.grpc as t

        client = t.InferenceServerClient(server.grpc_url)
        index = client.get_model_repository_index(as_json=True)["models"]
    else:
        import tritonclient.http as t

        client = t.InferenceServerClient(server.url.removeprefix("http://"))
        index = client.get_model_repository_index()
    from tritonclient.utils import InferenceServerException

    states = {m["name"]: m["state"] for m in index}
    assert states == {"simple": "READY", "counted": "READY", "adder": "READY"}
    client.unload_model("simple")
    assert not client.is_model_ready("simple") and client.is_model_ready("counted")
    inputs, a, b = simple_inputs(t)
    with pytest.raises(InferenceServerException, match="not available: unloaded"):
        client.infer("simple", inputs)
    index = client.get_model_repository_index(as_json=True)["models"] if transport == "grpc" else \
        client.get_model_repository_index()
    entry = next(m for m in index if m["name"] == "simple")
    assert entry["state"] == "UNAVAILABLE" and "unloaded" in entry["reason"]
    ready_only = httpx.post(server.url + "/v2/repository/index", json={"ready": True}).json()
    assert "simple" not in {m["name"] for m in ready_only}
    client.load_model("simple")
    assert client.is_model_ready("simple")
    result = client.infer("simple", inputs)
    assert np.array_equal(result.as_numpy("OUTPUT0"), a + b) and np.array_equal(result.as_numpy("OUTPUT1"), a - b)
    metrics = httpx.get(server.url + "/metrics").text
    assert 'rsinfer_model_state{model="simple",state="READY"} 1.0' in metrics
    assert 'rsinfer_model_state{model="simple",state="UNAVAILABLE"} 0.0' in metrics
    loads = float(re.search(r'rsinfer_model_loads_total{model="simple",result="success"} ([0-9.]+)', metrics)[1])
    assert loads >= 2                                                  # the start and this load
    assert "rsinfer_model_load_duration_seconds_count{model=\"simple\"}" in metrics
    with pytest.raises(InferenceServerException, match="not in"):
        client.load_model("nope")
    with pytest.raises(InferenceServerException, match="not in the configuration"):
        client.unload_model("nope")


def test_statistics_count_the_requests_sent(server):
    """get_inference_statistics over HTTP and gRPC: success and inference counts equal the requests sent (each of
    one row), executions at most that (batching may join them), the stage times are there, and a version and the
    whole server can be asked for."""
    import tritonclient.grpc as tg
    import tritonclient.http as th

    http = th.InferenceServerClient(server.url.removeprefix("http://"))
    grpc = tg.InferenceServerClient(server.grpc_url)
    before = http.get_inference_statistics("counted")["model_stats"][0]
    for _ in range(5):
        http.infer("counted", simple_inputs(th)[0])
    for _ in range(3):
        grpc.infer("counted", simple_inputs(tg)[0])
    http.infer("counted", simple_inputs(th, batch=4)[0])             # one request of four rows
    stats = http.get_inference_statistics("counted")["model_stats"]
    assert len(stats) == 1 and stats[0]["name"] == "counted" and stats[0]["version"] == "1"
    s = stats[0]
    infer = s["inference_stats"]
    assert infer["success"]["count"] - before["inference_stats"]["success"]["count"] == 9
    assert infer["success"]["ns"] > before["inference_stats"]["success"]["ns"]
    assert s["inference_count"] - before["inference_count"] == 12          # rows: 8 x 1 + 4
    executions = s["execution_count"] - before["execution_count"]
    assert 1 <= executions <= 9
    assert infer["compute_infer"]["count"] == s["execution_count"] and infer["compute_infer"]["ns"] > 0
    assert infer["fail"]["count"] == 0 and s["last_inference"] > 0
    g = grpc.get_inference_statistics("counted", as_json=True)["model_stats"][0]
    assert int(g["inference_stats"]["success"]["count"]) == infer["success"]["count"]
    assert int(g["inference_count"]) == s["inference_count"]
    everything = http.get_inference_statistics()["model_stats"]
    assert {m["name"] for m in everything} >= {"counted", "adder"}
    assert http.get_inference_statistics("counted", "1")["model_stats"][0]["name"] == "counted"
    r = httpx.get(server.url + "/v2/models/nope/stats")
    assert r.status_code == 404 and r.json() == {"error": "Request for unknown model: 'nope' is not found"}


def test_warmup_ran_and_is_shown(server):
    """`warmup: 2` ran before the model was ready, and /v1/models says what: the shapes, forwards and time."""
    models = {m["id"]: m for m in httpx.get(server.url + "/v1/models").json()["data"]}
    ran = models["adder"]["warmup"]
    assert ran["requests"] == 2 and ran["shapes"] == ["batch 1", "batch 8"] and ran["forwards"] == 4
    assert models["simple"]["warmup"] is None
    assert add_request(server.url, "adder").json()["outputs"][0]["data"] == [2.0, 2.0]


@pytest.mark.single_process("edits the config file the server reads and loads one model from it")
def test_load_reads_the_entry_again_from_the_file(server, folders):
    """load = the model's entry of the config file as it is now: an edited path serves the new graph."""
    path = server.config_path
    doc = yaml.safe_load(path.read_text())
    doc["models"][2]["path"] = str(folders["plus2"])
    path.write_text(yaml.safe_dump(doc))
    try:
        r = httpx.post(server.url + "/v2/repository/models/adder/load")
        assert r.status_code == 200, r.text
        assert add_request(server.url, "adder").json()["outputs"][0]["data"] == [3.0, 3.0]
        path.write_text("models: [")             # a broken file: the load says why, nothing changes
        r = httpx.post(server.url + "/v2/repository/models/adder/load")
        assert r.status_code == 400 and "invalid YAML" in r.json()["error"]
        assert add_request(server.url, "adder").json()["outputs"][0]["data"] == [3.0, 3.0]
    finally:
        doc["models"][2]["path"] = str(folders["plus1"])
        path.write_text(yaml.safe_dump(doc))
        httpx.post(server.url + "/v2/repository/models/adder/load")


def test_model_control_off_refuses_load_and_unload(folders, tmp_path):
    """Without `server.model_control: true`, load and unload are 403 with the key to set (the index still
    answers, as Triton's does in every mode); the model serves on."""
    cfg = write_config(tmp_path / "rsinfer.yaml", [
        {"name": "adder", "kind": "tensor", "path": str(folders["plus1"]), "max_batch_size": 8, "replicas": 1}],
        model_control=False)
    with ServerThread(load_config(cfg)) as srv:
        for action in ("load", "unload"):
            r = httpx.post(f"{srv.url}/v2/repository/models/adder/{action}")
            assert r.status_code == 403 and "server.model_control: true" in r.json()["error"]
        assert httpx.post(srv.url + "/v2/repository/index").json() == [
            {"name": "adder", "version": "1", "state": "READY"}]
        assert add_request(srv.url, "adder").status_code == 200


def test_warmup_inputs_must_name_the_models_inputs(folders, tmp_path):
    """A tensor model's warm-up inputs are checked against its signature at load: a wrong name fails the start
    with the key path and the model's inputs."""
    from rsinfer_cli.engine.registry import Registry
    from rsinfer_cli.errors import ModelLoadError

    cfg = write_config(tmp_path / "rsinfer.yaml", [
        {"name": "adder", "kind": "tensor", "path": str(folders["plus1"]), "max_batch_size": 8,
         "warmup": {"requests": 1, "inputs": {"NOPE": {"dims": [1, 2]}}}}])
    with pytest.raises(ModelLoadError, match=r"warmup.inputs.NOPE: the model has no input 'NOPE' \(inputs: X\)"):
        Registry.load(load_config(cfg))
    cfg = write_config(tmp_path / "rsinfer.yaml", [
        {"name": "adder", "kind": "tensor", "path": str(folders["plus1"]), "max_batch_size": 8,
         "warmup": {"inputs": {"X": {"dims": [3, 2], "data": "random"}}}}])
    model = Registry.load(load_config(cfg)).models["adder"]
    assert model.stats["warmup"]["shapes"] == ["X[3, 2]"] and model.stats["warmup"]["requests"] == 1


@pytest.mark.single_process("reloads through the control of the one process")
def test_a_failed_load_keeps_what_served(server, folders):
    """A reload whose changed entry cannot load keeps the old version serving; a new entry that cannot load is
    UNAVAILABLE in the index with the reason, and its requests are a 404 that says why. The next reload of a good
    file clears it."""
    import asyncio

    path = server.config_path
    good = path.read_text()
    doc = yaml.safe_load(good)
    doc["models"][2]["path"] = str(folders["root"] / "missing")
    doc["models"].append({"name": "broken", "kind": "tensor", "path": str(folders["root"] / "missing")})
    path.write_text(yaml.safe_dump(doc))

    def reload():
        return asyncio.run_coroutine_threadsafe(server.state.control.reload(), server._loop).result(60)

    try:
        report = reload()
        assert set(report.failed) == {"adder", "broken"} and report.added == ["broken"]
        assert add_request(server.url, "adder").json()["outputs"][0]["data"] == [2.0, 2.0]   # the old one
        index = {m["name"]: m for m in httpx.post(server.url + "/v2/repository/index").json()}
        assert index["adder"]["state"] == "READY"
        assert index["broken"]["state"] == "UNAVAILABLE" and "load failed" in index["broken"]["reason"]
        r = add_request(server.url, "broken")
        assert r.status_code == 404 and "not available: its load failed" in r.json()["error"]
        ready = httpx.get(server.url + "/v2/models/broken/ready")
        assert ready.status_code == 503
        # the folder's name, never the host's path to it (the log keeps that)
        host = str(folders["root"])
        for body in (str(index["broken"]), r.text, ready.text,
                     httpx.post(server.url + "/v2/repository/models/nowhere/load").text):
            assert host not in body, body
    finally:
        path.write_text(good)
        report = reload()
    assert report.removed == ["broken"] and report.failed == {}
    assert httpx.get(server.url + "/v2/models/broken/ready").status_code == 404


def test_inspect_says_what_warmup_ran(folders, tmp_path):
    """`rsinfer inspect` shows what the entry's warm-up ran (JSON and the table), and that a model has none."""
    import json
    import os
    import subprocess
    import sys

    cfg = write_config(tmp_path / "rsinfer.yaml", [
        {"name": "warm", "kind": "tensor", "path": str(folders["plus1"]), "max_batch_size": 4, "warmup": 3},
        {"name": "cold", "kind": "tensor", "path": str(folders["plus1"])}])
    run = [sys.executable, "-m", "rsinfer_cli", "inspect"]
    proc = subprocess.run([*run, "warm", "--config", str(cfg), "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    ran = json.loads(proc.stdout)["warmup"]
    assert ran["requests"] == 3 and ran["shapes"] == ["batch 1", "batch 4"] and ran["forwards"] == 6
    env = {**os.environ, "COLUMNS": "200"}
    table = subprocess.run([*run, "warm", "--config", str(cfg)], capture_output=True, text=True, timeout=120, env=env)
    assert "6 forwards (batch 1, batch 4)" in table.stdout
    cold = subprocess.run([*run, "cold", "--config", str(cfg), "--json"], capture_output=True, text=True, timeout=120)
    assert json.loads(cold.stdout)["warmup"] is None


def test_start_up_loads_are_counted_once(folders, tmp_path, serve_mode):
    """rsinfer_model_loads_total counts each model's load at start once: with the worker split the engine counts
    it, and a front end (which loads nothing) does not count it again."""
    cfg = write_config(tmp_path / "rsinfer.yaml", [
        {"name": "adder", "kind": "tensor", "path": str(folders["plus1"]), "max_batch_size": 8, "replicas": 1}])
    with ServerThread(load_config(cfg), mode=serve_mode) as srv:
        metrics = httpx.get(srv.url + "/metrics").text
    assert 'rsinfer_model_loads_total{model="adder",result="success"} 1.0' in metrics
    assert 'rsinfer_model_state{model="adder",state="READY"} 1.0' in metrics
