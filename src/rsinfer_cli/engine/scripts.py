"""Script models for `kind: tensor` (nereid's model folders): a model that is code, run out of process.

A folder is served by one of three backends, detected from its files or set with `backend:`:
- `onnx`: a `*.onnx` graph, in process (engine/model.py);
- `python`: `main.py` + `requirements.txt`, run in the folder's own virtualenv `venv/` (reused when it exists,
  else created and `requirements.txt` installed into it at start-up);
- `exec` (nereid's `cpp`): `main.cpp`, compiled at start-up with `c++ -O2 -std=c++17`, or an executable
  `build.sh` that builds `model`, or a prebuilt executable `model`.

Both script backends speak nereid's per-request contract, one process per forward: the input tensor's raw
little-endian bytes on stdin with `NEREID_INPUT_SHAPE` (comma-separated, batch included) and `NEREID_INPUT_DTYPE`
in the environment; the process writes `NEREID_OUTPUT_PATH` as a header line `"<dtype> d0,d1,...\\n"` and the raw
little-endian bytes. A crash, a signal, a non-zero exit, a missing or malformed frame, a frame that disagrees with
the declared output, or a run past the deadline (the process group is killed) fails that forward, and nothing
else. The child's stdout/stderr go to the server log (debug), never to clients.

The tensors come from `model_inference.textproto` (nereid's folder contract), parsed by protobuf's text-format
parser against a schema written here: `input_shape`, `output_shape`, `max_batch_size`, `data_type` (FP32 by
default; Triton's `TYPE_FP32` spellings too), or `input {}` / `output {}` blocks (name, data_type, shape or dims).
A single-tensor model's tensors are `INPUT0` and `OUTPUT0`. `-1` is a free dimension; with `max_batch_size > 0`
the batch is a leading dimension on top of the declared shape.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..config import ModelConfig
from ..errors import InferenceError, ModelLoadError
from .session import TensorInfo

log = logging.getLogger("rsinfer.engine")

CONTRACT_FILE = "model_inference.textproto"
SCRIPT_BACKENDS = ("python", "exec")
ALIASES = {"cpp": "exec"}
# the contract's datatypes → numpy dtype names (what ORT and the tensor pipeline use)
DTYPES = {"BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
          "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64", "FP16": "float16",
          "FP32": "float32", "FP64": "float64"}
FRAME_HEADER_MAX = 4096
_IGNORED = {"venv", "__pycache__", ".git"}


# ------------------------------------------------------------------ which backend


def _files(folder: Path) -> list[str]:
    """Files of the folder (and its subfolders, not venv/), relative."""
    out = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if d not in _IGNORED]
        out += [os.path.relpath(os.path.join(root, n), folder) for n in names]
    return sorted(out)


def detect(folder: Path, name: str) -> str:
    """The backend a folder's files call for; ModelLoadError naming the files when several or none match."""
    files = _files(folder)
    top = set(files)
    found = {}
    onnx = [f for f in files if f.endswith(".onnx")]
    if onnx:
        found["onnx"] = ", ".join(onnx[:3])
    if "main.py" in top:
        found["python"] = "main.py"
    execs = [f for f in ("main.cpp", "build.sh", "model") if f in top]
    if execs:
        found["exec"] = ", ".join(execs)
    if len(found) == 1:
        return next(iter(found))
    seen = ", ".join(files[:12]) + (", ..." if len(files) > 12 else "") or "no files"
    if not found:
        raise ModelLoadError(f"model '{name}': no backend matches folder {folder.name}/ (saw: {seen}); it needs a "
                             "*.onnx graph, main.py + requirements.txt, or main.cpp / build.sh / model", model=name)
    which = "; ".join(f"{b} ({why})" for b, why in found.items())
    raise ModelLoadError(f"model '{name}': folder {folder.name}/ matches several backends: {which}; set "
                         f"`backend:` to one of them", model=name)


def script_backend(cfg: ModelConfig) -> str | None:
    """`python` or `exec` for a script model, None for an ONNX graph."""
    if cfg.kind != "tensor":
        return None
    backend = ALIASES.get(cfg.backend, cfg.backend)
    if backend == "onnx":
        return None
    if cfg.path is None:
        if backend in SCRIPT_BACKENDS:
            raise ModelLoadError(f"model '{cfg.name}': backend {backend} serves a local folder; set `path:`",
                                 model=cfg.name)
        return None
    folder = Path(cfg.path).expanduser()
    if not folder.is_dir():
        return None    # resolution says what is wrong with it
    if backend == "auto":
        backend = detect(folder, cfg.name)
    return backend if backend in SCRIPT_BACKENDS else None


# ------------------------------------------------------------------ the folder contract


_SCHEMA: Any = None


def _schema() -> Any:
    """The message class of model_inference.textproto, from a schema built here (no protoc step):

        enum DataType { TYPE_INVALID = 0; BOOL = 1; ...; FP64 = 12; TYPE_BOOL = 1; ... }   // allow_alias
        message Tensor { string name = 1; DataType data_type = 2; repeated int64 shape = 3; repeated int64 dims = 4; }
        message ModelInference { repeated int64 input_shape = 1; repeated int64 output_shape = 2;
            int64 max_batch_size = 3; DataType data_type = 4; repeated Tensor input = 5; repeated Tensor output = 6;
            string name = 7; }
    """
    global _SCHEMA
    if _SCHEMA is not None:
        return _SCHEMA
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    f = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="rsinfer/model_inference.proto", package="rsinfer.nereid",
                                             syntax="proto3")
    enum = fdp.enum_type.add(name="DataType")
    enum.options.allow_alias = True
    enum.value.add(name="TYPE_INVALID", number=0)
    for i, dt in enumerate(DTYPES, start=1):
        enum.value.add(name=dt, number=i)
        enum.value.add(name=f"TYPE_{dt}", number=i)
    tensor = fdp.message_type.add(name="Tensor")
    tensor.field.add(name="name", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    tensor.field.add(name="data_type", number=2, type=f.TYPE_ENUM, type_name=".rsinfer.nereid.DataType",
                     label=f.LABEL_OPTIONAL)
    tensor.field.add(name="shape", number=3, type=f.TYPE_INT64, label=f.LABEL_REPEATED)
    tensor.field.add(name="dims", number=4, type=f.TYPE_INT64, label=f.LABEL_REPEATED)
    model = fdp.message_type.add(name="ModelInference")
    model.field.add(name="input_shape", number=1, type=f.TYPE_INT64, label=f.LABEL_REPEATED)
    model.field.add(name="output_shape", number=2, type=f.TYPE_INT64, label=f.LABEL_REPEATED)
    model.field.add(name="max_batch_size", number=3, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    model.field.add(name="data_type", number=4, type=f.TYPE_ENUM, type_name=".rsinfer.nereid.DataType",
                    label=f.LABEL_OPTIONAL)
    model.field.add(name="input", number=5, type=f.TYPE_MESSAGE, type_name=".rsinfer.nereid.Tensor",
                    label=f.LABEL_REPEATED)
    model.field.add(name="output", number=6, type=f.TYPE_MESSAGE, type_name=".rsinfer.nereid.Tensor",
                    label=f.LABEL_REPEATED)
    model.field.add(name="name", number=7, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    _SCHEMA = message_factory.GetMessageClass(pool.FindMessageTypeByName("rsinfer.nereid.ModelInference"))
    return _SCHEMA


@dataclass(frozen=True)
class Contract:
    inputs: tuple[TensorInfo, ...]      # with the batch dimension when max_batch_size > 0
    outputs: tuple[TensorInfo, ...]
    max_batch_size: int
    file: str


def _dtype(value: int, where: str, default: str = "float32") -> str:
    if value == 0:
        return default
    return list(DTYPES.values())[value - 1]


def read_contract(folder: Path, name: str) -> Contract:
    """model_inference.textproto → the declared tensors; every mistake a ModelLoadError with its key path."""
    from google.protobuf import text_format

    path = folder / CONTRACT_FILE
    where = f"{folder.name}/{CONTRACT_FILE}"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ModelLoadError(f"model '{name}': {where} is missing: a script model declares its tensors there "
                             "(at least output_shape)", model=name) from None
    except OSError as exc:
        raise ModelLoadError(f"model '{name}': cannot read {where}: {exc.strerror}", model=name) from None
    msg = _schema()()
    try:
        text_format.Parse(text, msg)
    except text_format.ParseError as exc:
        said = str(exc).replace('Message type "rsinfer.nereid.ModelInference"', "the top level") \
            .replace('Message type "rsinfer.nereid.Tensor"', "an input/output block") \
            .replace('Enum type "rsinfer.nereid.DataType"', "data_type")
        if "data_type has no value named" in said:
            said += f" (one of {', '.join(DTYPES)}, or Triton's TYPE_FP32, ...)"
        raise ModelLoadError(f"model '{name}': {where}: line {said}", model=name) from None
    errors: list[str] = []
    if msg.max_batch_size < 0:
        errors.append(f"max_batch_size: must be >= 0, got {msg.max_batch_size}")
    default = _dtype(msg.data_type, "data_type")

    def dims(values: Any, key: str) -> tuple[int, ...]:
        for i, d in enumerate(values):
            if d == 0 or d < -1:
                errors.append(f"{key}[{i}]: must be -1 (free) or > 0, got {d}")
        return tuple(values)

    def tensors(blocks: Any, flat: Any, key: str, implicit: str) -> list[tuple[str, str, tuple[int, ...]]]:
        if blocks and flat:
            errors.append(f"{key}: give either {key}_shape or {key} {{}} blocks, not both")
        if not blocks:
            return [(implicit, default, dims(flat, f"{key}_shape"))] if flat else []
        out, seen = [], set()
        for i, b in enumerate(blocks):
            at = f"{key}[{i}]"
            if b.shape and b.dims:
                errors.append(f"{at}: give shape or dims, not both")
            tname = b.name or (implicit if len(blocks) == 1 else "")
            if not tname:
                errors.append(f"{at}.name: required when there are several {key} blocks")
            elif tname in seen:
                errors.append(f"{at}.name: duplicate name '{tname}'")
            seen.add(tname)
            out.append((tname, _dtype(b.data_type, f"{at}.data_type", default), dims(b.shape or b.dims,
                                                                                      f"{at}.shape")))
        return out

    ins = tensors(msg.input, msg.input_shape, "input", "INPUT0")
    outs = tensors(msg.output, msg.output_shape, "output", "OUTPUT0")
    if not outs:
        errors.append("output_shape: required (or output {} blocks): every reply is a declared tensor")
    if errors:
        lines = "\n  ".join(f"{where}: {e}" for e in errors)
        raise ModelLoadError(f"model '{name}': {CONTRACT_FILE} is invalid:\n  {lines}", model=name)
    batch = msg.max_batch_size > 0

    def info(t: tuple[str, str, tuple[int, ...]]) -> TensorInfo:
        shape: tuple[int | str | None, ...] = tuple(d if d > 0 else f"{t[0]}_d{i}" for i, d in enumerate(t[2]))
        return TensorInfo(t[0], t[1], (("batch",) if batch else ()) + shape)

    return Contract(inputs=tuple(info(t) for t in ins), outputs=tuple(info(t) for t in outs),
                    max_batch_size=int(msg.max_batch_size), file=where)


def agree_with_graph(cfg: ModelConfig, folder: Path, graph: Any) -> ModelConfig:
    """An ONNX folder that also carries model_inference.textproto (nereid's folders do): the declaration must
    agree with the graph (tensors by name, or by position for one tensor; dtype, rank, fixed dimensions), and its
    max_batch_size applies unless the config sets one."""
    import dataclasses

    c = read_contract(folder, cfg.name)
    problems = []
    for kind, declared, actual in (("input", c.inputs, graph.inputs), ("output", c.outputs, graph.outputs)):
        if len(declared) != len(actual):
            problems.append(f"it declares {len(declared)} {kind}(s), the graph has {len(actual)}")
            continue
        by_name = {t.name: t for t in actual}
        for i, d in enumerate(declared):
            a = by_name.get(d.name, actual[i] if len(actual) == 1 else None)
            if a is None:
                problems.append(f"{kind} '{d.name}' is not in the graph ({', '.join(t.name for t in actual)})")
                continue
            fixed = [(x, y) for x, y in zip(d.shape, a.shape, strict=False) if isinstance(x, int)
                     and isinstance(y, int) and y >= 0]
            if d.dtype != a.dtype or len(d.shape) != len(a.shape) or any(x != y for x, y in fixed):
                problems.append(f"{kind} '{d.name}' is declared {d.dtype} {list(d.shape)}, the graph's '{a.name}' "
                                f"is {a.dtype} {list(a.shape)}")
    if problems:
        raise ModelLoadError(f"model '{cfg.name}': {c.file} disagrees with the graph: {'; '.join(problems)}",
                             model=cfg.name)
    if not cfg.max_batch_size and c.max_batch_size:
        cfg = dataclasses.replace(cfg, max_batch_size=c.max_batch_size)
    return cfg


# ------------------------------------------------------------------ building the program


def _run_logged(argv: list[str], cwd: Path, what: str, name: str, timeout_s: float = 900) -> None:
    """A build step (venv, pip, compiler): its output to the log; a failure stops start-up with its last lines."""
    log.info("model %s: %s", name, what)
    try:
        proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise ModelLoadError(f"model '{name}': {what} failed: {argv[0]} not found", model=name) from None
    except subprocess.TimeoutExpired:
        raise ModelLoadError(f"model '{name}': {what} took longer than {timeout_s:.0f} s", model=name) from None
    for line in (proc.stdout + proc.stderr).splitlines():
        log.debug("model %s: %s", name, line)
    if proc.returncode != 0:
        tail = "\n    ".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
        raise ModelLoadError(f"model '{name}': {what} failed (exit {proc.returncode}):\n    {tail}", model=name)


def python_program(folder: Path, name: str) -> tuple[list[str], str]:
    """`venv/bin/python main.py`: the folder's venv reused, else created with requirements.txt installed."""
    if not (folder / "requirements.txt").is_file():
        raise ModelLoadError(f"model '{name}': {folder.name}/requirements.txt is missing (a python model lists "
                             "its dependencies there; an empty file is fine)", model=name)
    venv = folder / "venv"
    python = venv / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    if python.exists():
        how = "reused"
    else:
        _run_logged([sys.executable, "-m", "venv", str(venv)], folder, f"creating {folder.name}/venv", name)
        _run_logged([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-r", "requirements.txt"],
                    folder, f"installing {folder.name}/requirements.txt into its venv", name)
        how = "created"
    return [str(python), "main.py"], f"venv/ ({how})"


def exec_program(folder: Path, name: str) -> tuple[list[str], str]:
    """`./model`: compiled from main.cpp, or built by build.sh, or prebuilt."""
    model = folder / "model"
    if (folder / "main.cpp").is_file():
        src = folder / "main.cpp"
        if not model.exists() or model.stat().st_mtime < src.stat().st_mtime:
            cxx = os.environ.get("CXX", "c++")
            _run_logged([cxx, "-O2", "-std=c++17", "main.cpp", "-o", "model"], folder,
                        f"compiling {folder.name}/main.cpp", name)
        how = "compiled from main.cpp"
    elif (folder / "build.sh").is_file():
        if not os.access(folder / "build.sh", os.X_OK):
            raise ModelLoadError(f"model '{name}': {folder.name}/build.sh is not executable", model=name)
        _run_logged(["./build.sh"], folder, f"running {folder.name}/build.sh", name)
        how = "built by build.sh"
    else:
        how = "prebuilt"
    if not model.is_file() or not os.access(model, os.X_OK):
        raise ModelLoadError(f"model '{name}': {folder.name}/model is missing or not executable ({how})",
                             model=name)
    return [str(model.resolve())], f"model ({how})"


# ------------------------------------------------------------------ one forward = one process


_QUIET_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "HF_TOKEN", "LISTEN_FDS", "LISTEN_PID")


def _little(arr: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))


def check_output(what: str, dtype_name: str, shape: tuple[int, ...], expect: TensorInfo, batch: int | None) -> None:
    """An answer's tensor against the declared output (its batch dimension: the forward's batch)."""
    if dtype_name not in DTYPES.values():
        raise InferenceError(f"{what} dtype '{dtype_name}' is not one of {', '.join(DTYPES.values())}")
    if dtype_name != expect.dtype:
        raise InferenceError(f"{what} dtype {dtype_name} disagrees with the declared output '{expect.name}' "
                             f"({expect.dtype})")
    want = list(expect.shape)
    if batch is not None and want and want[0] == "batch":
        want[0] = batch
    if len(shape) != len(want) or any(isinstance(w, int) and w != s for w, s in zip(want, shape, strict=True)) \
            or any(s < 0 for s in shape):
        shown = [w if isinstance(w, int) else -1 for w in want]
        raise InferenceError(f"{what} shape {list(shape)} disagrees with the declared output '{expect.name}' "
                             f"{shown}")


def read_frame(path: Path, expect: TensorInfo, batch: int | None) -> np.ndarray:
    """NEREID_OUTPUT_PATH's frame, checked against the declared output (and the batch it was asked for)."""
    try:
        with open(path, "rb") as f:
            header = f.readline(FRAME_HEADER_MAX)
            body = f.read()
    except FileNotFoundError:
        raise InferenceError("exited 0 without writing its output frame (NEREID_OUTPUT_PATH)") from None
    if not header.endswith(b"\n"):
        raise InferenceError("malformed output frame: no header line \"<dtype> d0,d1,...\"")
    try:
        dtype_name, _, dims_text = header.decode("utf-8").strip().partition(" ")
        shape = tuple(int(d) for d in dims_text.split(",") if d.strip()) if dims_text.strip() else ()
    except (UnicodeDecodeError, ValueError):
        raise InferenceError(f"malformed output frame header {header[:80]!r}") from None
    check_output("output frame", dtype_name, shape, expect, batch)
    dt = np.dtype(dtype_name).newbyteorder("<")
    need = math.prod(shape) * dt.itemsize
    if len(body) != need:
        raise InferenceError(f"output frame holds {len(body)} bytes; {dtype_name} {list(shape)} needs {need}")
    return np.frombuffer(body, dtype=dt).astype(dtype_name, copy=False).reshape(shape)


class _ScriptSession:
    """What a script model's sessions answer of the `Session` protocol besides `run`: the declared tensors."""

    contract: Contract

    def get_inputs(self) -> list[Any]:
        return list(self.contract.inputs)

    def get_outputs(self) -> list[Any]:
        return list(self.contract.outputs)

    def get_providers(self) -> list[str]:
        return ["CPUExecutionProvider"]


def _model_env() -> dict[str, str]:
    """The environment a model's process gets: the server's, less systemd's sockets and the Hub token."""
    return {k: v for k, v in os.environ.items() if k not in _QUIET_ENV}


class ProcessSession(_ScriptSession):
    """A `Session` whose every forward runs the model's program once (nereid's per-request contract). Safe to
    call from several threads at once: each call is its own process."""

    def __init__(self, name: str, folder: Path, argv: list[str], contract: Contract, timeout_s: float,
                 backend: str) -> None:
        if len(contract.inputs) > 1 or len(contract.outputs) != 1:
            raise ModelLoadError(f"model '{name}': the per-request contract carries one input and one output "
                                 f"tensor; {contract.file} declares {len(contract.inputs)} and "
                                 f"{len(contract.outputs)}", model=name)
        self.name, self.folder, self.argv, self.contract = name, folder, argv, contract
        self.timeout_s, self.backend = timeout_s, backend
        self.env = _model_env()
        self._lock = threading.Lock()
        self.running: set[int] = set()       # pids of children now running (tests: no process left behind)

    def run(self, output_names: list[str] | None, input_feed: dict[str, Any]) -> list[Any]:
        out_info = self.contract.outputs[0]
        env = dict(self.env)
        data = b""
        batch = None
        if self.contract.inputs:
            x = np.asarray(input_feed[self.contract.inputs[0].name])
            batch = int(x.shape[0]) if self.contract.max_batch_size > 0 and x.ndim else None
            env["NEREID_INPUT_SHAPE"] = ",".join(str(d) for d in x.shape)
            env["NEREID_INPUT_DTYPE"] = str(x.dtype)
            data = _little(x).tobytes()
        with tempfile.TemporaryDirectory(prefix="rsinfer-script-") as tmp:
            out_path = Path(tmp) / "output"
            env["NEREID_OUTPUT_PATH"] = str(out_path)
            self._exec(env, data)
            arr = read_frame(out_path, out_info, batch)
        names = output_names or [out_info.name]
        return [arr for _ in names]

    def _exec(self, env: dict[str, str], data: bytes) -> None:
        try:
            proc = subprocess.Popen(self.argv, cwd=self.folder, env=env, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            raise InferenceError(f"cannot start {Path(self.argv[-1]).name}: {exc.strerror}") from None
        with self._lock:
            self.running.add(proc.pid)
        try:
            try:
                out, err = proc.communicate(data, timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                proc.communicate()
                raise InferenceError(f"did not finish within {self.timeout_s * 1000:.0f} ms; killed") from None
            except BaseException:
                _kill_group(proc)
                proc.communicate()
                raise
        finally:
            with self._lock:
                self.running.discard(proc.pid)
        for line in (out + err).decode("utf-8", "replace").splitlines():
            log.debug("model %s: %s", self.name, line)    # the model's own output: never to clients
        if proc.returncode < 0:
            try:
                sig = signal.Signals(-proc.returncode).name
            except ValueError:
                sig = str(-proc.returncode)
            raise InferenceError(f"was killed by signal {sig}")
        if proc.returncode != 0:
            raise InferenceError(f"exited with status {proc.returncode}")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


# ------------------------------------------------------------------ long-lived: infer() in a process of its own


RUNNER = Path(__file__).with_name("script_runner.py")
START_S = 120.0


def long_lived(folder: Path) -> bool:
    """main.py defines `infer` at its top level: the long-lived mode (else nereid's per-request contract)."""
    import ast

    try:
        tree = ast.parse((folder / "main.py").read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return False   # the per-request mode runs it as it is, and says what fails
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "infer" for n in tree.body)


def _header(header: dict[str, Any]) -> bytes:
    """A frame's length-prefixed JSON header (its buffers follow it on the pipe, written as they are)."""
    import json

    raw = json.dumps(header).encode()
    return len(raw).to_bytes(4, "little") + raw


class WorkerSession(_ScriptSession):
    """A `Session` over one long-lived process of the model's venv running `script_runner.py`: main.py imported
    once, `infer(inputs) -> outputs` per forward, numpy buffers as raw frames (no pickle). One forward at a time
    (each lane has its own). A process that dies or overruns the deadline is killed; that forward fails and the
    next one starts a new process."""

    def __init__(self, name: str, folder: Path, python: str, contract: Contract, timeout_s: float) -> None:
        import json

        self.name, self.folder, self.python, self.contract, self.timeout_s = name, folder, python, contract, timeout_s
        self.env = _model_env()
        self.env["RSINFER_MODEL_CONFIG"] = json.dumps({"name": name, "max_batch_size": contract.max_batch_size})
        self._lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        try:
            self._start(START_S)
        except InferenceError as exc:
            raise ModelLoadError(f"model '{name}': {exc}", model=name) from None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def _start(self, timeout_s: float) -> None:
        import weakref

        proc = subprocess.Popen([self.python, str(RUNNER), str(self.folder)], cwd=self.folder, env=self.env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        self.starts += 1
        threading.Thread(target=self._log, args=(proc,), daemon=True, name=f"script-{self.name}").start()
        weakref.finalize(self, _stop, proc)
        self.proc = proc
        header, _ = self._read(timeout_s)
        if header.get("ready") is not True:
            self._kill()
            raise InferenceError(str(header.get("error", "its process did not start")))

    def _log(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        with proc.stderr:
            for line in proc.stderr:      # the model's own output: the log, never clients
                log.debug("model %s: %s", self.name, line.decode("utf-8", "replace").rstrip())

    def _kill(self) -> None:
        if self.proc is not None:
            _kill_group(self.proc)
            self.proc.wait()
            _close_pipes(self.proc)
            self.proc = None

    def _died(self) -> InferenceError:
        assert self.proc is not None
        try:
            code = self.proc.wait(5)
        except subprocess.TimeoutExpired:
            code = None
        self._kill()
        if code is not None and code < 0:
            try:
                how = f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with status {code}"
        return InferenceError(f"its process {how}; the next request starts a new one")

    def _read_exact(self, n: int, deadline: float) -> bytes:
        import select
        import time

        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        buf = bytearray()
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self._kill()
                raise InferenceError(f"did not answer within {self.timeout_s * 1000:.0f} ms; its process was killed "
                                     "and the next request starts a new one")
            chunk = os.read(fd, n - len(buf))
            if not chunk:
                raise self._died()
            buf += chunk
        return bytes(buf)

    def _read(self, timeout_s: float) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        import json
        import time

        deadline = time.monotonic() + timeout_s
        size = int.from_bytes(self._read_exact(4, deadline), "little")
        header = json.loads(self._read_exact(size, deadline))
        arrays = {}
        for t in header.get("tensors", ()):
            raw = self._read_exact(int(t["nbytes"]), deadline) if t["nbytes"] else b""
            dt = np.dtype(t["dtype"]).newbyteorder("<")
            arrays[t["name"]] = np.frombuffer(raw, dtype=dt).astype(t["dtype"], copy=False).reshape(t["shape"])
        return header, arrays

    def run(self, output_names: list[str] | None, input_feed: dict[str, Any]) -> list[Any]:
        tensors: list[dict[str, Any]] = []
        buffers: list[np.ndarray] = []
        batch = None
        for info in self.contract.inputs:
            x = _little(np.asarray(input_feed[info.name]))
            if self.contract.max_batch_size > 0 and x.ndim:
                batch = int(x.shape[0])
            tensors.append({"name": info.name, "dtype": x.dtype.newbyteorder("=").name, "shape": list(x.shape),
                            "nbytes": x.nbytes})
            buffers.append(x)
        with self._lock:
            if self.proc is None or self.proc.poll() is not None:
                if self.proc is not None:
                    log.warning("model %s: its process ended; starting a new one", self.name)
                self._kill()
                self._start(START_S)
            assert self.proc is not None and self.proc.stdin is not None
            try:
                self.proc.stdin.write(_header({"tensors": tensors}))
                for arr in buffers:      # the array's own memory, no copy (little-endian and contiguous already)
                    if arr.nbytes:
                        self.proc.stdin.write(arr.data.cast("B"))
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError):
                raise self._died() from None
            header, arrays = self._read(self.timeout_s)
        if "error" in header:
            raise InferenceError(f"infer() raised {header['error']}")
        out = []
        for name in output_names or [o.name for o in self.contract.outputs]:
            info = next(o for o in self.contract.outputs if o.name == name)
            if name not in arrays:
                raise InferenceError(f"infer() returned no output '{name}' (it returned {', '.join(arrays) or 'none'})")
            arr = arrays[name]
            check_output(f"output '{name}'", arr.dtype.name, tuple(arr.shape), info, batch)
            out.append(arr)
        return out


def _close_pipes(proc: subprocess.Popen[bytes]) -> None:
    for pipe in (proc.stdin, proc.stdout):    # stderr: its reader thread closes it at EOF
        if pipe is not None:
            try:
                pipe.close()
            except OSError:
                pass


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Close its stdin (it calls finalize() and exits); kill it if it does not within 5 s."""
    try:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(5)
    except (OSError, subprocess.TimeoutExpired):
        _kill_group(proc)
        proc.wait()
    _close_pipes(proc)
