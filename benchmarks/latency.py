"""One client, one short query at a time: where a request's time goes, against the raw pipeline in the same run.

    .venv/bin/python benchmarks/latency.py [--before-src <checkout>/src]   # appends a section to RESULTS.md

all-MiniLM-L6-v2 (../shared/models), the defaults (`rsinfer serve`, no thread settings: 2 x 1 lanes + a 2-thread
latency lane on 2 CPUs). One client sends 250 short queries in a row over one keep-alive HTTP connection to
`/v1/embeddings`; the medians are over the last 200. Beside the wall time, the server's own TEI timing headers
split it: `x-tokenization-time`, `x-inference-time` (the forward), `x-compute-time` (the server's whole handling),
so that wall - compute is HTTP and the client, compute - tokenize - inference is the server's own work.

The baseline: the raw pipeline in this process (tokenizers → `session.run` with 2 intra-op threads → mean pooling
and normalising), one query at a time, the same texts, the median of the last 200 of 250. `--before-src` runs
another checkout's server beside this one, alternating A B B A.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from _serve import Serve, append_results
from batching import SHARED, machine

ROOT = Path(__file__).resolve().parent
MODEL = SHARED / "all-minilm-l6-v2"
QUERIES = [f"how do I reset my password on device {i}" for i in range(250)]


def raw(threads: int) -> float:
    """The raw pipeline's p50 (ms) on one query at a time."""
    import numpy as np
    import onnxruntime as ort
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    tok.no_padding()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(MODEL / "onnx" / "model.onnx"), opts, providers=["CPUExecutionProvider"])
    times = []
    for q in QUERIES:
        t0 = time.perf_counter()
        e = tok.encode(q)
        ids = np.array([e.ids], dtype=np.int64)
        mask = np.array([e.attention_mask], dtype=np.int64)
        out = sess.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[0]
        v = (out * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
        v / np.linalg.norm(v, axis=1, keepdims=True)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times[50:])


class RawHttp:
    """The thinnest HTTP/1.1 keep-alive client: one socket, requests written whole, responses read by their
    Content-Length (a client's own cost out of the measurement: httpx adds ~0.5 ms a request here)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def post(self, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        self.sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        while b"\r\n\r\n" not in self.buf:
            self.buf += self._recv()
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        n = int(headers["content-length"])
        while len(rest) < n:
            rest += self._recv()
        self.buf = rest[n:]
        return int(lines[0].split()[1]), headers, rest[:n]

    def _recv(self) -> bytes:
        data = self.sock.recv(1 << 16)
        if not data:
            raise ConnectionError("the server closed the connection")
        return data

    def close(self) -> None:
        self.sock.close()


def served(src: Path | None, tmp: Path, name: str, client: str) -> dict[str, float]:
    """Medians (ms) of the wall time and the server's timing headers over the last 200 of 250 queries, sent by
    `client`: raw (RawHttp) or httpx."""
    got: dict[str, list[float]] = {"wall": [], "compute": [], "tokenize": [], "inference": []}
    with Serve(f"  - {{name: mini, kind: embedding, path: '{MODEL}'}}\n", tmp, name=name, src=src) as srv:
        if client == "raw":
            raw_client = RawHttp(srv.port)

            def post(q: str) -> tuple[int, dict[str, str]]:
                status, headers, _ = raw_client.post("/v1/embeddings", json.dumps({"model": "mini", "input": q})
                                                     .encode())
                return status, headers
        else:
            http = httpx.Client(timeout=30)

            def post(q: str) -> tuple[int, dict[str, str]]:
                r = http.post(srv.url + "/v1/embeddings", json={"model": "mini", "input": q})
                return r.status_code, dict(r.headers)
        try:
            for i, q in enumerate(QUERIES):
                t0 = time.perf_counter()
                status, headers = post(q)
                wall = (time.perf_counter() - t0) * 1000
                if status != 200:
                    raise RuntimeError(f"status {status}")
                if i < 50:
                    continue
                got["wall"].append(wall)
                for key, header in (("compute", "x-compute-time"), ("tokenize", "x-tokenization-time"),
                                    ("inference", "x-inference-time")):
                    if header in headers:
                        got[key].append(float(headers[header]))
        finally:
            raw_client.close() if client == "raw" else http.close()
    return {k: statistics.median(v) if v else float("nan") for k, v in got.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before-src", type=Path, help="another checkout's src/, measured beside this one (A B B A)")
    ap.add_argument("--before-label", default="before")
    ap.add_argument("--out", type=Path, default=ROOT / "RESULTS.md")
    args = ap.parse_args()
    sides: list[tuple[str, Path | None, str]] = [("rsinfer, the defaults", None, "raw"),
                                                 ("rsinfer, the defaults; httpx client", None, "httpx")]
    if args.before_src is not None:
        sides = [(args.before_label, args.before_src, "raw"), ("now", None, "raw")]
    results: dict[str, list[dict[str, float]]] = {label: [] for label, _, _ in sides}
    raws: dict[int, list[float]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as d:
        for order in (sides, sides[::-1]):
            for threads in (2, 1):
                raws[threads].append(raw(threads))
            for label, src, client in order:
                results[label].append(served(src, Path(d), "srv", client))
    base = statistics.mean(raws[2])
    lines = ["", "## One client, one query: where the time goes (`latency.py`)", "",
             f"Machine: {machine()}; run on {time.strftime('%Y-%m-%d')}. Reproduce: `.venv/bin/python "
             "benchmarks/latency.py` (the defaults; all-MiniLM-L6-v2; one client, 250 short queries over one "
             "keep-alive connection - the thinnest HTTP client, and httpx -, medians of the last 200; two passes "
             "A B B A, the mean of their medians).", "",
             f"Baseline, in this process: the raw pipeline p50 {base:.2f} ms with 2 threads, "
             f"{statistics.mean(raws[1]):.2f} ms with 1.", "",
             "| server | wall p50 (ms) | - raw 2 threads | compute | tokenize | inference | server's own "
             "| HTTP + client |", "|---|---|---|---|---|---|---|---|"]
    for label, _, _ in sides:
        rs = results[label]

        def m(key: str) -> float:
            return statistics.mean(r[key] for r in rs)     # noqa: B023 - used at once

        own = m("compute") - m("tokenize") - m("inference")
        lines.append(f"| {label} | {m('wall'):.2f} | {m('wall') - base:+.2f} | {m('compute'):.2f} | "
                     f"{m('tokenize'):.2f} | {m('inference'):.2f} | {own:.2f} | {m('wall') - m('compute'):.2f} |")
    lines.append("")
    return append_results(args.out, lines)


if __name__ == "__main__":
    raise SystemExit(main())
