"""Script models for `kind: tensor` (nereid's model folders): a model that is code, run out of process.

A folder is served by one of three backends, detected from its files or set with `backend:`:
- `onnx`: a `*.onnx` graph, in process (engine/model.py);
- `python`: `main.py` + `requirements.txt`, run in the folder's own virtualenv `venv/` (reused when it exists,
  else created and `requirements.txt` installed into it at start-up);
- `exec` (nereid's `cpp`): `main.cpp`, compiled at start-up with `c++ -O2 -std=c++17`, or an executable
  `build.sh` that builds `model`, or a prebuilt executable `model`.

Each script backend is a module of its own behind one `Backend` protocol (`python.py`, `exec.py`), over what they
share (`process.py`: nereid's one process per forward, the build steps) and the folder contract (`contract.py`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from ...config import ModelConfig
from ...errors import ModelLoadError
from ..session import Session
from .contract import CONTRACT_FILE, Contract, agree_with_graph, read_contract

__all__ = ["CONTRACT_FILE", "Backend", "Contract", "agree_with_graph", "backend", "detect", "read_contract",
           "script_backend"]

SCRIPT_BACKENDS = ("python", "exec")
ALIASES = {"cpp": "exec"}
_IGNORED = {"venv", "__pycache__", ".git"}


class Backend(Protocol):
    """How a script model's folder becomes a program and the sessions its lanes run forwards on."""

    name: str            # python | exec
    main_file: str       # the file that stands for the graph (what `inspect` and /v1/models name)

    def program(self, folder: Path, name: str) -> tuple[list[str], str]:
        """The command line that runs the model (built first: a venv, a compiler), and how it came to be."""
        ...

    def sessions(self, name: str, folder: Path, argv: list[str], contract: Contract, timeout_s: float,
                 lanes: int) -> tuple[list[Session], str]:
        """One session per lane (the same object for every lane when they share one), and a note on how they run."""
        ...


def backend(name: str) -> Backend:
    """The script backend of that name (`python` or `exec`)."""
    if name == "python":
        from .python import PythonBackend

        return PythonBackend()
    from .exec import ExecBackend

    return ExecBackend()


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
