"""grpc.health.v1 beside KServe v2 gRPC: SERVING while ready (also with an API key configured: health needs none),
NOT_SERVING while the server is not ready and from the start of the drain; Watch streams the status."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rsinfer_cli.config import parse_config

import synth
from serverutil import ServerThread

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def add_one(tmp: Path) -> Path:
    return synth.add_graph(tmp / "add" / "model.onnx").parent


@pytest.fixture
def server(tmp_path):
    cfg = parse_config({"server": {"api_keys": ["secret"]}, "models": [
        {"name": "add", "kind": "tensor", "path": str(add_one(tmp_path))}]})
    with ServerThread(cfg, grpc=True) as srv:
        yield srv


def check(url: str, service: str = "") -> int:
    with grpc.insecure_channel(url) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def test_serving_without_a_key_while_kserve_needs_one(server):
    assert check(server.grpc_url) == SERVING
    assert check(server.grpc_url, "inference.GRPCInferenceService") == SERVING
    with grpc.insecure_channel(server.grpc_url) as ch:
        with pytest.raises(grpc.RpcError) as err:
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        import tritonclient.grpc as tg

        with pytest.raises(Exception, match="API key"):   # KServe's own calls still need the key
            tg.InferenceServerClient(server.grpc_url).get_model_metadata("add")


def test_watch_streams_the_status(server):
    with grpc.insecure_channel(server.grpc_url) as ch:
        stream = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert next(stream).status == SERVING
        stream.cancel()


def test_not_serving_while_unready_and_from_the_drain(server):
    server.state.unready = lambda: "engine is down"
    assert check(server.grpc_url) == NOT_SERVING
    server.state.unready = None
    assert check(server.grpc_url) == SERVING
    front = server._grpc
    server._loop.call_soon_threadsafe(lambda: server._loop.create_task(front.health.enter_graceful_shutdown()))
    for _ in range(100):
        if check(server.grpc_url) == NOT_SERVING:
            break
    assert check(server.grpc_url) == NOT_SERVING


@pytest.mark.parametrize("workers", [1, 2])
def test_a_drain_is_unready_at_once_and_still_serves_during_the_delay(tmp_path, workers):
    """SIGTERM with server.shutdown_delay_ms: /health, KServe ready and gRPC health fail at once while requests are
    still answered; then the listener closes and the process exits 0."""
    import signal
    import time

    import httpx
    import yaml

    from serverutil import ServeProcess, free_port

    grpc_port = free_port()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"server": {"grpc_bind": f"127.0.0.1:{grpc_port}", "shutdown_delay_ms": 3000},
                                   "models": [{"name": "add", "kind": "tensor", "path": str(add_one(tmp_path))}]}))
    srv = ServeProcess(cfg, free_port(), args=["--workers", str(workers)])
    try:
        srv.wait_ready(120)
        body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            assert c.get("/health").json()["models_loaded"] == 1
            srv.proc.send_signal(signal.SIGTERM)
            for _ in range(200):
                if c.get("/health").status_code == 503:
                    break
                time.sleep(0.01)
            health = c.get("/health")
            assert health.status_code == 503 and health.json()["reason"].startswith("draining")
            assert c.get("/v2/health/ready").status_code == 503
            assert check(f"127.0.0.1:{grpc_port}") == NOT_SERVING
            r = c.post("/v2/models/add/infer", json=body)            # still served during the delay
            assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2.0, 3.0]
            assert c.get("/health").status_code == 503 and srv.proc.poll() is None   # answered while draining
    finally:
        assert srv.stop(60) == 0


def test_grpc_listens_wherever_http_does_with_host(tmp_path):
    """`--host` moves gRPC with HTTP (a container's `--host 0.0.0.0` must expose both); loopback 127.0.0.2 here."""
    import httpx
    import yaml

    from serverutil import ServeProcess, free_port

    grpc_port, port = free_port(), free_port()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"server": {"grpc_bind": f"127.0.0.1:{grpc_port}"},
                                   "models": [{"name": "add", "kind": "tensor", "path": str(add_one(tmp_path))}]}))
    srv = ServeProcess(cfg, port, args=["--host", "127.0.0.2"])
    try:
        srv.wait_ready(120)
        assert httpx.get(f"http://127.0.0.2:{port}/health", timeout=10).status_code == 200
        assert check(f"127.0.0.2:{grpc_port}") == health_pb2.HealthCheckResponse.SERVING
        assert any(f"gRPC on 127.0.0.2:{grpc_port}" in line for line in srv.lines)
    finally:
        assert srv.stop() == 0
