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
