"""pipelines/onnxconst.py: an ONNX file's nodes and small constants read off its wire format, as onnx itself reads
them, with weights skipped."""

from __future__ import annotations

import json

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from rsinfer_cli import onnxfile as onnxconst  # noqa: E402


def _model(path, inits, nodes):
    f = TensorProto.FLOAT
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, [2])],
                              [helper.make_tensor_value_info("y", f, None)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))


def test_small_constants_in_every_encoding_and_weights_skipped(tmp_path):
    half = np.array([3.140625], np.float16)
    inits = [numpy_helper.from_array(np.array(2.5, np.float32), "raw_f32"),
             helper.make_tensor("floats", TensorProto.FLOAT, [2], [1.5, -0.25]),            # float_data
             helper.make_tensor("half_ints", TensorProto.FLOAT16, [1], half.view(np.uint16).tolist()),  # int32_data
             numpy_helper.from_array(half, "half_raw"),
             helper.make_tensor("doubles", TensorProto.DOUBLE, [], [0.125]),
             helper.make_tensor("longs", TensorProto.INT64, [3], [-1, 0, 7]),
             numpy_helper.from_array(np.ones((64, 64), np.float32), "weight"),               # wide: skipped
             helper.make_tensor("far", TensorProto.FLOAT, [1], [9.0])]
    inits[-1].data_location = TensorProto.EXTERNAL                                          # external: skipped
    nodes = [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array([4.0], np.float32))),
             helper.make_node("Constant", [], ["cf"], value_float=0.5),
             helper.make_node("Add", ["x", "c"], ["y"])]
    _model(tmp_path / "m.onnx", inits, nodes)
    g = onnxconst.read_graph(tmp_path / "m.onnx")
    want = {t.name: numpy_helper.to_array(t) for t in inits[:6]}
    assert set(g.constants) == set(want)
    for name, value in want.items():
        assert g.constants[name].dtype == value.dtype and np.array_equal(g.constants[name], value), name
    assert [(n.op, n.inputs, n.outputs) for n in g.nodes] == [("Constant", [], ["c"]), ("Constant", [], ["cf"]),
                                                              ("Add", ["x", "c"], ["y"])]
    assert g.nodes[0].value.tolist() == [4.0] and float(g.nodes[1].value) == 0.5
    assert g.producer()["y"].op == "Add"


@pytest.mark.parametrize("data", [b"", b"\x08", b"\x3a\x05\x0a", b"\x3b\x00", b"\x08\x01"])
def test_not_an_onnx_file(tmp_path, data):
    (tmp_path / "bad.onnx").write_bytes(data)
    with pytest.raises(onnxconst.OnnxFileError, match="bad.onnx: "):
        onnxconst.read_graph(tmp_path / "bad.onnx")
    with pytest.raises(onnxconst.OnnxFileError, match="nope.onnx: "):
        onnxconst.read_graph(tmp_path / "nope.onnx")


def test_by_ranges_the_same_graph_without_the_weights(tmp_path):
    """A file read by byte ranges gives the graph the file gives, in few requests that skip the weights; its JSON
    form gives it back."""
    inits = [numpy_helper.from_array(np.full((512, 512), i, np.float32), f"w{i}") for i in range(6)]
    inits += [numpy_helper.from_array(np.array(1.5 + i, np.float32), f"s{i}") for i in range(6)]
    nodes = [helper.make_node("Add", ["x", "s0"], ["y"])]
    _model(tmp_path / "m.onnx", inits, nodes)
    data = (tmp_path / "m.onnx").read_bytes()
    read: list[tuple[int, int]] = []

    def fetch(start, end):
        read.append((start, end))
        return data[start:end]

    ranges = onnxconst.RangeBytes(len(data), fetch)
    graph = onnxconst.read_graph_from(ranges)
    want = onnxconst.read_graph(tmp_path / "m.onnx")
    assert graph.to_json() == want.to_json() and set(graph.constants) == {f"s{i}" for i in range(6)}
    assert ranges.requests == len(read) <= 12
    assert sum(e - s for s, e in read) < len(data) / 4        # 6 MB of weights, not transferred
    back = onnxconst.Graph.from_json(json.loads(json.dumps(graph.to_json())))
    assert back.to_json() == graph.to_json() and back.constants["s3"].dtype == np.float32
    with pytest.raises(onnxconst.OnnxFileError, match="returned"):
        onnxconst.read_graph_from(onnxconst.RangeBytes(len(data), lambda s, e: data[s:e - 1]))
    with pytest.raises(onnxconst.OnnxFileError, match="more than 2 range requests"):
        onnxconst.read_graph_from(onnxconst.RangeBytes(len(data), fetch, max_requests=2))
    with pytest.raises(onnxconst.OnnxFileError, match="not a graph's constants"):
        onnxconst.Graph.from_json({"nodes": [["Add"]], "constants": {}})
