"""server.tracing: a real `rsinfer serve` exports OpenTelemetry spans with the official SDK's OTLP/HTTP exporter to a
receiver on loopback that decodes the protobuf: a request's span continues the client's traceparent, and its
children (tokenize, queue, forward, postprocess) hang under it; off by default, the SDK is never imported."""

from __future__ import annotations

import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
import yaml

import synth
from serverutil import ServeProcess, free_port

pytest.importorskip("opentelemetry.sdk")

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


class Receiver:
    """An OTLP/HTTP receiver: POST /v1/traces, ExportTraceServiceRequest decoded with opentelemetry-proto."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        spans = self.spans = []
        paths = self.paths = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                paths.append((self.path, self.headers.get("Content-Type")))
                msg = ExportTraceServiceRequest()
                msg.ParseFromString(body)
                for rs in msg.resource_spans:
                    service = {a.key: a.value.string_value for a in rs.resource.attributes}["service.name"]
                    for ss in rs.scope_spans:
                        for s in ss.spans:
                            spans.append({"name": s.name, "trace": s.trace_id.hex(), "id": s.span_id.hex(),
                                          "parent": s.parent_span_id.hex(), "service": service,
                                          "start": s.start_time_unix_nano, "end": s.end_time_unix_nano,
                                          "attrs": {a.key: a.value for a in s.attributes}})
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("workers", [1, 2])
def test_spans_reach_an_otlp_receiver_as_a_tree(tmp_path, workers):
    receiver = Receiver()
    emb = synth.write_model_dir(tmp_path / "emb")
    add = synth.add_graph(tmp_path / "add" / "model.onnx").parent
    grpc_port = free_port()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"server": {"tracing": {"otlp_endpoint": receiver.url, "service_name": "rs-test"},
                                              "grpc_bind": f"127.0.0.1:{grpc_port}"},
                                   "models": [{"name": "emb", "kind": "embedding", "path": str(emb)},
                                              {"name": "add", "kind": "tensor", "path": str(add)}]}))
    srv = ServeProcess(cfg, free_port(), args=["--workers", str(workers)])
    try:
        srv.wait_ready(120)
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            r = c.post("/v1/embeddings", json={"input": ["a text", "another one"]},
                       headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "x-request-id": "traced-1"})
            assert r.status_code == 200
            assert c.post("/v1/embeddings", json={"input": "no parent"}).status_code == 200
        grpc_call(grpc_port)
    finally:
        assert srv.stop() == 0          # the batch processor flushes at shutdown
        receiver.close()
    assert receiver.paths and all(p == ("/v1/traces", "application/x-protobuf") for p in receiver.paths)
    spans = receiver.spans
    request = next(s for s in spans if s["trace"] == TRACE_ID and s["parent"] == PARENT_ID)
    assert request["name"] == "POST /v1/embeddings" and request["service"] == "rs-test"
    attrs = request["attrs"]
    assert attrs["http.response.status_code"].int_value == 200 and attrs["rsinfer.request_id"].string_value == \
        "traced-1" and attrs["rsinfer.model"].string_value == "emb" and attrs["rsinfer.rows"].int_value == 2
    children = {s["name"]: s for s in spans if s["parent"] == request["id"]}
    want = {"rsinfer.tokenize", "rsinfer.postprocess"} | ({"rsinfer.queue", "rsinfer.forward"} if workers == 1
                                                           else set())
    assert want <= set(children), children.keys()
    for child in children.values():
        assert child["trace"] == TRACE_ID and request["start"] <= child["start"] <= child["end"] <= request["end"]
    other = [s for s in spans if s["name"] == "POST /v1/embeddings" and s["trace"] != TRACE_ID]
    assert len(other) == 1 and other[0]["parent"] == ""        # a request without traceparent: a new trace
    call = next(s for s in spans if s["trace"] == GRPC_TRACE_ID and s["parent"] == PARENT_ID)   # gRPC: the same tree
    assert call["name"] == "gRPC ModelInfer" and call["parent"] == PARENT_ID
    assert call["attrs"]["rsinfer.model"].string_value == "add" and call["attrs"]["rsinfer.rows"].int_value == 1
    stages = {s["name"] for s in spans if s["parent"] == call["id"]}
    assert stages >= {"rsinfer.tokenize", "rsinfer.postprocess"} | ({"rsinfer.queue", "rsinfer.forward"}
                                                                     if workers == 1 else set()), stages


GRPC_TRACE_ID = "5bf92f3577b34da6a3ce929d0e0e4737"


def grpc_call(port: int) -> None:
    """One KServe ModelInfer with W3C trace context in its metadata."""
    import grpc

    from rsinfer_cli.server.kserve import kserve_pb2 as pb
    from rsinfer_cli.server.kserve import kserve_pb2_grpc as pb_grpc

    x = pb.ModelInferRequest.InferInputTensor(name="X", datatype="FP32", shape=[1, 2],
                                              contents=pb.InferTensorContents(fp32_contents=[1, 2]))
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = pb_grpc.GRPCInferenceServiceStub(ch)
        stub.ModelInfer(pb.ModelInferRequest(model_name="add", inputs=[x]), timeout=30,
                        metadata=(("traceparent", f"00-{GRPC_TRACE_ID}-{PARENT_ID}-01"),))


def test_off_by_default_imports_no_sdk(tmp_path):
    model = str(synth.write_model_dir(tmp_path / "e"))
    code = ("import sys\nfrom rsinfer_cli.config import parse_config\nfrom rsinfer_cli.engine.registry import "
            "Registry\nfrom rsinfer_cli.server.app import create_app\nfrom rsinfer_cli.runtime import Runtime\n"
            "from rsinfer_cli.server.metrics import Metrics\n"
            f"cfg = parse_config({{'models': [{{'name': 'e', 'kind': 'embedding', 'path': {model!r}}}]}})\n"
            "create_app(Runtime(cfg, Registry.load(cfg), Metrics()))\n"
            "assert not [m for m in sys.modules if m.startswith('opentelemetry')], 'imported'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
