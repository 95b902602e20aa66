"""`kind: tensor` over KServe v2 with the real tritonclient (HTTP JSON, HTTP binary, gRPC): the reference cases
of ../shared/models/tensor-models exactly, every datatype on synthetic identity graphs, dynamic batching,
every bad-tensor case, versions with weighted routing, and inferstack-rs's /infer, /batch and /models."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from rsinfer_cli.config import parse_config
from rsinfer_cli.errors import ConfigError

from serverutil import ServerThread, forwards

SERVE_MODES = ("single", "workers")  # every test here also runs against the front-end/engine split

pytestmark = pytest.mark.shared

TRITON = {"BOOL": TensorProto.BOOL, "UINT8": TensorProto.UINT8, "UINT16": TensorProto.UINT16,
          "UINT32": TensorProto.UINT32, "UINT64": TensorProto.UINT64, "INT8": TensorProto.INT8,
          "INT16": TensorProto.INT16, "INT32": TensorProto.INT32, "INT64": TensorProto.INT64,
          "FP16": TensorProto.FLOAT16, "FP32": TensorProto.FLOAT, "FP64": TensorProto.DOUBLE,
          "BYTES": TensorProto.STRING}
NUMPY = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
         "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
         "FP32": np.float32, "FP64": np.float64, "BYTES": np.object_}


def identity_graph(elem: int, op: str = "Identity") -> onnx.ModelProto:
    x = helper.make_tensor_value_info("X", elem, ["batch", 3])
    y = helper.make_tensor_value_info("Y", elem, ["batch", 3])
    graph = helper.make_graph([helper.make_node(op, ["X"], ["Y"])], "ident", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def add_two_graph() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 4])
    two = helper.make_tensor("two", TensorProto.FLOAT, [1], [2.0])
    graph = helper.make_graph([helper.make_node("Add", ["INPUT0", "two"], ["OUTPUT0"])], "add_two", [x], [y],
                              initializer=[two])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def sample(datatype: str) -> np.ndarray:
    if datatype == "BYTES":
        return np.array([["a", "héllo", ""], ["x" * 40, "z", "日本"]], dtype=object)
    if datatype == "BOOL":
        return np.array([[True, False, True], [False, False, True]])
    info = np.iinfo(NUMPY[datatype]) if datatype[0] in "UI" else None
    if info is not None:  # the extremes of the type, exactly
        return np.array([[info.min, info.max, 0], [1, info.max - 1, info.min + 1]], dtype=NUMPY[datatype])
    return np.array([[0.5, -1.25, 65504.0 if datatype == "FP16" else 1e30], [3.0, -0.0, 1.0]], dtype=NUMPY[datatype])


@pytest.fixture(scope="module")
def models(shared_models, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tensor")
    out = {}
    for dt, elem in TRITON.items():
        d = root / f"ident_{dt.lower()}"
        d.mkdir()
        onnx.save(identity_graph(elem), str(d / "model.onnx"))
        out[dt] = d
    d = root / "add_two"
    d.mkdir()
    onnx.save(add_two_graph(), str(d / "model.onnx"))
    out["add_two"] = d
    return out


@pytest.fixture(scope="module")
def server(shared_models, models, serve_mode):
    tm = shared_models / "tensor-models"
    entries = [
        {"name": "add_one", "kind": "tensor", "path": str(tm / "add_one"), "max_batch_size": 8, "replicas": 1},
        {"name": "add_sub", "kind": "tensor", "path": str(tm / "add_sub"), "max_batch_size": 4, "replicas": 1},
        {"name": "int64_identity", "kind": "tensor", "path": str(tm / "int64_identity"), "replicas": 1},
        {"name": "adder", "kind": "tensor", "max_batch_size": 8, "replicas": 1, "versions": [
            {"version": "1", "path": str(tm / "add_one"), "weight": 70},
            {"version": "2", "path": str(models["add_two"]), "weight": 30}]},
        {"name": "pinned", "kind": "tensor", "default_version": "2", "replicas": 1, "versions": [
            {"version": "1", "path": str(tm / "add_one")}, {"version": "2", "path": str(models["add_two"])}]},
        {"name": "solo", "kind": "tensor", "path": str(tm / "add_one"), "replicas": 1, "max_batch_size": 64,
         "batching": {"enabled": True, "max_rows": 64}},
    ]
    entries += [{"name": f"ident_{dt.lower()}", "kind": "tensor", "path": str(p), "max_batch_size": 4,
                 "replicas": 1} for dt, p in models.items() if dt in TRITON]
    with ServerThread(parse_config({"models": entries}), grpc=True, mode=serve_mode) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server):
    import tritonclient.http as th

    return th.InferenceServerClient(server.url.removeprefix("http://"))


@pytest.fixture(scope="module")
def grpc_client(server):
    import tritonclient.grpc as tg

    return tg.InferenceServerClient(server.grpc_url)


def triton_infer(client, kind: str, model: str, tensors: dict[str, np.ndarray], datatypes: dict[str, str],
                 binary: bool = True, outputs: list[str] | None = None, version: str = ""):
    if kind == "grpc":
        import tritonclient.grpc as t
    else:
        import tritonclient.http as t
    inputs = []
    for name, arr in tensors.items():
        i = t.InferInput(name, list(arr.shape), datatypes[name])
        if kind == "grpc":
            i.set_data_from_numpy(arr)
        else:
            i.set_data_from_numpy(arr, binary_data=binary)
        inputs.append(i)
    requested = None
    if outputs is not None:
        requested = [t.InferRequestedOutput(o) if kind == "grpc" else t.InferRequestedOutput(o, binary_data=binary)
                     for o in outputs]
    return client.infer(model, inputs, outputs=requested, model_version=version, request_id="req-7")


TRANSPORTS = [("http", False), ("http", True), ("grpc", True)]


@pytest.mark.parametrize(("kind", "binary"), TRANSPORTS, ids=["http-json", "http-binary", "grpc"])
def test_reference_cases_exact(shared_models, http, grpc_client, kind, binary):
    ref = json.loads((shared_models / "tensor-models" / "reference.json").read_text())
    client = grpc_client if kind == "grpc" else http
    for model, spec in ref["models"].items():
        for case in spec["cases"]:
            req = case["kserve_v2_request"]["inputs"]
            tensors = {t["name"]: np.array(t["data"], dtype=NUMPY[t["datatype"]]).reshape(t["shape"]) for t in req}
            result = triton_infer(client, kind, model, tensors, {t["name"]: t["datatype"] for t in req}, binary)
            for exp in case["expected_outputs"]:
                got = result.as_numpy(exp["name"])
                assert list(got.shape) == exp["shape"]
                assert got.dtype == NUMPY[exp["datatype"]]
                want = np.array(exp["data"], dtype=NUMPY[exp["datatype"]])
                if want.dtype.kind in "iu":
                    assert np.array_equal(got.reshape(-1), want), (model, exp["name"])  # integers: exact
                else:  # the reference writes floats rounded to 6 decimals
                    assert np.abs(got.reshape(-1) - want).max() <= 1e-6, (model, exp["name"])
            response = result.get_response()
            assert (response["id"] if kind == "http" else response.id) == "req-7"


@pytest.mark.parametrize(("kind", "binary"), TRANSPORTS, ids=["http-json", "http-binary", "grpc"])
@pytest.mark.parametrize("datatype", list(TRITON))
def test_every_datatype_round_trips(server, http, grpc_client, kind, binary, datatype):
    arr = sample(datatype)
    if datatype == "FP16" and kind == "http" and not binary:  # tritonclient refuses FP16 in JSON; we take numbers
        tensor = {"name": "X", "datatype": "FP16", "shape": [2, 3], "data": arr.astype(float).reshape(-1).tolist()}
        r = httpx.post(server.url + "/v2/models/ident_fp16/infer", json={"inputs": [tensor]})
        out = r.json()["outputs"][0]
        assert out["datatype"] == "FP16" and np.array_equal(np.array(out["data"], np.float16).reshape(2, 3), arr)
        return
    result = triton_infer(grpc_client if kind == "grpc" else http, kind, f"ident_{datatype.lower()}", {"X": arr},
                          {"X": datatype}, binary)
    got = result.as_numpy("Y")
    if datatype == "BYTES":
        assert [x.decode() if isinstance(x, bytes) else x for x in got.reshape(-1)] == arr.reshape(-1).tolist()
    else:
        assert got.dtype == arr.dtype and np.array_equal(got, arr)


def test_int64_beyond_2_53_exact_in_json(server):
    big = [2**53 + 1, -(2**62) - 3, 2**63 - 2]
    r = httpx.post(server.url + "/v2/models/int64_identity/infer",
                   json={"inputs": [{"name": "INPUT0", "datatype": "INT64", "shape": [1, 3], "data": big}]})
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [v + 1 for v in big]  # +1: the graph ran, nothing rounded


def test_request_without_batch_dimension_is_answered_without_it(server):
    r = httpx.post(server.url + "/v2/models/add_one/infer",
                   json={"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]})
    out = r.json()["outputs"][0]
    assert out["shape"] == [4] and out["data"] == [2, 3, 4, 5]


def test_an_empty_batch_is_answered_empty(server):
    """A batch of zero rows ([0, 4]) to a model with a batch dimension is one forward of zero rows, answered [0, 4]
    (it was an IndexError, a 500, before the tensor family ran a one-row-or-less request as it came)."""
    for model in ("add_one", "solo"):      # max_batch_size 8 and 64: the direct and the batched path
        r = httpx.post(server.url + f"/v2/models/{model}/infer",
                       json={"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [0, 4], "data": []}]})
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["shape"] == [0, 4] and r.json()["outputs"][0]["data"] == []


def test_output_subset_id_and_metadata(server, http):
    r = httpx.post(server.url + "/v2/models/add_sub/infer", json={
        "id": "abc", "outputs": [{"name": "OUTPUT1"}],
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16},
                   {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]})
    body = r.json()
    assert body["id"] == "abc" and [o["name"] for o in body["outputs"]] == ["OUTPUT1"]
    assert body["model_name"] == "add_sub" and body["model_version"] == "1"  # an unversioned model is version 1
    assert body["outputs"][0]["data"] == [0.5] * 16
    meta = http.get_model_metadata("add_sub")
    assert meta["platform"] == "onnxruntime_onnx" and meta["inputs"][0] == {"name": "INPUT0", "datatype": "FP32",
                                                                           "shape": [-1, 16]}
    assert http.get_server_metadata()["extensions"] == ["binary_tensor_data", "model_configuration", "statistics",
                                                        "model_repository"]
    assert http.is_server_live() and http.is_server_ready() and http.is_model_ready("add_one")
    assert not http.is_model_ready("nope")
    # the KServe v2 health bodies (the `kserve` client reads them; tritonclient reads only the status)
    assert httpx.get(server.url + "/v2/health/live").json() == {"live": True}
    assert httpx.get(server.url + "/v2/health/ready").json() == {"ready": True}
    assert httpx.get(server.url + "/v2/models/add_one/ready").json() == {"name": "add_one", "ready": True}


def test_triton_model_config_and_kserve_errors_on_every_v2_path(server, http, grpc_client):
    """tritonclient's get_model_config reads Triton's configuration; any KServe path rsinfer does not serve - a
    Triton extension included - answers with KServe's body, which tritonclient turns into a readable exception;
    Cohere's /v2/rerank keeps its own body."""
    from tritonclient.utils import InferenceServerException

    cfg = http.get_model_config("add_sub")
    assert cfg["name"] == "add_sub" and cfg["platform"] == "onnxruntime_onnx" and cfg["max_batch_size"] == 4
    assert cfg["input"][0] == {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]}     # no batch dimension
    assert [o["name"] for o in cfg["output"]] == ["OUTPUT0", "OUTPUT1"]
    plain = http.get_model_config("int64_identity")
    assert plain["max_batch_size"] == 0 and "dynamic_batching" not in plain
    assert plain["input"][0]["data_type"] == "TYPE_INT64" and len(plain["input"][0]["dims"]) >= 1
    assert "dynamic_batching" in http.get_model_config("solo")
    g = grpc_client.get_model_config("add_sub", as_json=True)["config"]     # the same over gRPC
    assert g["name"] == "add_sub" and g["platform"] == "onnxruntime_onnx" and g["max_batch_size"] == 4
    assert g["input"][0] == {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": ["16"]}   # int64 in proto JSON
    assert "dynamic_batching" in grpc_client.get_model_config("solo", as_json=True)["config"]
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope' is not found"):
        grpc_client.get_model_config("nope")
    with pytest.raises(InferenceServerException, match="shared-memory extension"):
        http.get_system_shared_memory_status()
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope' is not found"):
        http.get_model_config("nope")
    unknown = httpx.get(server.url + "/v2/models/add_one/nonsense")
    assert unknown.status_code == 404 and unknown.json() == {
        "error": "no such KServe v2 route: /v2/models/add_one/nonsense"}
    cohere = httpx.get(server.url + "/v2/rerank")
    assert "message" in cohere.json()["error"]           # not a KServe path: the OpenAI-style body


def fp32(name: str, shape: list[int], data: list | None = None, datatype: str = "FP32") -> dict:
    n = int(np.prod(shape)) if shape else 1
    return {"name": name, "datatype": datatype, "shape": shape, "data": data if data is not None else [1.0] * n}


@pytest.mark.parametrize(("model", "inputs", "status", "says"), [
    ("add_one", [fp32("NOPE", [1, 4])], 400, "unknown input 'NOPE'; the model's inputs are INPUT0 (FP32 [-1, 4])"),
    ("add_sub", [fp32("INPUT0", [1, 16])], 400, "missing input(s) INPUT1"),
    ("add_one", [fp32("INPUT0", [1, 4], [1, 2, 3, 4], "INT32")], 400,
     "input 'INPUT0' has datatype INT32 but the model expects FP32"),
    ("add_one", [fp32("INPUT0", [1, 1, 4])], 400, "expects rank 2"),
    ("add_one", [fp32("INPUT0", [1, 5])], 400, "dimension 1 must be 4"),
    ("add_one", [fp32("INPUT0", [1, 4], [1.0] * 3)], 400, "has 3 elements but shape [1, 4] holds 4"),
    ("add_one", [fp32("INPUT0", [9, 4])], 400, "batch size 9; at most 8 (max_batch_size)"),
    ("add_one", [fp32("INPUT0", [1, 4], ["a", "b", "c", "d"])], 400, "FP32 elements must be numbers"),
    ("add_one", [{"name": "INPUT0", "datatype": "FP99", "shape": [1, 4], "data": [1] * 4}], 400, "unknown datatype"),
    ("nope", [fp32("INPUT0", [1, 4])], 404, "Request for unknown model: 'nope' is not found"),
])
def test_bad_tensors_are_400_with_kserve_body(server, model, inputs, status, says):
    r = httpx.post(server.url + f"/v2/models/{model}/infer", json={"inputs": inputs})
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error"} and says in r.json()["error"]


@pytest.mark.parametrize(("size", "tail", "says"), [
    (16, 20, "4 bytes of binary data are not claimed by any input"),
    (12, 12, "has 12 bytes of data but shape [1, 4] of FP32 needs 16"),
    (20, 16, "binary_data_size 20 does not fit the 16 bytes"),
])
def test_bad_binary_framing(server, size, tail, says):
    raw = np.ones((1, 8), np.float32).tobytes()[:tail]
    head = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
                                   "parameters": {"binary_data_size": size}}]}).encode()
    r = httpx.post(server.url + "/v2/models/add_one/infer", content=head + raw,
                   headers={"Inference-Header-Content-Length": str(len(head))})
    assert r.status_code == 400 and says in r.json()["error"]


def test_grpc_errors_carry_status_codes(grpc_client):
    import grpc
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException, match="dimension 1 must be 4") as info:
        triton_infer(grpc_client, "grpc", "add_one", {"INPUT0": np.zeros((1, 5), np.float32)}, {"INPUT0": "FP32"})
    assert info.value.status() == str(grpc.StatusCode.INVALID_ARGUMENT)
    with pytest.raises(InferenceServerException, match="not found") as info:
        triton_infer(grpc_client, "grpc", "nope", {"INPUT0": np.zeros((1, 4), np.float32)}, {"INPUT0": "FP32"})
    assert info.value.status() == str(grpc.StatusCode.NOT_FOUND)


def test_grpc_remembered_headers_and_answers_stay_exact(server):
    """The servicer remembers an input header it checked and the response it made for an answer's outputs; every
    request still gets its own data, id, shapes and version, and its errors (the wrong number of bytes under a
    remembered header, a name given twice, another version) as if nothing were remembered."""
    import grpc

    from rsinfer_cli.server.kserve import kserve_pb2 as pb
    from rsinfer_cli.server.kserve import kserve_pb2_grpc as pb_grpc

    def request(model: str, rows: np.ndarray, rid: str = "", version: str = "", names: tuple[str, ...] = ("INPUT0",),
                data: bytes | None = None) -> pb.ModelInferRequest:
        r = pb.ModelInferRequest(model_name=model, model_version=version, id=rid)
        for name in names:
            r.inputs.add(name=name, datatype="FP32", shape=list(rows.shape))
            r.raw_input_contents.append(rows.tobytes() if data is None else data)
        return r

    def output(answer: pb.ModelInferResponse) -> np.ndarray:
        (out,) = answer.outputs
        assert out.name == "OUTPUT0" and out.datatype == "FP32"
        return np.frombuffer(answer.raw_output_contents[0], np.float32).reshape(list(out.shape))

    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        for k in range(3):       # the same header three times: the first checked, the others remembered
            rows = np.arange(8, dtype=np.float32).reshape(2, 4) * (k + 1)
            answer = stub.ModelInfer(request("add_one", rows, rid=f"call-{k}"))
            assert answer.id == f"call-{k}" and answer.model_name == "add_one" and answer.model_version == "1"
            np.testing.assert_array_equal(output(answer), rows + 1)
        assert stub.ModelInfer(request("add_one", np.ones((2, 4), np.float32))).id == ""   # none given: none
        rows = np.ones((3, 4), np.float32)       # another batch size: another header and another answer's shape
        np.testing.assert_array_equal(output(stub.ModelInfer(request("add_one", rows))), rows + 1)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request("add_one", np.ones((2, 4), np.float32), data=b"\0" * 12))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "has 12 bytes of data but shape [2, 4] of FP32 needs 32" in info.value.details()
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request("add_one", np.ones((2, 4), np.float32), names=("INPUT0", "INPUT0")))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "given twice" in info.value.details()
        for version, plus in (("1", 1), ("2", 2), ("1", 1)):     # one header, two models: each its own answer
            answer = stub.ModelInfer(request("pinned", np.zeros((1, 4), np.float32), version=version))
            assert answer.model_version == version
            np.testing.assert_array_equal(output(answer), np.full((1, 4), plus, np.float32))


def test_grpc_typed_contents_several_inputs_and_requested_outputs(server):
    """Inputs in the typed `contents` fields (not raw bytes), two of them, and one output of two requested: the
    servicer reads every repeated field (inputs, contents, shape, outputs) whole, answers with just that output, and
    refuses contents whose count does not fill the shape, or raw contents given for some inputs only."""
    import grpc

    from rsinfer_cli.server.kserve import kserve_pb2 as pb
    from rsinfer_cli.server.kserve import kserve_pb2_grpc as pb_grpc

    a, b = np.arange(32, dtype=np.float32).reshape(2, 16), np.full((2, 16), 0.5, np.float32)

    def request(first: list[float], outputs: tuple[str, ...] = ("OUTPUT1",)) -> pb.ModelInferRequest:
        r = pb.ModelInferRequest(model_name="add_sub", id="typed")
        for name, values in (("INPUT0", first), ("INPUT1", b.reshape(-1).tolist())):
            r.inputs.add(name=name, datatype="FP32", shape=[2, 16],
                         contents=pb.InferTensorContents(fp32_contents=values))
        for name in outputs:
            r.outputs.add(name=name)
        return r

    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        answer = stub.ModelInfer(request(a.reshape(-1).tolist()))
        assert answer.id == "typed" and [o.name for o in answer.outputs] == ["OUTPUT1"]
        assert list(answer.outputs[0].shape) == [2, 16]
        np.testing.assert_array_equal(np.frombuffer(answer.raw_output_contents[0], np.float32).reshape(2, 16), a - b)
        both = stub.ModelInfer(request(a.reshape(-1).tolist(), ("OUTPUT0", "OUTPUT1")))
        assert [o.name for o in both.outputs] == ["OUTPUT0", "OUTPUT1"]
        np.testing.assert_array_equal(np.frombuffer(both.raw_output_contents[0], np.float32).reshape(2, 16), a + b)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request(a.reshape(-1).tolist()[:31]))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "input 'INPUT0' has 31 elements but shape [2, 16] holds 32" in info.value.details()
        half = request(a.reshape(-1).tolist())
        half.raw_input_contents.append(a.tobytes())        # raw bytes for one input of two
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(half)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "1 raw_input_contents for 2 inputs" in info.value.details()


def test_grpc_stream_answers_in_order_and_survives_a_bad_request(grpc_client):
    import queue

    import tritonclient.grpc as tg

    results: queue.Queue = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for k, width in enumerate([4, 5, 4]):
            i = tg.InferInput("INPUT0", [1, width], "FP32")
            i.set_data_from_numpy(np.full((1, width), float(k), np.float32))
            grpc_client.async_stream_infer("add_one", [i], request_id=str(k))
        got = [results.get(timeout=20) for _ in range(3)]
    finally:
        grpc_client.stop_stream()
    assert got[0][1] is None and got[0][0].as_numpy("OUTPUT0").tolist() == [[1.0] * 4]
    assert got[1][0] is None and "dimension 1 must be 4" in str(got[1][1])
    assert got[2][1] is None and got[2][0].as_numpy("OUTPUT0").tolist() == [[3.0] * 4]


def test_concurrent_requests_are_batched_and_each_gets_its_rows(server):
    """64 concurrent [1,4] requests on one replica with max_batch_size 64: rows of several requests share
    forwards, and every caller gets exactly its own row back."""
    before = forwards(server.url, "solo")

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            return await asyncio.gather(*(c.post("/v2/models/solo/infer", json={"inputs": [
                fp32("INPUT0", [1, 4], [float(k), k + 0.25, -k, 2.0 * k])]}) for k in range(64)))

    answers = asyncio.run(main())
    for k, r in enumerate(answers):
        assert r.json()["outputs"][0]["data"] == [k + 1.0, k + 1.25, 1.0 - k, 2.0 * k + 1]
    after = forwards(server.url, "solo")
    n_forwards, n_rows = after[0] - before[0], after[1] - before[1]
    assert n_rows == 64 and n_forwards < 64


def test_weighted_versions_and_named_versions(server, http):
    versions = []
    for _ in range(20):  # two windows of 10: 7 + 3 in each, in a fixed order
        r = httpx.post(server.url + "/v2/models/adder/infer", json={"inputs": [fp32("INPUT0", [1, 4], [0.0] * 4)]})
        body = r.json()
        versions.append(body["model_version"])
        assert body["outputs"][0]["data"] == [1.0 if body["model_version"] == "1" else 2.0] * 4
    assert versions[:10] == versions[10:] and versions[:10].count("1") == 7
    for window in range(11):
        assert versions[window:window + 10].count("1") == 7  # 70/30 over any 10 consecutive requests
    r = httpx.post(server.url + "/v2/models/adder/versions/2/infer", json={"inputs": [fp32("INPUT0", [1, 4])]})
    assert r.json()["model_version"] == "2" and r.json()["outputs"][0]["data"] == [3.0] * 4
    r = httpx.post(server.url + "/v2/models/adder/versions/9/infer", json={"inputs": [fp32("INPUT0", [1, 4])]})
    assert r.status_code == 404 and "no version '9'" in r.json()["error"]
    r = httpx.post(server.url + "/v2/models/pinned/infer", json={"inputs": [fp32("INPUT0", [1, 4], [0.0] * 4)]})
    assert r.json()["model_version"] == "2"  # default_version answers when there are no weights
    assert http.get_model_metadata("adder")["versions"] == ["1", "2"]
    assert http.is_model_ready("adder", "2") and not http.is_model_ready("adder", "9")
    res = triton_infer(http, "http", "adder", {"INPUT0": np.zeros((1, 4), np.float32)}, {"INPUT0": "FP32"},
                       version="1")
    assert res.get_response()["model_version"] == "1"
    models = {m["id"]: m for m in httpx.get(server.url + "/v1/models").json()["data"]}
    assert [v["version"] for v in models["adder"]["versions"]] == ["1", "2"]
    assert [v["weight"] for v in models["adder"]["versions"]] == [70, 30]
    assert forwards(server.url, "adder", "2")[0] > 0  # per-version metrics


def test_inferstack_routes(server):
    r = httpx.post(server.url + "/infer", json={"model": "add_one", "input": [[1.0, 2.0, 3.0, 4.0]]})
    assert r.json() == {"output": [[2.0, 3.0, 4.0, 5.0]], "outputs": {"OUTPUT0": [[2.0, 3.0, 4.0, 5.0]]},
                        "model_version": "1"}
    r = httpx.post(server.url + "/infer", json={"model": "add_sub", "inputs": {"INPUT0": [[1.0] * 16],
                                                                               "INPUT1": [[2.0] * 16]}})
    assert r.json()["outputs"] == {"OUTPUT0": [[3.0] * 16], "OUTPUT1": [[-1.0] * 16]}
    r = httpx.post(server.url + "/infer", json={"model": "adder", "model_version": "2", "input": [[0, 0, 0, 0]]})
    assert r.json()["model_version"] == "2" and r.json()["output"] == [[2.0] * 4]
    r = httpx.post(server.url + "/batch", json={"model": "add_one", "input": [[1, 1, 1, 1], [2, 2, 2, 2]]})
    assert r.json()["outputs"] == [{"OUTPUT0": [2.0] * 4}, {"OUTPUT0": [3.0] * 4}]
    r = httpx.post(server.url + "/batch", json={"model": "add_one", "input": [[1, 1, 1, 1]] * 9})
    assert r.status_code == 400 and "at most 8" in r.json()["error"]
    r = httpx.post(server.url + "/infer", json={"model": "add_one", "input": [[1, 2], [3]]})
    assert r.status_code == 400 and "ragged" in r.json()["error"]
    listed = {m["name"]: m for m in httpx.get(server.url + "/models").json()["models"]}
    assert listed["adder"]["versions"][1]["inputs"] == [{"name": "INPUT0", "shape": [-1, 4], "dtype": "float32"}]


def test_api_key_on_grpc_and_kserve_http(shared_models, serve_mode):
    import grpc
    import tritonclient.grpc as tg
    from tritonclient.utils import InferenceServerException

    cfg = parse_config({"server": {"api_keys": ["k1"]}, "models": [
        {"name": "add_one", "kind": "tensor", "path": str(shared_models / "tensor-models" / "add_one"),
         "replicas": 1}]})
    with ServerThread(cfg, grpc=True, mode=serve_mode) as srv:
        client = tg.InferenceServerClient(srv.grpc_url)
        assert client.is_server_live()  # health is open, like /health
        with pytest.raises(InferenceServerException) as info:
            client.get_model_metadata("add_one")
        assert info.value.status() == str(grpc.StatusCode.UNAUTHENTICATED)
        assert client.get_model_metadata("add_one", headers={"authorization": "Bearer k1"}).name == "add_one"
        assert httpx.get(srv.url + "/v2/models/add_one").status_code == 401
        assert httpx.get(srv.url + "/v2/health/ready").status_code == 200


def test_version_config_errors():
    base = {"name": "m", "kind": "tensor", "versions": [{"version": "1", "path": "a", "weight": 60},
                                                         {"version": "2", "path": "b", "weight": 30}]}
    with pytest.raises(ConfigError, match=r"models\[0\]\.versions: weights must sum to 100, got 90"):
        parse_config({"models": [base]})
    with pytest.raises(ConfigError, match=r"models\[0\]\.default_version: '3' is not one of the versions"):
        parse_config({"models": [{**base, "versions": [{"version": "1", "path": "a"}], "default_version": "3"}]})
    with pytest.raises(ConfigError, match=r"either every version has a `weight` or none has"):
        parse_config({"models": [{**base, "versions": [{"version": "1", "path": "a", "weight": 100},
                                                       {"version": "2", "path": "b"}]}]})


def test_max_batch_size_needs_a_batch_dimension(tmp_path):
    from rsinfer_cli.engine.registry import Registry
    from rsinfer_cli.errors import ModelLoadError
    from rsinfer_cli.runtime import Runtime
    from rsinfer_cli.server.app import create_app
    from rsinfer_cli.server.metrics import Metrics

    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])
    (tmp_path / "fixed").mkdir()
    onnx.save(helper.make_model(helper.make_graph([helper.make_node("Identity", ["X"], ["Y"])], "g", [x], [y]),
                                opset_imports=[helper.make_opsetid("", 13)], ir_version=8),
              str(tmp_path / "fixed" / "model.onnx"))
    cfg = parse_config({"models": [{"name": "f", "kind": "tensor", "path": str(tmp_path / "fixed"),
                                    "max_batch_size": 4, "replicas": 1}]})
    with pytest.raises(ModelLoadError, match="without a variable batch dimension 0; set max_batch_size: 0"):
        create_app(Runtime(cfg, Registry.load(cfg), Metrics()))


def test_one_shot_commands_take_a_versioned_models_default_version(shared_models, tmp_path):
    import subprocess
    import sys

    tm = shared_models / "tensor-models"
    cfg = tmp_path / "v.yaml"
    cfg.write_text(f"models:\n  - name: adder\n    kind: tensor\n    default_version: '2'\n    versions:\n"
                   f"      - {{version: '1', path: '{tm / 'add_one'}'}}\n"
                   f"      - {{version: '2', path: '{tm / 'add_sub'}'}}\n")
    proc = subprocess.run([sys.executable, "-m", "rsinfer_cli", "inspect", "adder", "--config", str(cfg), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert [t["name"] for t in json.loads(proc.stdout)["graph"]["inputs"]] == ["INPUT0", "INPUT1"]  # add_sub: v2


class TestInputRules:
    """min_elements / max_elements (per row) and normalize_input: minmax (per row, before the forward and the
    row cache)."""

    @pytest.fixture
    def served(self, tmp_path, serve_mode):
        import synth

        add = synth.add_graph(tmp_path / "add" / "model.onnx", value=0.0, width=4).parent
        cfg = parse_config({"server": {"cache": {"backend": "memory"}}, "models": [
            {"name": "bounded", "kind": "tensor", "path": str(add), "max_batch_size": 8, "min_elements": 4,
             "max_elements": 4},
            {"name": "narrow", "kind": "tensor", "path": str(add), "max_batch_size": 8, "max_elements": 3},
            {"name": "minmax", "kind": "tensor", "path": str(add), "max_batch_size": 8,
             "normalize_input": "minmax"}]})
        with ServerThread(cfg, mode=serve_mode) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
            yield c

    def test_bounds_are_checked_per_row(self, served):
        ok = served.post("/v2/models/bounded/infer", json={"inputs": [
            {"name": "X", "datatype": "FP32", "shape": [3, 4], "data": [1.0] * 12}]})
        assert ok.status_code == 200
        refused = served.post("/v2/models/narrow/infer", json={"inputs": [
            {"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4}]})
        assert refused.status_code == 400
        assert refused.json() == {"error": "input 'X' has 4 elements per row; this model takes 0..3 "
                                           "(min_elements..max_elements)"}
        card = next(m for m in served.get("/v1/models").json()["data"] if m["id"] == "narrow")
        assert card["pipeline"]["max_elements"] == 3

    def test_minmax_per_row_and_the_cache_sees_normalized_rows(self, served):
        def send(data: list[float]) -> httpx.Response:
            return served.post("/v2/models/minmax/infer", json={"inputs": [
                {"name": "X", "datatype": "FP32", "shape": [2, 4], "data": data}]})

        r = send([0, 5, 10, 20, 7, 7, 7, 7])
        assert r.status_code == 200
        assert r.json()["outputs"][0]["data"] == [0.0, 0.25, 0.5, 1.0, 0.0, 0.0, 0.0, 0.0]   # a flat row: zeros
        scaled = send([0, 50, 100, 200, 1, 1, 1, 1])         # the same rows after minmax: served from the cache
        assert scaled.headers["x-rsinfer-cache"] == "hit"
        assert scaled.json()["outputs"][0]["data"] == r.json()["outputs"][0]["data"]

    def test_load_time_rules(self, tmp_path):
        from rsinfer_cli.config import ModelConfig
        from rsinfer_cli.engine.model import load_model
        from rsinfer_cli.errors import ModelLoadError
        from rsinfer_cli.pipelines.tensor import TensorOptions, TensorPipeline

        import synth

        d = synth.add_graph(tmp_path / "a" / "model.onnx").parent
        with pytest.raises(ModelLoadError, match=r"min_elements \(5\) is above max_elements \(4\)"):
            TensorPipeline(load_model(ModelConfig(name="a", kind="tensor", path=str(d),
                                                  options=TensorOptions(min_elements=5, max_elements=4))))
        with pytest.raises(ConfigError, match=r"models\[0\].normalize_input: applies to kind tensor only"):
            parse_config({"models": [{"name": "e", "kind": "embedding", "path": "x", "normalize_input": "minmax"}]})



def test_input_checks_add_the_batch_dimension_to_exactly_the_inputs_without_it(tmp_path):
    """TensorPipeline.check over two inputs: the batch dimension is added to exactly the inputs that left it out,
    the batch size is None when the request left it out and the real size otherwise; a batch above max_batch_size
    and inputs that disagree on it are refused, every time."""
    from rsinfer_cli.engine.registry import Registry
    from rsinfer_cli.errors import InputError
    from rsinfer_cli.pipelines import build_pipeline

    a = helper.make_tensor_value_info("A", TensorProto.FLOAT, ["batch", 2])
    b = helper.make_tensor_value_info("B", TensorProto.FLOAT, ["batch", 2])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 2])
    graph = helper.make_graph([helper.make_node("Add", ["A", "B"], ["Y"])], "add_ab", [a, b], [y])
    (tmp_path / "ab").mkdir()
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8),
              str(tmp_path / "ab" / "model.onnx"))
    cfg = parse_config({"models": [{"name": "ab", "kind": "tensor", "path": str(tmp_path / "ab"),
                                    "max_batch_size": 4}]})
    registry = Registry.load(cfg)
    pipe = build_pipeline(registry.get("ab", "tensor", None))
    f = np.float32
    cases = [   # (inputs, the shapes checked, the batch size)
        ({"A": np.ones(2, f), "B": np.ones((1, 2), f)}, {"A": (1, 2), "B": (1, 2)}, None),   # one leaves it out
        ({"A": np.ones(2, f), "B": np.ones(2, f)}, {"A": (1, 2), "B": (1, 2)}, None),         # both do
        ({"A": np.ones((3, 2), f), "B": np.ones((3, 2), f)}, {"A": (3, 2), "B": (3, 2)}, 3),  # a batch of 3
    ]
    for tensors, shapes, batch in cases:
        for _ in range(2):                                      # the same answer every time
            got, got_batch = pipe.check(tensors)
            assert got_batch == batch and {k: v.shape for k, v in got.items()} == shapes
            assert all(np.array_equal(got[k].reshape(-1), tensors[k].reshape(-1)) for k in got)
    refused = {"A": np.ones((5, 2), f), "B": np.ones((5, 2), f)}   # batch 5 > max_batch_size 4
    for _ in range(2):
        with pytest.raises(InputError, match="at most 4"):
            pipe.check(refused)
    with pytest.raises(InputError, match="agree on dimension 0"):
        pipe.check({"A": np.ones((2, 2), f), "B": np.ones((3, 2), f)})
