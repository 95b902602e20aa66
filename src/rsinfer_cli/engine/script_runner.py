"""The long-lived side of a python script model: run by the model's own venv python, so it imports nothing of
rsinfer and needs only the standard library and numpy.

    venv/bin/python script_runner.py MODEL_FOLDER

It imports the folder's main.py once, calls `initialize(config)` if defined, then answers requests on its stdin and
stdout until stdin closes, and calls `finalize()` if defined. The model's own prints go to stderr (the server's log):
the protocol owns stdout. A frame is a 4-byte little-endian length, a JSON header of that length, then the raw
little-endian buffers the header lists, in order:
    {"tensors": [{"name", "dtype", "shape", "nbytes"}, ...]}      a request, or an answer
    {"error": "..."}                                              an answer: infer() raised
    {"ready": true} / {"error": "..."}                           once, after import and initialize()
"""

import importlib.util
import json
import os
import struct
import sys
import traceback


def read_exact(stream, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf                         # writable: infer() may work on its inputs in place


def read_frame(stream, np):
    head = read_exact(stream, 4)
    if head is None:
        return None
    header = json.loads(read_exact(stream, struct.unpack("<I", head)[0]))
    tensors = {}
    for t in header.get("tensors", ()):
        data = read_exact(stream, t["nbytes"]) if t["nbytes"] else b""
        dt = np.dtype(t["dtype"]).newbyteorder("<")
        tensors[t["name"]] = np.frombuffer(data, dtype=dt).astype(t["dtype"], copy=False).reshape(t["shape"])
    return tensors


def write_frame(stream, header, buffers=()):
    raw = json.dumps(header).encode()
    stream.write(struct.pack("<I", len(raw)) + raw)
    for b in buffers:
        stream.write(b)
    stream.flush()


def answer(np, outputs):
    if not isinstance(outputs, dict):
        raise TypeError(f"infer() must return a dict of name -> numpy array, got {type(outputs).__name__}")
    tensors, buffers = [], []
    for name, value in outputs.items():
        arr = np.asarray(value)
        if arr.dtype.kind not in "biuf":
            raise TypeError(f"output '{name}' has dtype {arr.dtype}; numeric and bool arrays only")
        arr = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
        tensors.append({"name": str(name), "dtype": arr.dtype.newbyteorder("=").name, "shape": list(arr.shape),
                        "nbytes": arr.nbytes})
        buffers.append(arr.tobytes())
    return {"tensors": tensors}, buffers


def main():
    folder = sys.argv[1]
    proto_in = os.fdopen(os.dup(0), "rb")
    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)                      # the model's prints (and print()'s stdout) go to stderr: the log
    sys.stdout = sys.stderr
    try:
        import numpy as np
    except ImportError:
        write_frame(proto_out, {"error": "numpy is missing from the model's venv (add numpy to requirements.txt)"})
        return 1
    try:
        sys.path.insert(0, folder)
        os.chdir(folder)
        spec = importlib.util.spec_from_file_location("main", os.path.join(folder, "main.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if hasattr(module, "initialize"):
            module.initialize(json.loads(os.environ.get("RSINFER_MODEL_CONFIG", "{}")))
    except BaseException as exc:
        traceback.print_exc()          # the whole story to the log; one line to the server's error
        where = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(folder)]
        line = f" ({os.path.basename(where[-1].filename)}, line {where[-1].lineno})" if where else ""
        what = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        write_frame(proto_out, {"error": f"main.py failed to load: {what}{line}"})
        return 1
    write_frame(proto_out, {"ready": True})
    while True:
        inputs = read_frame(proto_in, np)
        if inputs is None:
            break
        try:
            header, buffers = answer(np, module.infer(inputs))
        except Exception as exc:       # the request's own failure: reported, the process goes on
            traceback.print_exc()
            header, buffers = {"error": f"{type(exc).__name__}: {exc}"}, ()
        write_frame(proto_out, header, buffers)
    if hasattr(module, "finalize"):
        module.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
