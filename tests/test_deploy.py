"""Running it for real: sd_notify from a real `serve`, the systemd unit (systemd-analyze verify), MemoryDenyWriteExecute
under ORT, the Dockerfile (hadolint), and the Kubernetes manifests (kubernetes-validate, offline; KServe's CRDs
checked for the fields KServe requires)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from conftest import ROOT
from serverutil import ServeProcess, free_port

UNIT = ROOT / "packaging" / "systemd" / "rsinfer.service"
K8S = ROOT / "deploy" / "kubernetes"


def need(binary: str, env: str) -> str:
    """The binary's path; a skip when it is absent, a failure when CI requires it (`env`=1)."""
    path = shutil.which(binary) or shutil.which(binary, path=str(Path(sys.executable).parent))  # or in the venv
    if path is None:
        if os.environ.get(env) == "1":
            pytest.fail(f"{binary} is not installed and {env}=1", pytrace=False)
        pytest.skip(f"{binary} is not installed")
    return path


# ---------------------------------------------------------------- sd_notify


@pytest.mark.shared
@pytest.mark.slow
def test_sd_notify_ready_watchdog_stopping(shared_models, tmp_path):
    sock_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.settimeout(0.05)
    port = free_port()
    cfg = tmp_path / "c.yaml"
    cfg.write_text("models:\n"
                   f"  - {{name: mini, kind: embedding, path: '{shared_models / 'all-minilm-l6-v2'}', replicas: 1}}\n")
    srv = ServeProcess(cfg, port, {"NOTIFY_SOCKET": str(sock_path), "WATCHDOG_USEC": "400000"})
    got: list[tuple[float, str, int]] = []   # (time, message, /health status when it arrived)

    def drain(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                msg = sock.recv(4096).decode()
            except TimeoutError:
                continue
            try:
                status = httpx.get(srv.url + "/health", timeout=1).status_code
            except httpx.HTTPError:
                status = 0
            got.append((time.monotonic(), msg, status))

    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not any("READY=1" in m for _, m, _ in got):
            drain(0.5)
        ready = [g for g in got if "READY=1" in g[1]]
        assert ready, got
        assert ready[0][2] == 200  # READY=1 only once /health answers
        before = [m for _, m, _ in got[:got.index(ready[0])]]
        assert any(m.startswith("STATUS=loading") for m in before)  # loading progress first
        assert all("WATCHDOG=1" not in m for m in before)
        drain(2.0)
        pings = [t for t, m, _ in got if m == "WATCHDOG=1"]
        assert 6 <= len(pings) <= 14, len(pings)  # every 0.2 s (half of 0.4 s) for 2 s
        srv.proc.send_signal(signal.SIGTERM)
        drain(3)
        assert any(m.startswith("STOPPING=1") for _, m, _ in got)
        assert srv.proc.wait(30) == 0
    finally:
        srv.stop()
        sock.close()


def test_no_notify_socket_means_no_messages(monkeypatch):
    from rsinfer_cli.server.systemd import Notifier

    n = Notifier({})
    assert not n.enabled and n.watchdog_s is None
    n.ready("x")  # nothing to send to, nothing raised
    other = Notifier({"NOTIFY_SOCKET": "@abstract-name", "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"})
    assert other.address == "\0abstract-name" and other.watchdog_s is None  # the watchdog is another process's
    other.close()


# ---------------------------------------------------------------- systemd unit


def test_unit_verifies(tmp_path):
    analyze = need("systemd-analyze", "RSINFER_REQUIRE_SYSTEMD")
    text = UNIT.read_text()
    # systemd-analyze checks that ExecStart's binary exists: point it at this checkout's rsinfer
    exec_start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    unit = tmp_path / "rsinfer.service"
    unit.write_text(text.replace(exec_start.split("=", 1)[1].split()[0], str(Path(sys.executable).parent / "rsinfer")))
    proc = subprocess.run([analyze, "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60)
    problems = [line for line in (proc.stdout + proc.stderr).splitlines() if "rsinfer.service" in line]
    assert proc.returncode == 0 and not problems, proc.stdout + proc.stderr
    for key in ("Type=notify", "DynamicUser=yes", "NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes",
                "PrivateTmp=yes", "RestrictAddressFamilies=", "SystemCallFilter=@system-service", "WatchdogSec=",
                "Restart=on-failure", "StateDirectory=", "CacheDirectory=", "MemoryDenyWriteExecute=yes"):
        assert key in text, key
    stop = int(next(x for x in text.splitlines() if x.startswith("TimeoutStopSec=")).split("=")[1].rstrip("s"))
    assert stop > 121  # above the drain: request_timeout_ms (120 s) + 1


@pytest.mark.shared
def test_ort_runs_with_memory_deny_write_execute(shared_models):
    """The unit sets MemoryDenyWriteExecute=yes: check that ORT, tokenizers and numpy need no W+X memory by running a
    forward in a process that the kernel holds to the same rule (prctl PR_SET_MDWE, Linux 6.3+)."""
    code = ("import ctypes, sys\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "if libc.prctl(65, 1, 0, 0, 0) != 0:\n"  # PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN
            "    print('MDWE unsupported'); sys.exit(77)\n"
            "from rsinfer_cli.config import ModelConfig\n"
            "from rsinfer_cli.engine.model import load_model\n"
            "from rsinfer_cli.pipelines import build_pipeline\n"
            f"pipe = build_pipeline(load_model(ModelConfig(name='m', kind='embedding', "
            f"path={str(shared_models / 'all-minilm-l6-v2')!r}, replicas=1)))\n"
            "print(pipe.embed(['hello world']).vectors.shape)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if proc.returncode == 77:
        pytest.skip("this kernel has no PR_SET_MDWE")
    assert proc.returncode == 0 and "(1, 384)" in proc.stdout, proc.stderr


# ---------------------------------------------------------------- container


def test_dockerfile_lints_clean():
    hadolint = need("hadolint", "RSINFER_REQUIRE_HADOLINT")
    text = (ROOT / "Dockerfile").read_text()
    proc = subprocess.run([hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert text.count("FROM ") >= 2 and "USER " in text and "EXPOSE 8080" in text and "STOPSIGNAL SIGTERM" in text
    assert (ROOT / ".dockerignore").is_file() and ".venv" in (ROOT / ".dockerignore").read_text()


# ---------------------------------------------------------------- Kubernetes


def documents() -> list[tuple[Path, dict]]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        out += [(path, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return out


def test_manifests_validate_against_the_kubernetes_schemas():
    import kubernetes_validate

    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", "kserve.yaml"}
    kinds = set()
    for path, doc in documents():
        if path.name == "kustomization.yaml" or doc["apiVersion"].startswith("serving.kserve.io"):
            continue
        kubernetes_validate.validate(doc, "1.30", strict=True)  # raises on any schema error
        kinds.add(doc["kind"])
    assert kinds >= {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget", "HorizontalPodAutoscaler"}
    deploy = next(d for _, d in documents() if d.get("kind") == "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["readinessProbe"]["httpGet"]["path"] == "/health" and "livenessProbe" in c and c["resources"]
    from rsinfer_cli.config import parse_config
    from rsinfer_cli.server.run import drain_seconds

    cm = next(d for _, d in documents() if d.get("kind") == "ConfigMap")
    served = parse_config(yaml.safe_load(cm["data"]["config.yaml"]))
    assert served.server.shutdown_delay_ms > 0                       # readiness fails before the listener closes
    assert pod["terminationGracePeriodSeconds"] > drain_seconds(served)
    assert pod["securityContext"]["runAsNonRoot"] is True and c["securityContext"]["readOnlyRootFilesystem"] is True
    assert any("emptyDir" in v for v in pod["volumes"])


def test_kserve_examples_have_what_kserve_requires():
    docs = {d["kind"]: d for p, d in documents() if p.name == "kserve.yaml"}
    runtime, isvc = docs["ServingRuntime"], docs["InferenceService"]
    assert runtime["apiVersion"] == "serving.kserve.io/v1alpha1"
    spec = runtime["spec"]
    assert spec["supportedModelFormats"] and all("name" in f for f in spec["supportedModelFormats"])
    assert spec["containers"] and all("name" in c and "image" in c for c in spec["containers"])
    assert spec.get("protocolVersions") == ["v2", "grpc-v2"]
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1"
    model = isvc["spec"]["predictor"]["model"]
    assert model["modelFormat"]["name"] in {f["name"] for f in spec["supportedModelFormats"]}
    assert model["runtime"] == runtime["metadata"]["name"] and model["protocolVersion"] == "v2"
    assert "storageUri" in model
