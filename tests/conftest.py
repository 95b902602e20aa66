from __future__ import annotations

import os
from pathlib import Path

import pytest

from fakehub import FakeHub

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """No test reads the user's HF cache or token, or reaches the real Hub."""
    home = tmp_path_factory.mktemp("hf_home")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: refused, never the network
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.delenv("RSINFER_CONFIG", raising=False)


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch):
    hub = FakeHub().start()
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    try:
        yield hub
    finally:
        hub.stop()


def shared_models_dir() -> Path:
    return Path(os.environ.get("RSINFER_SHARED_MODELS") or ROOT.parent / "shared" / "models")


@pytest.fixture(scope="session")
def shared_models() -> Path:
    """The reference models; skipped when absent, a failure when RSINFER_REQUIRE_SHARED=1 (CI)."""
    root = shared_models_dir()
    if not (root / "all-minilm-l6-v2").is_dir():
        msg = f"reference models not found at {root} (set RSINFER_SHARED_MODELS)"
        if os.environ.get("RSINFER_REQUIRE_SHARED") == "1":
            pytest.fail(msg + " and RSINFER_REQUIRE_SHARED=1", pytrace=False)
        pytest.skip(msg)
    return root


@pytest.fixture
def redis_server(tmp_path):
    """A real redis-server (Debian's package); skipped when absent, a failure when RSINFER_REQUIRE_REDIS=1 (CI)."""
    from serverutil import RedisServer

    srv = RedisServer(tmp_path)
    if srv.binary is None:
        msg = "redis-server is not installed (apt-get install redis-server)"
        if os.environ.get("RSINFER_REQUIRE_REDIS") == "1":
            pytest.fail(msg + " and RSINFER_REQUIRE_REDIS=1", pytrace=False)
        pytest.skip(msg)
    srv.start()
    try:
        yield srv
    finally:
        srv.kill()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test that asks for `serve_mode` (itself or through a fixture) in a module with
    `SERVE_MODES = ("single", "workers")` runs once per way the daemon serves: module-scoped, so a module's shared
    server is started once per mode. The test passes it on: `ServerThread(cfg, mode=serve_mode)`."""
    modes = getattr(metafunc.module, "SERVE_MODES", None)
    if modes and "serve_mode" in metafunc.fixturenames:
        metafunc.parametrize("serve_mode", modes, indirect=True, scope="module")


@pytest.fixture(scope="module")
def serve_mode(request: pytest.FixtureRequest) -> str:
    """single: the daemon in one process; workers: its front end and engine split, talking over a Unix socket."""
    return str(getattr(request, "param", "single"))


@pytest.fixture(autouse=True)
def _single_process_only(request: pytest.FixtureRequest) -> None:
    marker = request.node.get_closest_marker("single_process")
    callspec = getattr(request.node, "callspec", None)
    mode = callspec.params.get("serve_mode") if callspec is not None else None
    if mode == "workers" and marker is not None:
        pytest.skip(f"one-process server only: {marker.args[0]}")
