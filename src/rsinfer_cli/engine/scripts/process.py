"""What the script backends share: a build step run with its output logged, the environment a model's process gets,
and nereid's per-request contract - one process per forward. The input tensor's raw little-endian bytes go on stdin
with `NEREID_INPUT_SHAPE` (comma-separated, batch included) and `NEREID_INPUT_DTYPE` in the environment; the process
writes `NEREID_OUTPUT_PATH` as a header line `"<dtype> d0,d1,...\\n"` and the raw little-endian bytes. A crash, a
signal, a non-zero exit, a missing or malformed frame, a frame that disagrees with the declared output, or a run past
the deadline (the process group is killed) fails that forward, and nothing else. The child's stdout/stderr go to the
server log (debug), never to clients."""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import InferenceError, ModelLoadError
from ..session import Session, TensorInfo
from .contract import DTYPES, Contract

log = logging.getLogger("rsinfer.engine")

FRAME_HEADER_MAX = 4096


# ------------------------------------------------------------------ building the program


def run_logged(argv: list[str], cwd: Path, what: str, name: str, timeout_s: float = 900) -> None:
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


# ------------------------------------------------------------------ one forward = one process


_QUIET_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "HF_TOKEN", "LISTEN_FDS", "LISTEN_PID")


def little_endian(arr: np.ndarray) -> np.ndarray:
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


class ScriptSession:
    """What a script model's sessions answer of the `Session` protocol besides `run`: the declared tensors."""

    contract: Contract

    def get_inputs(self) -> list[Any]:
        return list(self.contract.inputs)

    def get_outputs(self) -> list[Any]:
        return list(self.contract.outputs)

    def get_providers(self) -> list[str]:
        return ["CPUExecutionProvider"]


def model_env() -> dict[str, str]:
    """The environment a model's process gets: the server's, less systemd's sockets and the Hub token."""
    return {k: v for k, v in os.environ.items() if k not in _QUIET_ENV}


class ProcessSession(ScriptSession):
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
        self.env = model_env()
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
            data = little_endian(x).tobytes()
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
                kill_group(proc)
                proc.communicate()
                raise InferenceError(f"did not finish within {self.timeout_s * 1000:.0f} ms; killed") from None
            except BaseException:
                kill_group(proc)
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


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


class ProcessBackend:
    """A script backend whose lanes share one ProcessSession: nereid's per-request contract, one process per
    forward. A backend names itself and builds its program (`Backend` in scripts/__init__.py)."""

    name = ""
    main_file = ""

    def sessions(self, name: str, folder: Path, argv: list[str], contract: Contract, timeout_s: float,
                 lanes: int) -> tuple[list[Session], str]:
        return [ProcessSession(name, folder, argv, contract, timeout_s, self.name)] * lanes, ""
