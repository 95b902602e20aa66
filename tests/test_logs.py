"""Request ids and log lines through a real `rsinfer serve` (one process and worker processes): the id taken from
`x-request-id` when valid, else new, echoed on every answer (errors too) and in the log lines of its request; JSON
lines parsed field by field; planted secrets (an API key, a text) never in any line; the access log switchable off;
gRPC's id through metadata."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import yaml

import synth
from serverutil import ServeProcess, free_port

KEY = "sk-planted-key-7f3a"
TEXT = "PLANTED-SECRET-TEXT-9d1c"


def config(tmp: Path, **server) -> Path:
    emb = synth.write_model_dir(tmp / "emb")
    add = synth.add_graph(tmp / "add" / "model.onnx").parent
    path = tmp / "c.yaml"
    path.write_text(yaml.safe_dump({"server": {"api_keys": [KEY], **server}, "models": [
        {"name": "emb", "kind": "embedding", "path": str(emb)},
        {"name": "add", "kind": "tensor", "path": str(add), "max_batch_size": 8}]}))
    return path


def json_lines(lines: list[str]) -> list[dict]:
    out = []
    for line in lines:
        if line.startswith("{"):
            out.append(json.loads(line))     # every JSON line parses
    return out


def exercise(url: str) -> dict[str, httpx.Response]:
    auth = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=url, timeout=30) as c:
        return {
            "kept": c.post("/v1/embeddings", headers={**auth, "x-request-id": "client-id-1"},
                           json={"model": "emb", "input": [TEXT, "second text"]}),
            "tensor": c.post("/v2/models/add/infer", headers={**auth, "x-request-id": "client-id-2"},
                             json={"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}),
            "replaced": c.post("/v1/embeddings", headers={**auth, "x-request-id": "has spaces"},
                               json={"model": "emb", "input": TEXT}),
            "too_long": c.get("/v1/models", headers={**auth, "x-request-id": "x" * 129}),
            "unauthorized": c.post("/v1/embeddings", headers={"x-request-id": "client-id-3"},
                                   json={"model": "emb", "input": TEXT}),
            "bad_request": c.post("/v1/embeddings", headers={**auth, "x-request-id": "client-id-4"},
                                  json={"model": "emb", "input": []}),
        }


def check_ids(got: dict[str, httpx.Response]) -> None:
    assert got["kept"].headers["x-request-id"] == "client-id-1"
    assert got["tensor"].headers["x-request-id"] == "client-id-2"
    for name in ("replaced", "too_long"):
        rid = got[name].headers["x-request-id"]
        assert len(rid) == 32 and rid.isalnum()                 # a new one
    assert got["unauthorized"].status_code == 401 and got["unauthorized"].headers["x-request-id"] == "client-id-3"
    assert got["bad_request"].status_code == 400 and got["bad_request"].headers["x-request-id"] == "client-id-4"


@pytest.mark.parametrize("workers", [1, 2])
def test_json_logs_and_request_ids(tmp_path, workers):
    srv = ServeProcess(config(tmp_path), free_port(), args=["--log-format", "json", "--workers", str(workers)])
    try:
        srv.wait_ready(120)
        got = exercise(srv.url)
        check_ids(got)
    finally:
        assert srv.stop() == 0
    text = "".join(srv.lines)
    assert KEY not in text and TEXT not in text                 # never a key or a text, in any line
    lines = json_lines(srv.lines)
    assert lines and all({"ts", "level", "logger", "msg"} <= set(x) for x in lines)
    access = {x["request_id"]: x for x in lines if x["logger"] == "rsinfer.access"}
    kept = access["client-id-1"]
    assert (kept["method"], kept["route"], kept["status"], kept["model"], kept["rows"]) == \
        ("POST", "/v1/embeddings", 200, "emb", 2)
    assert kept["duration_ms"] > 0 and kept["level"] == "info"
    if workers == 1:                                            # the scheduler's own numbers, in one process
        assert kept["inference_ms"] > 0 and kept["queue_ms"] >= 0
    tensor = access["client-id-2"]
    assert tensor["route"] == "/v2/models/{model}/infer" and tensor["model"] == "add" and tensor["rows"] == 1
    assert access["client-id-3"]["status"] == 401 and access["client-id-4"]["status"] == 400
    assert access[got["replaced"].headers["x-request-id"]]["status"] == 200
    # uvloop by default where it is installed (every process: the server, or each front end and the engine)
    loops = [x["msg"] for x in lines if x["msg"].startswith("event loop:")]
    assert loops and set(loops) == {"event loop: uvloop"} and len(loops) == (1 if workers == 1 else workers + 1)


def test_access_log_off_and_text_format(tmp_path):
    srv = ServeProcess(config(tmp_path, access_log=False, event_loop="asyncio"), free_port())
    try:
        srv.wait_ready(120)
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            r = c.post("/v1/embeddings", headers={"Authorization": f"Bearer {KEY}", "x-request-id": "quiet-1"},
                       json={"model": "emb", "input": TEXT})
            assert r.headers["x-request-id"] == "quiet-1"
            c.get("/nope", headers={"Authorization": f"Bearer {KEY}", "x-request-id": "quiet-2"})
    finally:
        assert srv.stop() == 0
    assert not [ln for ln in srv.lines if "rsinfer.access" in ln]
    assert not json_lines(srv.lines)                            # text by default
    assert any("rsinfer.engine: thread plan:" in ln for ln in srv.lines)
    assert any("event loop: asyncio" in ln for ln in srv.lines)           # server.event_loop: asyncio


def test_grpc_request_id_through_metadata(tmp_path):
    import grpc

    from rsinfer_cli.server.kserve import kserve_pb2 as pb
    from rsinfer_cli.server.kserve import kserve_pb2_grpc as pb_grpc

    port = free_port()
    srv = ServeProcess(config(tmp_path, grpc_bind=f"127.0.0.1:{port}"), free_port(), args=["--log-format", "json"])
    try:
        srv.wait_ready(120)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            _, call = stub.ModelMetadata.with_call(pb.ModelMetadataRequest(name="add"), timeout=10, metadata=(
                ("authorization", f"Bearer {KEY}"), ("x-request-id", "grpc-id-1")))
            assert dict(call.trailing_metadata())["x-request-id"] == "grpc-id-1"
            with pytest.raises(grpc.RpcError) as err:          # an error carries it too
                stub.ModelMetadata(pb.ModelMetadataRequest(name="nope"), timeout=10, metadata=(
                    ("authorization", f"Bearer {KEY}"), ("x-request-id", "grpc-id-2")))
            assert dict(err.value.trailing_metadata())["x-request-id"] == "grpc-id-2"
            # the same inference by HTTP and by gRPC: the same stages in the access line and the histograms
            x = pb.ModelInferRequest.InferInputTensor(name="X", datatype="FP32", shape=[1, 2],
                                                      contents=pb.InferTensorContents(fp32_contents=[1, 2]))
            stub.ModelInfer(pb.ModelInferRequest(model_name="add", inputs=[x]), timeout=10, metadata=(
                ("authorization", f"Bearer {KEY}"), ("x-request-id", "grpc-id-3")))
            auth = {"Authorization": f"Bearer {KEY}"}
            r = httpx.post(srv.url + "/v2/models/add/infer", headers={**auth, "x-request-id": "http-id-3"},
                           json={"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]},
                           timeout=30)
            assert r.status_code == 200
            text = httpx.get(srv.url + "/metrics", headers=auth, timeout=30).text
    finally:
        assert srv.stop() == 0
    access = {x.get("request_id"): x for x in json_lines(srv.lines) if x["logger"] == "rsinfer.access"}
    assert access["grpc-id-1"]["route"] == "ModelMetadata" and access["grpc-id-1"]["code"] == "OK"
    assert access["grpc-id-2"]["code"] == "NOT_FOUND"

    from rsinfer_cli.runtime.record import FIELDS

    record_fields = set(FIELDS)     # what an access line may carry of the request's record
    grpc_line, http_line = access["grpc-id-3"], access["http-id-3"]
    assert record_fields & set(grpc_line) == record_fields & set(http_line) >= {"model", "rows", "queue_ms",
                                                                                 "inference_ms"}
    assert (grpc_line["model"], grpc_line["rows"]) == (http_line["model"], http_line["rows"]) == ("add", 1)
    for histogram in ("rsinfer_queue_wait_seconds", "rsinfer_inference_seconds", "rsinfer_postprocess_seconds",
                      "rsinfer_model_request_duration_seconds"):     # both calls counted in each stage
        counts = [float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                  if ln.startswith(histogram + "_count{") and 'model="add"' in ln]
        assert sum(counts) == 2, (histogram, counts)


def test_grpc_call_the_client_left_and_an_unexpected_error_are_told_apart(tmp_path, caplog):
    """A gRPC call whose client gave up (its deadline passed) is counted and logged CANCELLED, not OK; an unexpected
    exception answers INTERNAL "internal server error" (grpc.aio would send the exception's own text as UNKNOWN) and
    is logged with its traceback; on a stream it is that request's error message, and the stream goes on."""
    import asyncio
    import threading

    import grpc

    from rsinfer_cli.config import load_config
    from rsinfer_cli.server.kserve import kserve_pb2 as pb
    from rsinfer_cli.server.kserve import kserve_pb2_grpc as pb_grpc

    from serverutil import ServerThread

    path = config(tmp_path)
    with ServerThread(load_config(path), grpc=True) as srv, grpc.insecure_channel(srv.grpc_url) as ch:
        stub = pb_grpc.GRPCInferenceServiceStub(ch)
        auth = (("authorization", f"Bearer {KEY}"),)
        request = pb.ModelInferRequest(model_name="add", inputs=[pb.ModelInferRequest.InferInputTensor(
            name="X", datatype="FP32", shape=[1, 2], contents=pb.InferTensorContents(fp32_contents=[1, 2]))])
        core = srv.state.core
        infer = core.infer
        gone = threading.Event()

        async def slow(*args, **kwargs):
            try:
                await asyncio.sleep(10)
            finally:
                gone.set()

        core.infer = slow
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(request, timeout=0.3, metadata=auth)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert gone.wait(5)                  # the handler was cancelled, not left to run its 10 s

        async def boom(*args, **kwargs):
            raise RuntimeError(f"detail from {tmp_path}")

        core.infer = boom
        with caplog.at_level("ERROR", logger="rsinfer.server"), pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(request, timeout=10, metadata=auth)
        assert err.value.code() == grpc.StatusCode.INTERNAL and err.value.details() == "internal server error"
        assert str(tmp_path) not in err.value.details()
        assert any(r.exc_info and "gRPC ModelInfer failed" in r.getMessage() for r in caplog.records)
        with caplog.at_level("ERROR", logger="rsinfer.server"):     # on a stream: an error message, the stream goes on
            streamed = list(stub.ModelStreamInfer(iter([request, request]), timeout=10, metadata=auth))
        assert [r.error_message for r in streamed] == ["internal server error"] * 2
        assert any(r.exc_info and "gRPC ModelStreamInfer failed" in r.getMessage() for r in caplog.records)
        core.infer = infer
        assert stub.ModelInfer(request, timeout=10, metadata=auth).outputs[0].name == "Y"
        text = httpx.get(srv.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).text
    counts = {code: metric for code in ("CANCELLED", "INTERNAL", "OK")
              for metric in [next((float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                                   if ln.startswith("rsinfer_grpc_requests_total{") and 'method="ModelInfer"' in ln
                                   and f'code="{code}"' in ln), 0.0)]}
    assert counts == {"CANCELLED": 1.0, "INTERNAL": 1.0, "OK": 1.0}, counts
    assert 'rsinfer_grpc_requests_total{code="INTERNAL",method="ModelStreamInfer"} 2.0' in text.splitlines()


def test_memory_cache_bytes_with_worker_processes(tmp_path):
    """rsinfer_cache_bytes is exported with worker processes too: the front ends' memory caches, summed."""
    import re

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"server": {"cache": {"backend": "memory"}, "workers": 2}, "models": [
        {"name": "emb", "kind": "embedding", "path": str(synth.write_model_dir(tmp_path / "emb"))}]}))
    srv = ServeProcess(cfg, free_port())
    try:
        srv.wait_ready(120)
        for k in range(12):            # new connections: both front ends fill their caches
            with httpx.Client(base_url=srv.url, timeout=30) as c:
                assert c.post("/v1/embeddings", json={"input": [f"text {k}", f"other {k}"]}).status_code == 200
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            for _ in range(4):         # the size is written at each lookup: one more request per front end
                c.post("/v1/embeddings", json={"input": "again"})
            text = c.get("/metrics").text
    finally:
        assert srv.stop() == 0
    got = re.findall(r"^rsinfer_cache_bytes ([0-9.e+]+)$", text, re.M)
    assert got and float(got[0]) > 0, [ln for ln in text.splitlines() if "cache" in ln]


def test_tei_timing_headers_agree_with_the_metrics(tmp_path):
    """One request's x-inference-time / x-queue-time / x-tokenization-time are what /metrics counted for it."""
    import re

    from rsinfer_cli.config import parse_config

    from serverutil import ServerThread

    cfg = parse_config({"models": [{"name": "emb", "kind": "embedding",
                                    "path": str(synth.write_model_dir(tmp_path / "emb"))}]})

    def total(text: str, metric: str) -> float:
        got = re.findall(rf'^{metric}_sum{{model="emb",version=""}} ([0-9.e+-]+)$', text, re.M)
        return float(got[0]) * 1000 if got else 0.0

    with ServerThread(cfg) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        before = c.get("/metrics").text
        r = c.post("/v1/embeddings", json={"input": ["a text", "two"]})
        after = c.get("/metrics").text
    h = {k: float(r.headers[k]) for k in ("x-compute-time", "x-tokenization-time", "x-queue-time",
                                          "x-inference-time")}
    assert h["x-compute-time"] >= h["x-inference-time"] > 0 and h["x-compute-time"] >= h["x-tokenization-time"]
    assert abs(h["x-inference-time"] - (total(after, "rsinfer_inference_seconds")
                                        - total(before, "rsinfer_inference_seconds"))) < 0.05
    assert abs(h["x-queue-time"] - (total(after, "rsinfer_queue_wait_seconds")
                                    - total(before, "rsinfer_queue_wait_seconds"))) < 0.05


# ---------------------------------------------------------------- the access line's fast path, in-process


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_the_direct_access_line_is_the_formatters_line(fmt):
    """logs.access writes the line itself where only the daemon's handler would see the record: the same text,
    to the character, as the formatter makes of the LogRecord (request id and FIELDS included)."""
    import logging

    from rsinfer_cli.server.logs import REQUEST_ID, JsonFormatter, TextFormatter, _RequestIdFilter

    formatter = JsonFormatter() if fmt == "json" else TextFormatter()
    fields = {"method": "POST", "route": "/v2/models/{model}/infer", "status": 200, "duration_ms": 0.123,
              "client": "127.0.0.1", "model": "add", "rows": 1, "queue_ms": 0.01, "not_a_field": "dropped"}
    for created, rid in [(1_790_000_000.25, "abc"), (1_790_000_000.9995, None), (1_790_000_001.0, "x-1")]:
        record = logging.LogRecord("rsinfer.access", logging.INFO, "", 0, "%s", ("POST /x 200 0.1ms",), None)
        record.created, record.msecs = created, int((created - int(created)) * 1000) + 0.0
        record.__dict__.update(fields)
        token = REQUEST_ID.set(rid)
        try:
            _RequestIdFilter().filter(record)
        finally:
            REQUEST_ID.reset(token)
        assert formatter.info_line("rsinfer.access", created, "POST /x 200 0.1ms", rid, lambda: fields) == \
            formatter.format(record)
        assert formatter.info_line("rsinfer.access", created, "POST /x 200 0.1ms", rid, lambda: fields, "\n") == \
            formatter.format(record) + "\n"


def test_loop_handler_writes_once_per_interval_and_flushes_off_the_loop():
    """Lines logged on the loop go out in one write FLUSH_S after the first of them (not at the end of each loop
    iteration); a line off any loop (and every line at flush) goes out at once, after those waiting: nothing lost,
    one thread's order kept."""
    import asyncio
    import io
    import logging
    import threading

    from rsinfer_cli.server.logs import FLUSH_S, LoopStreamHandler, TextFormatter

    class Counting(io.StringIO):
        writes = 0

        def write(self, s: str) -> int:
            self.writes += 1
            return super().write(s)

    stream = Counting()
    handler = LoopStreamHandler()
    handler.setStream(stream)
    handler.setFormatter(TextFormatter())
    log = logging.getLogger("rsinfer.test-loop-handler")
    log.propagate = False
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        async def burst() -> tuple[str, str, str]:
            for i in range(25):
                log.info("line %d", i)
            before = stream.getvalue()
            await asyncio.sleep(0)        # iterations end, other requests' lines join the same write
            for i in range(25, 50):
                log.info("line %d", i)
            await asyncio.sleep(0)
            between = stream.getvalue()
            await asyncio.sleep(FLUSH_S * 2)    # the write is due: the 50 lines go out
            return before, between, stream.getvalue()

        before, between, after = asyncio.run(burst())
        assert before == between == ""
        assert [ln.split(": ", 1)[1] for ln in after.splitlines()] == [f"line {i}" for i in range(50)]
        assert stream.writes == 1
        log.info("off the loop")
        assert stream.getvalue().endswith("off the loop\n")
        assert stream.writes == 2

        async def with_a_thread() -> tuple[str, str]:
            log.info("loop 1")
            log.info("loop 2")
            worker = threading.Thread(target=log.info, args=("from a thread",))
            worker.start()
            worker.join(5)
            during = stream.getvalue()    # written at once, after the loop's lines that waited
            log.info("loop 3")
            await asyncio.sleep(FLUSH_S * 2)
            return during, stream.getvalue()

        during, after = asyncio.run(with_a_thread())
        assert [ln.split(": ", 1)[1] for ln in during.splitlines()[-3:]] == ["loop 1", "loop 2", "from a thread"]
        assert after.endswith("loop 3\n") and stream.writes == 4

        ended = asyncio.new_event_loop()            # a loop that stopped before running the write it scheduled
        handler._due = (threading.get_ident(), ended)
        handler.line("held\n")
        ended.close()
        assert stream.getvalue().endswith("held\n") and handler._due is None   # written at once, not held
    finally:
        log.removeHandler(handler)


def test_run_loop_writes_what_its_loop_left_pending():
    """A line logged in the loop's last moments waits for a write the loop will never run: run_loop writes it once
    the loop has ended (nothing lost at a stop, whatever the interpreter does next)."""
    import io
    import logging

    from rsinfer_cli.server.logs import LoopStreamHandler, TextFormatter
    from rsinfer_cli.server.run import run_loop

    stream = io.StringIO()
    handler = LoopStreamHandler()
    handler.setStream(stream)
    handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)
    try:
        async def last_words() -> int:
            logging.getLogger("rsinfer.test-last-words").info("draining done")
            return 7

        assert run_loop(last_words(), "asyncio") == 7
        assert stream.getvalue().endswith("draining done\n")
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
