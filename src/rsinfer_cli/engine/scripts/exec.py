"""The `exec` backend (nereid's `cpp`): `main.cpp`, compiled at start-up with `c++ -O2 -std=c++17`, or an executable
`build.sh` that builds `model`, or a prebuilt executable `model`; each forward one process (process.py)."""

from __future__ import annotations

import os
from pathlib import Path

from ...errors import ModelLoadError
from .process import ProcessBackend, run_logged


class ExecBackend(ProcessBackend):
    name = "exec"
    main_file = "model"

    def program(self, folder: Path, name: str) -> tuple[list[str], str]:
        return exec_program(folder, name)


def exec_program(folder: Path, name: str) -> tuple[list[str], str]:
    """`./model`: compiled from main.cpp, or built by build.sh, or prebuilt."""
    model = folder / "model"
    if (folder / "main.cpp").is_file():
        src = folder / "main.cpp"
        if not model.exists() or model.stat().st_mtime < src.stat().st_mtime:
            cxx = os.environ.get("CXX", "c++")
            run_logged([cxx, "-O2", "-std=c++17", "main.cpp", "-o", "model"], folder,
                        f"compiling {folder.name}/main.cpp", name)
        how = "compiled from main.cpp"
    elif (folder / "build.sh").is_file():
        if not os.access(folder / "build.sh", os.X_OK):
            raise ModelLoadError(f"model '{name}': {folder.name}/build.sh is not executable", model=name)
        run_logged(["./build.sh"], folder, f"running {folder.name}/build.sh", name)
        how = "built by build.sh"
    else:
        how = "prebuilt"
    if not model.is_file() or not os.access(model, os.X_OK):
        raise ModelLoadError(f"model '{name}': {folder.name}/model is missing or not executable ({how})",
                             model=name)
    return [str(model.resolve())], f"model ({how})"
