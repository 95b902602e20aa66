"""Script models against the same model as an ONNX graph, in one run.

    .venv/bin/python benchmarks/scripts.py           # its section of benchmarks/RESULTS.md

The model is `x * 2` over float32 [batch, 4], served four ways by one `rsinfer serve` (max_batch_size 64, the default
thread plan): an ONNX graph (Mul), a long-lived python main.py (`infer()` imported once per lane), nereid's
per-request python main.py (one process per forward) and a per-request C++ main.cpp (compiled at start-up). Measured
over KServe v2 REST (JSON): p50 of one client sending [1, 4], and requests/s of 64 clients. The model venvs are
made here without network: they see this interpreter's numpy through a .pth file. Every loop is bounded in count
and time; the load generator is in this process, on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _serve import Serve, write_results
from batching import ROOT, drive, machine

CONTRACT = "input_shape: [4]\noutput_shape: [4]\nmax_batch_size: 64\n"
LONG = '''def infer(inputs):
    return {"OUTPUT0": inputs["INPUT0"] * 2}
'''
PER_REQUEST = '''import os, struct, sys
raw = sys.stdin.buffer.read()
vals = struct.unpack("<%df" % (len(raw) // 4), raw)
with open(os.environ["NEREID_OUTPUT_PATH"], "wb") as f:
    f.write(("float32 " + os.environ["NEREID_INPUT_SHAPE"] + "\\n").encode())
    f.write(struct.pack("<%df" % len(vals), *[v * 2 for v in vals]))
'''
CPP = r'''#include <cstdio>
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
  for (auto& x : v) x *= 2.0f;
  FILE* f = std::fopen(std::getenv("NEREID_OUTPUT_PATH"), "wb");
  std::fprintf(f, "float32 %s\n", std::getenv("NEREID_INPUT_SHAPE"));
  std::fwrite(v.data(), sizeof(float), n, f);
  std::fclose(f);
  return 0;
}
'''


def onnx_folder(d: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    d.mkdir()
    x = helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 4])
    two = helper.make_tensor("two", TensorProto.FLOAT, [1], [2.0])
    graph = helper.make_graph([helper.make_node("Mul", ["INPUT0", "two"], ["OUTPUT0"])], "x2", [x], [y],
                              initializer=[two])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8),
              str(d / "model.onnx"))


def python_folder(d: Path, main: str) -> None:
    import numpy

    d.mkdir()
    (d / "main.py").write_text(main)
    (d / "requirements.txt").write_text("")
    (d / "model_inference.textproto").write_text(CONTRACT)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(d / "venv")], check=True, timeout=120)
    site = d / "venv" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site / "rsinfer-bench.pth").write_text(str(Path(numpy.__file__).parents[1]) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-seconds", type=float, default=10, help="per workload and model")
    ap.add_argument("--out", type=Path, default=ROOT / "RESULTS.md")
    args = ap.parse_args()
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1.0, 2.0, 3.0, 4.0]}]}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        onnx_folder(root / "onnx")
        python_folder(root / "long", LONG)
        python_folder(root / "perreq", PER_REQUEST)
        models = {"onnx": "ONNX graph (in process)", "long": "python, long-lived (infer() per lane)",
                  "perreq": "python, per request (nereid's contract)"}
        if shutil.which("c++"):
            (root / "cpp").mkdir()
            (root / "cpp" / "main.cpp").write_text(CPP)
            (root / "cpp" / "model_inference.textproto").write_text(CONTRACT)
            models["cpp"] = "C++, per request (compiled at start-up)"
        yaml = "".join(f"  - {{name: {m}, kind: tensor, path: '{root / m}', max_batch_size: 64}}\n" for m in models)
        results = {}
        with Serve(yaml, root, "max_queue: 1024", name="scripts") as srv:
            for m in models:
                route = f"/v2/models/{m}/infer"
                one = asyncio.run(drive(srv.url, route, [body] * 500, 1, args.max_seconds))
                many = asyncio.run(drive(srv.url, route, [body] * 100_000, 64, args.max_seconds))
                results[m] = (one, many)
    base = results["onnx"][0]["p50_ms"]
    lines = ["", "## Script models: the same x * 2 as a graph, long-lived python, per-request python and C++ "
             "(`scripts.py`)", "",
             f"Machine: {machine()}. Reproduce: `.venv/bin/python benchmarks/scripts.py` (one run). One server, "
             "max_batch_size 64, the default thread plan; KServe v2 REST with JSON tensors.", "",
             "| model | 1 client p50 (ms) | p50 - ONNX (ms) | 64 clients (requests/s) | / ONNX | errors |",
             "|---|---|---|---|---|---|"]
    onnx_rps = results["onnx"][1]["rps"]
    for m, label in models.items():
        one, many = results[m]
        lines.append(f"| {label} | {one['p50_ms']:.2f} | {one['p50_ms'] - base:+.2f} | {many['rps']:.0f} | "
                     f"{many['rps'] / onnx_rps:.2f} | {one['errors'] + many['errors']} |")
    lines.append("")
    return write_results(args.out, lines)


if __name__ == "__main__":
    sys.exit(main())
