"""pipelines/onnxconst.py: an ONNX file's nodes and small constants read off its wire format, as onnx itself reads
them, with weights skipped."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from rsinfer_cli.pipelines import onnxconst  # noqa: E402


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
