"""Script models (`kind: tensor`, engine/scripts/): nereid's per-request contract for python (main.py in its own
venv) and exec (main.cpp compiled at start-up, a prebuilt `model`), driven by the real tritonclient over HTTP
and gRPC and by /infer; every way a model can fail a request, with the server and its other models answering
throughout; the folder contract (model_inference.textproto) and backend detection, with their errors."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from rsinfer_cli.config import ModelConfig, parse_config
from rsinfer_cli.engine.model import load_model
from rsinfer_cli.engine.scripts import detect, read_contract
from rsinfer_cli.errors import ConfigError, ModelLoadError

import synth
from serverutil import ServerThread

SERVE_MODES = ("single", "workers")  # every test that serves also runs against the front-end/engine split

CXX = shutil.which(os.environ.get("CXX", "c++"))
needs_cxx = pytest.mark.skipif(CXX is None and os.environ.get("RSINFER_REQUIRE_CXX") != "1",
                               reason="no C++ compiler (apt-get install g++)")

# nereid's own minimal main.py (its README), unchanged: the sum of the input, as float32 [1]
NEREID_MAIN = '''import os, struct, sys

raw = sys.stdin.buffer.read()  # present when input_shape is declared
values = struct.unpack("<%df" % (len(raw) // 4), raw) if raw else ()
result = [float(sum(values))]  # ... run inference ...

with open(os.environ["NEREID_OUTPUT_PATH"], "wb") as f:
    f.write(("float32 %d\\n" % len(result)).encode("utf-8"))
    f.write(struct.pack("<%df" % len(result), *result))
'''

# x * 2 over a batch, any shape: what a request (or a batch of requests' rows) sent
DOUBLE = '''import os, struct, sys
raw = sys.stdin.buffer.read()
vals = struct.unpack("<%df" % (len(raw) // 4), raw)
with open(os.environ["NEREID_OUTPUT_PATH"], "wb") as f:
    f.write(("float32 " + os.environ["NEREID_INPUT_SHAPE"] + "\\n").encode())
    f.write(struct.pack("<%df" % len(vals), *[v * 2 for v in vals]))
'''

HEADER = '''import os, signal, struct, sys, time
raw = sys.stdin.buffer.read()
shape = os.environ["NEREID_INPUT_SHAPE"]
out = os.environ["NEREID_OUTPUT_PATH"]
print("a line the model prints: never sent to clients")
'''
# each: what main.py does after reading its input (the declared output is float32 [batch, 4])
FAILURES = {
    "crash": "os.kill(os.getpid(), signal.SIGSEGV)",
    "exit3": "sys.exit(3)",
    "noframe": "pass",
    "badframe": "open(out, 'wb').write(b'garbage without a header line')",
    "shape": "open(out, 'wb').write(b'float32 1,3\\n' + struct.pack('<3f', 1, 2, 3))",
    "dtype": "open(out, 'wb').write(('float64 ' + shape + '\\n').encode() + raw + raw)",
    "short": "open(out, 'wb').write(('float32 ' + shape + '\\n').encode() + raw[:-4])",
    "slow": "time.sleep(60)",
}
CONTRACT = "input_shape: [4]\noutput_shape: [4]\nmax_batch_size: 8\n"

CPP_ADD = r'''#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <iterator>
#include <vector>
int main() {
  std::vector<char> raw((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  size_t n = raw.size() / sizeof(float);
  std::vector<float> v(n);
  std::memcpy(v.data(), raw.data(), n * sizeof(float));
  for (auto& x : v) x += 1.0f;
  FILE* f = std::fopen(std::getenv("NEREID_OUTPUT_PATH"), "wb");
  std::fprintf(f, "float32 %s\n", std::getenv("NEREID_INPUT_SHAPE"));
  std::fwrite(v.data(), sizeof(float), n, f);
  std::fclose(f);
  return 0;
}
'''


def children() -> list[tuple[str, str]]:
    """(state, command line) of this process's children: the model processes of an in-process server."""
    out = subprocess.run(["ps", "--ppid", str(os.getpid()), "-o", "stat=,args="], capture_output=True, text=True,
                         timeout=30).stdout
    rows = [ln.split(None, 1) + [""] for ln in out.splitlines() if ln.strip()]
    return [(r[0], r[1]) for r in rows]


def folder(root: Path, name: str, files: dict[str, str], venv: bool = True) -> Path:
    """A model folder; `venv`: a venv made now (without pip: fast), which start-up reuses."""
    d = root / name
    d.mkdir(parents=True)
    for rel, text in files.items():
        (d / rel).write_text(text)
    if venv:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(d / "venv")], check=True, timeout=120)
    return d


def python_model(root: Path, name: str, main: str, contract: str = CONTRACT, venv: bool = True) -> Path:
    return folder(root, name, {"main.py": main, "requirements.txt": "", "model_inference.textproto": contract}, venv)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ml-backends")
    out = {"pysum": python_model(root, "pysum", NEREID_MAIN, "input_shape: [4]\noutput_shape: [1]\n", venv=False),
           "double": python_model(root, "double", DOUBLE)}
    for name, body in FAILURES.items():
        out[name] = python_model(root, name, HEADER + body + "\n")
    prebuilt = folder(root, "prebuilt", {"model": f"#!{sys.executable}\n" + DOUBLE, "model_inference.textproto":
                                         CONTRACT}, venv=False)
    (prebuilt / "model").chmod(0o755)
    out["prebuilt"] = prebuilt
    built = folder(root, "built", {"build.sh": f"#!/bin/sh\nset -e\nprintf '#!{sys.executable}\\n' > model\n"
                                               "cat src.py >> model\nchmod +x model\n", "src.py": DOUBLE,
                                   "model_inference.textproto": CONTRACT}, venv=False)
    (built / "build.sh").chmod(0o755)
    out["built"] = built
    if CXX is not None:
        out["cppadd"] = folder(root, "cppadd", {"main.cpp": CPP_ADD, "model_inference.textproto": CONTRACT},
                               venv=False)
    return out


@pytest.fixture(scope="module")
def server(models, serve_mode):
    cfg = parse_config({"server": {"request_timeout_ms": 3000, "grpc_bind": None}, "models": [
        {"name": name, "kind": "tensor", "path": str(path), **({"backend": "cpp"} if name == "cppadd" else {})}
        for name, path in models.items()]})
    with ServerThread(cfg, grpc=True, mode=serve_mode) as srv:
        yield srv


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def infer(http: httpx.Client, model: str, data: list, shape: list[int]) -> httpx.Response:
    return http.post(f"/v2/models/{model}/infer", json={"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": shape, "data": data}]})


def still_serving(http: httpx.Client) -> None:
    assert http.get("/health").status_code == 200
    r = infer(http, "double", [1, 2, 3, 4], [1, 4])
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2, 4, 6, 8]


class TestServed:
    def test_nereid_minimal_main_py_in_a_venv_made_at_start_up(self, server, http, models):
        assert (models["pysum"] / "venv").is_dir()               # created, with requirements.txt installed
        r = infer(http, "pysum", [1, 2, 3, 4.5], [4])
        assert r.status_code == 200, r.text
        assert r.json()["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1], "data": [10.5]}]
        meta = http.get("/v2/models/pysum").json()
        assert meta["platform"] == "python" and meta["inputs"] == [
            {"name": "INPUT0", "datatype": "FP32", "shape": [4]}]
        card = next(m for m in http.get("/v1/models").json()["data"] if m["id"] == "pysum")
        assert card["threads"]["source"] == "script"

    def test_tritonclient_http_and_grpc(self, server):
        import tritonclient.grpc as tg
        import tritonclient.http as th

        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        hc = th.InferenceServerClient(server.url.removeprefix("http://"))
        i = th.InferInput("INPUT0", [3, 4], "FP32")
        i.set_data_from_numpy(x, binary_data=True)
        assert np.array_equal(hc.infer("double", [i]).as_numpy("OUTPUT0"), x * 2)
        gc = tg.InferenceServerClient(server.grpc_url)
        g = tg.InferInput("INPUT0", [3, 4], "FP32")
        g.set_data_from_numpy(x)
        assert np.array_equal(gc.infer("prebuilt", [g]).as_numpy("OUTPUT0"), x * 2)
        assert gc.get_model_metadata("prebuilt").platform == "exec"

    def test_infer_route_and_batch_dimension_left_out(self, http):
        r = http.post("/infer", json={"model": "double", "input": [[1, 2, 3, 4], [5, 6, 7, 8]]})
        assert r.status_code == 200 and r.json()["output"] == [[2, 4, 6, 8], [10, 12, 14, 16]]
        r = infer(http, "double", [1, 1, 1, 1], [4])              # no batch dimension: run as [1, 4], answered [4]
        assert r.json()["outputs"][0]["shape"] == [4]

    def test_bad_requests_are_refused_before_a_process_starts(self, http):
        r = infer(http, "double", list(range(12)), [3, 3, 4])
        assert r.status_code == 400
        r = infer(http, "double", list(range(9 * 4)), [9, 4])     # over max_batch_size 8 (from the textproto)
        assert r.status_code == 400 and "8" in r.json()["error"]

    @needs_cxx
    def test_cpp_model_compiled_at_start_up(self, http, models, server):
        assert os.access(models["cppadd"] / "model", os.X_OK)
        r = infer(http, "cppadd", [1, 2, 3, 4, 5, 6, 7, 8], [2, 4])
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2, 3, 4, 5, 6, 7, 8, 9]
        assert http.get("/v2/models/cppadd").json()["platform"] == "exec"


class TestFailures:
    @pytest.mark.parametrize("name, says", [
        ("crash", "killed by signal SIGSEGV"), ("exit3", "exited with status 3"),
        ("noframe", "without writing its output frame"), ("badframe", "malformed output frame"),
        ("shape", r"shape \[1, 3\] disagrees with the declared output 'OUTPUT0' \[[12], 4\]"),
        ("dtype", "dtype float64 disagrees"), ("short", r"holds \d+ bytes; float32 \[[12], 4\] needs (16|32)")])
    def test_a_failing_model_fails_only_its_request(self, http, name, says):
        # (the engine of the workers split may run the request's two rows as two forwards: [1, 4] each)
        r = infer(http, name, list(range(8)), [2, 4])
        assert r.status_code == 500, r.text
        message = r.json()["error"]
        assert re.search(says, message) and f"model '{name}'" in message
        assert "never sent to clients" not in r.text and "/tmp" not in message
        still_serving(http)

    def test_a_model_past_the_deadline_is_killed_and_leaves_no_process(self, http, server):
        session = server.registry.models["slow"].sessions[0]
        t0 = time.monotonic()
        r = infer(http, "slow", list(range(4)), [1, 4])
        assert r.status_code in (408, 500) and time.monotonic() - t0 < 15
        for _ in range(100):                                       # the forward thread kills it at its deadline
            if not session.running:
                break
            time.sleep(0.05)
        assert not session.running
        assert not [c for c in children() if c[0].startswith("Z") or "main.py" in c[1]]   # no zombie, none left
        still_serving(http)


class TestContract:
    def test_multi_tensor_blocks_and_triton_spellings(self, tmp_path):
        (tmp_path / "model_inference.textproto").write_text(
            'max_batch_size: 4\ninput { name: "a" data_type: TYPE_INT64 shape: [-1, 3] }\n'
            'input { name: "b" dims: [2] }\noutput { name: "sum" data_type: FP64 shape: [3] }\n')
        c = read_contract(tmp_path, "m")
        assert [(t.name, t.dtype, t.shape) for t in c.inputs] == [("a", "int64", ("batch", "a_d0", 3)),
                                                                  ("b", "float32", ("batch", 2))]
        assert [(t.name, t.dtype) for t in c.outputs] == [("sum", "float64")] and c.max_batch_size == 4

    @pytest.mark.parametrize("text, says", [
        ("input_shape: [4]\n", "output_shape: required"),
        ("output_shape: [0]\n", "output_shape[0]: must be -1 (free) or > 0, got 0"),
        ("output_shape: [1]\ninput_shape: [2]\ninput { name: 'x' }\n", "give either input_shape or input {}"),
        ("output_shape: [1]\nbatch_size: 3\n", 'line 2:1 : the top level has no field named "batch_size"'),
        ("output_shape: [1]\ndata_type: FLOAT\n", "data_type has no value named FLOAT. (one of BOOL, UINT8"),
        ("output { dims: [1] }\noutput { name: 'y' dims: [1] }\n", "output[0].name: required"),
    ])
    def test_mistakes_name_the_key(self, tmp_path, text, says):
        (tmp_path / "model_inference.textproto").write_text(text)
        with pytest.raises(ModelLoadError) as err:
            read_contract(tmp_path, "m")
        assert says in str(err.value) and "model 'm'" in str(err.value)

    def test_missing_contract(self, tmp_path):
        with pytest.raises(ModelLoadError, match="model_inference.textproto is missing"):
            read_contract(tmp_path, "m")


class TestDetection:
    def test_ambiguous_and_empty_folders_name_what_they_saw(self, tmp_path):
        d = folder(tmp_path, "both", {"main.py": "", "requirements.txt": "", "model.onnx": ""}, venv=False)
        with pytest.raises(ModelLoadError, match=r"matches several backends: onnx \(model.onnx\); python"):
            detect(d, "both")
        e = folder(tmp_path, "none", {"README.md": "hi"}, venv=False)
        with pytest.raises(ModelLoadError, match=r"no backend matches folder none/ \(saw: README.md\)"):
            detect(e, "none")

    def test_backend_key_settles_an_ambiguous_folder(self, tmp_path):
        d = python_model(tmp_path, "both", DOUBLE)
        (d / "model.onnx").write_text("not used")
        m = load_model(ModelConfig(name="both", kind="tensor", path=str(d), backend="python"))
        assert m.backend == "python" and m.card()["program"] == "venv/ (reused)"

    def test_missing_requirements_txt_stops_start_up(self, tmp_path):
        d = folder(tmp_path, "noreq", {"main.py": DOUBLE, "model_inference.textproto": CONTRACT}, venv=False)
        with pytest.raises(ModelLoadError, match="requirements.txt is missing"):
            load_model(ModelConfig(name="noreq", kind="tensor", path=str(d)))

    def test_pip_failure_stops_start_up_with_its_last_lines(self, tmp_path):
        d = python_model(tmp_path, "badreq", DOUBLE, venv=False)
        (d / "requirements.txt").write_text("this is not a requirement ===\n")
        with pytest.raises(ModelLoadError, match=r"installing badreq/requirements.txt into its venv failed"):
            load_model(ModelConfig(name="badreq", kind="tensor", path=str(d)))

    def test_per_request_contract_is_one_tensor_in_and_out(self, tmp_path):
        d = python_model(tmp_path, "two", DOUBLE, "input { name: 'a' dims: [1] }\ninput { name: 'b' dims: [1] }\n"
                                                  "output_shape: [1]\n")
        with pytest.raises(ModelLoadError, match="one input and one output tensor"):
            load_model(ModelConfig(name="two", kind="tensor", path=str(d)))

    @needs_cxx
    def test_cpp_compile_error_stops_start_up(self, tmp_path):
        d = folder(tmp_path, "broken", {"main.cpp": "int main( {", "model_inference.textproto": CONTRACT},
                   venv=False)
        with pytest.raises(ModelLoadError, match=r"compiling broken/main.cpp failed"):
            load_model(ModelConfig(name="broken", kind="tensor", path=str(d)))

    def test_backend_is_a_tensor_key(self):
        with pytest.raises(ConfigError, match=r"models\[0\].backend: applies to kind tensor only"):
            parse_config({"models": [{"name": "e", "kind": "embedding", "path": "x", "backend": "python"}]})
        with pytest.raises(ConfigError, match=r"models\[0\].backend: must be one of auto, onnx, python, exec, cpp"):
            parse_config({"models": [{"name": "t", "kind": "tensor", "path": "x", "backend": "rust"}]})


# ------------------------------------------------------------------ the long-lived mode: infer() in a process


LONG = '''import os, signal, time
import numpy as np

calls = {"n": 0}

def initialize(config):
    calls["config"] = config

def infer(inputs):
    x = inputs["INPUT0"]
    calls["n"] += 1
    first = float(x.flat[0]) if x.size else 0.0
    if first == 13:
        raise ValueError("13 is unlucky")
    if first == 66:
        os.kill(os.getpid(), signal.SIGSEGV)
    if first == 77:
        time.sleep(60)
    if first == 88:
        return {"NOT_DECLARED": x}
    x *= 2                                   # the input is writable
    return {"OUTPUT0": x, "PID": np.full((x.shape[0], 1), os.getpid(), dtype=np.int64)}
'''
LONG_CONTRACT = ('max_batch_size: 16\ninput { name: "INPUT0" dims: [4] }\n'
                 'output { name: "OUTPUT0" dims: [4] }\noutput { name: "PID" data_type: INT64 dims: [1] }\n')


def numpy_venv(d: Path) -> None:
    """The model's venv sees this interpreter's numpy (a .pth file): no network in the suite."""
    import numpy

    site = Path(numpy.__file__).parents[1]
    (d / "venv" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages" /
     "rsinfer-tests.pth").write_text(str(site) + "\n")


@pytest.fixture(scope="module")
def long_server(tmp_path_factory, serve_mode):
    root = tmp_path_factory.mktemp("long")
    d = python_model(root, "long", LONG, LONG_CONTRACT)
    numpy_venv(d)
    good = python_model(root, "double", DOUBLE)
    cfg = parse_config({"server": {"request_timeout_ms": 3000}, "models": [
        {"name": "long", "kind": "tensor", "path": str(d), "replicas": 2},
        {"name": "double", "kind": "tensor", "path": str(good)}]})
    with ServerThread(cfg, grpc=True, mode=serve_mode) as srv:
        yield srv


def long_infer(c: httpx.Client, first: float, rows: int = 1) -> httpx.Response:
    data = [first] + [1.0] * (4 * rows - 1)
    return infer(c, "long", data, [rows, 4])


class TestLongLived:
    def test_answers_with_every_declared_output_and_keeps_its_process(self, long_server):
        with httpx.Client(base_url=long_server.url, timeout=30) as c:
            r = long_infer(c, 5, rows=3)
            assert r.status_code == 200, r.text
            outs = {o["name"]: o for o in r.json()["outputs"]}
            assert outs["OUTPUT0"]["data"][:4] == [10, 2, 2, 2] and outs["OUTPUT0"]["shape"] == [3, 4]
            assert outs["PID"]["datatype"] == "INT64" and outs["PID"]["shape"] == [3, 1]
            pids = {s.pid for s in long_server.registry.models["long"].sessions}
            assert len(pids) == 2 and outs["PID"]["data"][0] in pids        # one process per lane, both alive
            meta = c.get("/v2/models/long").json()
            assert [o["name"] for o in meta["outputs"]] == ["OUTPUT0", "PID"] and meta["platform"] == "python"

    def test_concurrent_requests_over_grpc_and_http(self, long_server):
        import concurrent.futures

        import tritonclient.grpc as tg

        def one(k: int) -> bool:
            client = tg.InferenceServerClient(long_server.grpc_url)
            x = np.full((2, 4), k, dtype=np.float32)
            i = tg.InferInput("INPUT0", [2, 4], "FP32")
            i.set_data_from_numpy(x)
            return bool(np.array_equal(client.infer("long", [i]).as_numpy("OUTPUT0"), x * 2))

        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            assert all(ex.map(one, [k for k in range(24) if k not in (13, 66, 77, 88)]))

    @pytest.mark.parametrize("first, says, same_process", [
        (13, "infer() raised ValueError: 13 is unlucky", True),
        (88, "infer() returned no output 'OUTPUT0' (it returned NOT_DECLARED)", True),
        (66, "its process was killed by signal SIGSEGV; the next request starts a new one", False),
        (77, "did not answer within 3000 ms; its process was killed", False),
    ])
    def test_a_failure_fails_its_request_and_the_next_one_is_served(self, long_server, first, says, same_process):
        sessions = long_server.registry.models["long"].sessions
        with httpx.Client(base_url=long_server.url, timeout=30) as c:
            before = {id(s): (s.pid, s.starts) for s in sessions}
            r = long_infer(c, first)
            assert r.status_code in ((500,) if first != 77 else (408, 500)), r.text
            if r.status_code == 500:
                assert says in r.json()["error"]
            for _ in range(100):                                  # the lane is back
                if all(s._lock.acquire(timeout=0.05) and (s._lock.release() or True) for s in sessions):
                    break
            after = {id(s): (s.pid, s.starts) for s in sessions}
            assert (before == after) is same_process or not same_process
            if not same_process:
                assert any(a[0] is None or a[1] > b[1] for a, b in zip(after.values(), before.values(),
                                                                       strict=True))
            for _ in range(3):                                    # both lanes answer again (one restarts)
                assert long_infer(c, 2).status_code == 200
            assert infer(c, "double", [1, 2, 3, 4], [1, 4]).status_code == 200
            assert c.get("/health").status_code == 200
        assert not [c for c in children() if c[0].startswith("Z")]       # every ended process was reaped

    def test_numpy_missing_from_the_venv_stops_start_up(self, tmp_path):
        d = python_model(tmp_path, "nonumpy", LONG, LONG_CONTRACT)
        with pytest.raises(ModelLoadError, match=r"numpy is missing from the model's venv"):
            load_model(ModelConfig(name="nonumpy", kind="tensor", path=str(d), replicas=1))

    def test_main_py_that_fails_to_import_stops_start_up(self, tmp_path):
        d = python_model(tmp_path, "broken", LONG + "\nraise RuntimeError('no model file')\n", LONG_CONTRACT)
        numpy_venv(d)
        said = r"main.py failed to load: RuntimeError: no model file \(main.py, line 2[0-9]\)"
        with pytest.raises(ModelLoadError, match=said):
            load_model(ModelConfig(name="broken", kind="tensor", path=str(d), replicas=1))


def test_inspect_shows_a_script_models_backend_program_and_tensors(tmp_path):
    import json

    d = python_model(tmp_path, "dbl", DOUBLE)
    proc = subprocess.run([sys.executable, "-m", "rsinfer_cli", "inspect", "--path", str(d), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert (rep["kind"], rep["backend"], rep["program"]) == ("tensor", "python", "venv/ (reused)")
    assert rep["kind_reason"] == "a script model folder (backend python)"
    assert rep["graph"]["inputs"] == [{"name": "INPUT0", "dtype": "float32", "shape": ["batch", 4]}]
    assert rep["threads"]["source"] == "script"


# ------------------------------------------------------------------ a nereid config and ml-backends folder


class TestNereidConfig:
    def test_translated(self, tmp_path):
        cfg = parse_config({"server": {"bind_addr": "[::1]:50051", "ml_backends_path": "ml-backends"}, "models": [
            {"name": "model3", "device": "cpu", "queue_capacity": 16},
            {"name": "gpu", "device": "cuda:1", "backend": "cpp"},
            {"name": "py", "backend": "python"}]}, base_dir=tmp_path)
        assert cfg.server.grpc_bind == "[::1]:50051"
        m3, gpu, py = cfg.models
        assert (m3.kind, m3.path, m3.eps, m3.max_queue) == ("tensor", str(tmp_path / "ml-backends" / "model3"),
                                                             ("cpu",), 16)
        assert (gpu.eps, gpu.device_id, gpu.backend) == (("cuda", "cpu"), 1, "exec") and py.backend == "python"
        assert cfg.max_queue_of(m3) == 16 and cfg.max_queue_of(py) == cfg.server.max_queue

    @pytest.mark.parametrize("data, says", [
        ({"server": {"bind_addr": "x:1", "ml_backends_path": "m", "port": 1}, "models": []},
         "server.port: unknown key in a nereid config (allowed: bind_addr, ml_backends_path)"),
        ({"server": {"bind_addr": "127.0.0.1:1"}, "models": [{"name": "a"}]}, "server.ml_backends_path: required"),
        ({"server": {"bind_addr": "127.0.0.1:1", "ml_backends_path": "m"}, "models": [{"name": "a", "device": "gpu"}]},
         "models[0].device: must be cpu, cuda or cuda:<index>, got 'gpu'"),
        ({"server": {"bind_addr": "127.0.0.1:1", "ml_backends_path": "m"},
          "models": [{"name": "a", "queue_capacity": 0}]}, "models[0].queue_capacity: must be > 0, got 0"),
        ({"server": {"bind_addr": "127.0.0.1:1", "ml_backends_path": "m"},
          "models": [{"name": "a", "backend": "rust"}]},
         "models[0].backend: 'rust' (TorchScript .pt) is not served by rsinfer"),
        ({"server": {"bind_addr": "127.0.0.1:1", "ml_backends_path": "m"}, "models": [{"name": "a", "gpu": True}]},
         "models[0].gpu: unknown key in a nereid config"),
    ])
    def test_mistakes_name_the_key(self, data, says):
        with pytest.raises(ConfigError) as err:
            parse_config(data, file="nereid.yaml")
        assert f"nereid.yaml: {says}" in str(err.value)

    def test_serve_boots_a_nereid_repository(self, tmp_path):
        """`rsinfer serve --config nereid.yaml` over an ml-backends/ folder: a per-request python model (nereid's
        main.py), an ONNX graph and a long-lived python model, on the gRPC address nereid.yaml names."""
        import tritonclient.grpc as tg
        import yaml
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        from serverutil import ServeProcess, free_port

        backends = tmp_path / "ml-backends"
        python_model(backends, "pysum", NEREID_MAIN, "input_shape: [4]\noutput_shape: [1]\n")
        long = python_model(backends, "long", LONG, LONG_CONTRACT)
        numpy_venv(long)
        synth.add_graph(backends / "onnxadd" / "model.onnx")
        grpc_port, http_port = free_port(), free_port()
        (tmp_path / "nereid.yaml").write_text(yaml.safe_dump({
            "server": {"bind_addr": f"127.0.0.1:{grpc_port}", "ml_backends_path": "ml-backends"},
            "models": [{"name": "pysum", "device": "cpu", "queue_capacity": 16, "backend": "python"},
                       {"name": "onnxadd", "device": "cpu", "queue_capacity": 4},
                       {"name": "long", "queue_capacity": 8}]}))
        srv = ServeProcess(tmp_path / "nereid.yaml", http_port)
        try:
            srv.wait_ready(90)
            assert any("listening on" in ln and f"gRPC on 127.0.0.1:{grpc_port}" in ln for ln in srv.lines)
            client = tg.InferenceServerClient(f"127.0.0.1:{grpc_port}")
            x = np.array([1, 2, 3, 4], dtype=np.float32)
            i = tg.InferInput("INPUT0", [4], "FP32")
            i.set_data_from_numpy(x)
            assert client.infer("pysum", [i]).as_numpy("OUTPUT0").tolist() == [10.0]
            j = tg.InferInput("X", [1, 2], "FP32")
            j.set_data_from_numpy(np.array([[1, 2]], dtype=np.float32))
            assert client.infer("onnxadd", [j]).as_numpy("Y").tolist() == [[2.0, 3.0]]
            k = tg.InferInput("INPUT0", [1, 4], "FP32")
            k.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
            assert client.infer("long", [k]).as_numpy("OUTPUT0").tolist() == [[2.0, 2.0, 2.0, 2.0]]
            import grpc

            with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as ch:
                status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5).status
            assert status == health_pb2.HealthCheckResponse.SERVING
        finally:
            code = srv.stop(60)
        assert code == 0



class TestOnnxFolderContract:
    def test_a_textproto_that_agrees_sets_max_batch_size(self, tmp_path):
        d = synth.add_graph(tmp_path / "m" / "model.onnx").parent
        (d / "model_inference.textproto").write_text("input_shape: [2]\noutput_shape: [2]\nmax_batch_size: 4\n")
        m = load_model(ModelConfig(name="m", kind="tensor", path=str(d)))
        assert m.backend == "onnx" and m.config.max_batch_size == 4

    @pytest.mark.parametrize("text, says", [
        ("input_shape: [3]\noutput_shape: [2]\nmax_batch_size: 4\n",
         "input 'INPUT0' is declared float32 ['batch', 3], the graph's 'X' is float32 ['batch', 2]"),
        ("input_shape: [2]\noutput_shape: [2]\ndata_type: INT64\nmax_batch_size: 4\n", "declared int64"),
        ("input { name: 'A' dims: [2] }\ninput { name: 'B' dims: [2] }\noutput_shape: [2]\n",
         "it declares 2 input(s), the graph has 1"),
    ])
    def test_a_textproto_that_disagrees_stops_start_up(self, tmp_path, text, says):
        d = synth.add_graph(tmp_path / "m" / "model.onnx").parent
        (d / "model_inference.textproto").write_text(text)
        with pytest.raises(ModelLoadError, match="disagrees with the graph") as err:
            load_model(ModelConfig(name="m", kind="tensor", path=str(d)))
        assert says in str(err.value)


def three_ways(url: str, grpc_url: str, model: str, x: np.ndarray, expect: np.ndarray) -> None:
    """The same [n, 4] request through tritonclient HTTP (binary tensors), tritonclient gRPC and /infer."""
    import tritonclient.grpc as tg
    import tritonclient.http as th

    i = th.InferInput("INPUT0", list(x.shape), "FP32")
    i.set_data_from_numpy(x, binary_data=True)
    assert np.array_equal(th.InferenceServerClient(url.removeprefix("http://")).infer(model, [i])
                          .as_numpy("OUTPUT0"), expect)
    g = tg.InferInput("INPUT0", list(x.shape), "FP32")
    g.set_data_from_numpy(x)
    assert np.array_equal(tg.InferenceServerClient(grpc_url).infer(model, [g]).as_numpy("OUTPUT0"), expect)
    r = httpx.post(url + "/infer", json={"model": model, "input": x.tolist()}, timeout=30)
    assert r.status_code == 200, r.text
    assert np.array_equal(np.array(r.json()["output"], dtype=np.float32), expect)


@pytest.mark.parametrize("model, op", [("double", "x2"), ("prebuilt", "x2"), ("built", "x2"),
                                       pytest.param("cppadd", "+1", marks=needs_cxx)])
def test_every_per_request_backend_three_ways(server, model, op):
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    three_ways(server.url, server.grpc_url, model, x, x * 2 if op == "x2" else x + 1)


def test_long_lived_three_ways(long_server):
    x = np.arange(12, dtype=np.float32).reshape(3, 4) + 1
    three_ways(long_server.url, long_server.grpc_url, "long", x, x * 2)


def test_a_model_that_takes_no_input(tmp_path, serve_mode):
    """nereid: "a model may consume no tensor input": nothing on stdin, no NEREID_INPUT_* in the environment; a
    request with no inputs is served over KServe REST and /infer, while a model with inputs still says which are
    missing."""
    const = folder(tmp_path, "const", {"requirements.txt": "", "model_inference.textproto": "output_shape: [2]\n",
                                       "main.py": "import os, struct, sys\n"
                                                  "assert not sys.stdin.buffer.read()\n"
                                                  "assert 'NEREID_INPUT_SHAPE' not in os.environ\n"
                                                  "open(os.environ['NEREID_OUTPUT_PATH'], 'wb').write(\n"
                                                  "    b'float32 2\\n' + struct.pack('<2f', 3.0, 4.0))\n"})
    double = python_model(tmp_path, "double", DOUBLE)
    cfg = parse_config({"models": [{"name": "const", "kind": "tensor", "path": str(const)},
                                   {"name": "double", "kind": "tensor", "path": str(double)}]})
    with ServerThread(cfg, mode=serve_mode) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        r = c.post("/v2/models/const/infer", json={"inputs": []})
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == [3.0, 4.0]
        assert c.post("/infer", json={"model": "const", "inputs": {}}).json()["output"] == [3.0, 4.0]
        missing = c.post("/v2/models/double/infer", json={"inputs": []})
        assert missing.status_code == 400 and "missing input(s) INPUT0" in missing.json()["error"]
