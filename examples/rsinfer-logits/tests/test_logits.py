"""The example plug-in, found as an installed distribution is (a dist-info with its entry point on the path): its
kind in a config, its CLI command in `rsinfer --help`, its route and schemas on a served daemon; and a broken
plug-in named in the config error of its kind."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RSINFER_SHARED_MODELS", HERE.parents[2] / "shared" / "models"))


def install(site: Path, name: str, entry: str) -> None:
    """What pip leaves for an installed distribution, as far as entry points go."""
    info = site / f"{name.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[rsinfer.families]\n{entry}\n")


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    site = tmp_path / "site"
    install(site, "rsinfer-logits", "logits = rsinfer_logits:FAMILY")
    install(site, "rsinfer-broken", "broken = rsinfer_no_such_module:FAMILY")
    paths = [str(site), str(HERE / "src"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p),
            "XDG_CACHE_HOME": str(tmp_path / "cache")}


def rsinfer(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rsinfer_cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def shared(name: str) -> Path:
    path = SHARED / name
    if not path.exists():
        if os.environ.get("RSINFER_REQUIRE_SHARED") == "1":
            pytest.fail(f"{path} is missing and RSINFER_REQUIRE_SHARED=1")
        pytest.skip(f"{path} is missing (set RSINFER_SHARED_MODELS)")
    return path


def test_the_command_is_listed_and_runs(env):
    folder = shared("tiny-textcls")
    help_ = rsinfer(env, "--help")
    assert help_.returncode == 0 and "logits" in help_.stdout
    help_again = rsinfer(env, "--help")          # the second start reads the entry points from the cache
    assert help_again.stdout == help_.stdout
    assert list((Path(env["XDG_CACHE_HOME"]) / "rsinfer").glob("plugins-*.json"))
    out = rsinfer(env, "logits", "--path", str(folder), "It is a chair.")
    assert out.returncode == 0, out.stderr
    ref = json.loads((folder / "reference.json").read_text())
    want = {x["label"]: x["score"] for x in ref["cases"][2]["raw_logits"]}
    got = json.loads(out.stdout)["logits"]
    assert got == pytest.approx([want["negative"], want["neutral"], want["positive"]], abs=2e-5)


def test_a_broken_plugin_is_named_by_the_config_error(env, tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("models:\n  - {name: b, kind: broken, path: x}\n")
    out = rsinfer(env, "serve", "--config", str(cfg))
    assert out.returncode != 0
    assert "models[0].kind: plug-in 'broken' (rsinfer.families: rsinfer_no_such_module:FAMILY) failed to load: " \
           "ModuleNotFoundError" in out.stderr


def test_served_with_its_options_route_and_schemas(env, tmp_path):
    import httpx

    folder = shared("tiny-textcls")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"server: {{bind: '127.0.0.1:{port}'}}\n"
                   f"models:\n  - {{name: lg, kind: logits, path: '{folder}', temperature: 2.0}}\n")
    bad = tmp_path / "typo.yaml"
    bad.write_text(f"models:\n  - {{name: lg, kind: logits, path: '{folder}', temperature: 0}}\n")
    refused = rsinfer(env, "serve", "--config", str(bad))
    assert refused.returncode != 0 and "models[0].temperature: must be > 0" in refused.stderr
    proc = subprocess.Popen([sys.executable, "-m", "rsinfer_cli", "serve", "--config", str(cfg)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):                      # at most 60 s to be ready
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.2)
        r = httpx.post(url + "/logits", json={"input": ["It is a chair."]}, timeout=30)
        assert r.status_code == 200, r.text
        ref = json.loads((folder / "reference.json").read_text())
        want = [x["score"] / 2.0 for x in sorted(ref["cases"][2]["raw_logits"],
                                                  key=lambda x: ["negative", "neutral", "positive"].index(x["label"]))]
        assert r.json()["data"][0] == pytest.approx(want, abs=2e-5)
        doc = httpx.get(url + "/openapi.json", timeout=30).json()
        assert doc["paths"]["/logits"]["post"]["tags"] == ["logits"] and "LogitsRequest" in doc["components"]["schemas"]
        assert httpx.post(url + "/logits", json={"input": []}, timeout=30).status_code == 400
    finally:
        proc.terminate()
        proc.wait(30)
        if proc.stderr is not None:
            proc.stderr.close()
