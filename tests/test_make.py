"""The Makefile's set-up commands: `make serve` installs rsinfer once and then starts it with no package index
(a restart on an air-gapped host ran `pip install` every time, and failed there)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from conftest import ROOT


def _dry_run(venv, *targets: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}  # under make test
    proc = subprocess.run(["make", "--no-print-directory", "-n", f"VENV={venv}", *targets], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return [line for line in proc.stdout.splitlines() if line.strip()]


def test_make_serve_installs_only_when_rsinfer_is_missing_or_older_than_pyproject(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    fresh = _dry_run(venv, "serve")
    assert any("pip install" in line for line in fresh)               # not installed yet: install
    (venv / "bin" / "rsinfer").touch()
    later = (ROOT / "pyproject.toml").stat().st_mtime + 60
    os.utime(venv / "bin" / "rsinfer", (later, later))
    assert _dry_run(venv, "serve") == [f"{venv}/bin/rsinfer serve --config config.example.yaml"]
    old = (ROOT / "pyproject.toml").stat().st_mtime - 60
    os.utime(venv / "bin" / "rsinfer", (old, old))
    assert any("pip install" in line for line in _dry_run(venv, "serve"))   # pyproject.toml changed: again
