"""The `python` backend: `main.py` + `requirements.txt`, run in the folder's own virtualenv `venv/` (reused when it
exists, else created and `requirements.txt` installed into it at start-up). A main.py that defines `infer` at its top
level is long-lived: imported once in one process per lane (`script_runner.py`), numpy buffers as raw frames;
otherwise nereid's per-request contract (process.py), one process per forward."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import InferenceError, ModelLoadError
from ..session import Session
from .contract import Contract
from .process import ProcessBackend, ScriptSession, check_output, kill_group, little_endian, model_env, run_logged

log = logging.getLogger("rsinfer.engine")


class PythonBackend(ProcessBackend):
    name = "python"
    main_file = "main.py"

    def program(self, folder: Path, name: str) -> tuple[list[str], str]:
        return python_program(folder, name)

    def sessions(self, name: str, folder: Path, argv: list[str], contract: Contract, timeout_s: float,
                 lanes: int) -> tuple[list[Session], str]:
        if long_lived(folder):          # infer() imported once in one process per lane
            workers: list[Session] = [WorkerSession(name, folder, argv[0], contract, timeout_s)
                                      for _ in range(lanes)]
            return workers, f", long-lived: infer() in {lanes} process{'es' if lanes > 1 else ''}"
        return super().sessions(name, folder, argv, contract, timeout_s, lanes)


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
        run_logged([sys.executable, "-m", "venv", str(venv)], folder, f"creating {folder.name}/venv", name)
        run_logged([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-r", "requirements.txt"],
                    folder, f"installing {folder.name}/requirements.txt into its venv", name)
        how = "created"
    return [str(python), "main.py"], f"venv/ ({how})"


# ------------------------------------------------------------------ long-lived: infer() in a process of its own


RUNNER = Path(__file__).parents[1] / "script_runner.py"
START_S = 120.0
# CPython 3.11 counts the AST constructor's recursion depth in interpreter-wide state: two threads parsing at once
# (script models loaded in parallel at start-up) can fail with "SystemError: AST constructor recursion depth
# mismatch" (python/cpython#106905; seen in this project's CI)
_PARSE = threading.Lock()


def long_lived(folder: Path) -> bool:
    """main.py defines `infer` at its top level: the long-lived mode (else nereid's per-request contract)."""
    import ast

    try:
        source = (folder / "main.py").read_text(encoding="utf-8")
        with _PARSE:
            tree = ast.parse(source)
    except (OSError, SyntaxError, ValueError):
        return False   # the per-request mode runs it as it is, and says what fails
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "infer" for n in tree.body)


def _header(header: dict[str, Any]) -> bytes:
    """A frame's length-prefixed JSON header (its buffers follow it on the pipe, written as they are)."""
    import json

    raw = json.dumps(header).encode()
    return len(raw).to_bytes(4, "little") + raw


class WorkerSession(ScriptSession):
    """A `Session` over one long-lived process of the model's venv running `script_runner.py`: main.py imported
    once, `infer(inputs) -> outputs` per forward, numpy buffers as raw frames (no pickle). One forward at a time
    (each lane has its own). A process that dies or overruns the deadline is killed; that forward fails and the
    next one starts a new process."""

    def __init__(self, name: str, folder: Path, python: str, contract: Contract, timeout_s: float) -> None:
        import json

        self.name, self.folder, self.python, self.contract, self.timeout_s = name, folder, python, contract, timeout_s
        self.env = model_env()
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
            kill_group(self.proc)
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
            x = little_endian(np.asarray(input_feed[info.name]))
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
        kill_group(proc)
        proc.wait()
    _close_pipes(proc)
