"""Work stops at the deadline: a request whose post-processing would take minutes (256 RE2 expressions, each
within its work limit, over 300 texts) gets its 408, and the server's CPU is idle again within a second (read from
/proc, not a clock); SIGTERM during it ends the process within its shutdown bound, the client answered."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest
import yaml

from rsinfer_cli.config import parse_config

from serverutil import ServeProcess, ServerThread, free_port, process_tree

pytestmark = pytest.mark.shared
TIMEOUT_MS = 1500
EXPR = r"(?:[a-z]{0,20}\w{0,20}\d?){0,8}Q"     # ~990 RE2 instructions: under the work limit over 50,000 chars


def heavy_body() -> dict:
    return {"texts": ["a" * 50_000] * 300,
            "patterns": [{"entity_type": f"P{i}", "regex": [EXPR.replace("Q", f"Q{j}") for j in range(8)]}
                         for i in range(32)]}


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])        # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def models(shared_models) -> list[dict]:
    return [{"name": "pii", "kind": "pii", "path": str(shared_models / "rampart-pii"), "replicas": 1}]


def test_after_the_408_the_cpu_is_idle_within_a_second(shared_models):
    cfg = parse_config({"server": {"request_timeout_ms": TIMEOUT_MS}, "models": models(shared_models)})
    with ServerThread(cfg) as srv:
        t0 = time.monotonic()
        r = httpx.post(srv.url + "/pii/detect", json=heavy_body(), timeout=60)
        assert r.status_code == 408, r.text[:300]
        assert time.monotonic() - t0 < 10
        time.sleep(1.0)
        before = cpu_seconds([os.getpid()])
        time.sleep(1.0)
        used = cpu_seconds([os.getpid()]) - before
        assert used < 0.3, f"{used:.2f} s of CPU in the second after the 408's second"
        cpu = httpx.get(srv.url + "/metrics").text
        assert "rsinfer_request_cpu_seconds_count{model=\"pii\"}" in cpu      # the cancelled request's CPU shows


def test_sigterm_during_the_worst_ends_within_bounds(shared_models, tmp_path):
    path = tmp_path / "rsinfer.yaml"
    path.write_text(yaml.safe_dump({"server": {"request_timeout_ms": TIMEOUT_MS, "shutdown_delay_ms": 0},
                                    "models": models(shared_models)}))
    proc = ServeProcess(path, free_port())
    try:
        proc.wait_ready(120)
        answers: list[int] = []
        client = threading.Thread(target=lambda: answers.append(
            httpx.post(proc.url + "/pii/detect", json=heavy_body(), timeout=60).status_code))
        client.start()
        time.sleep(0.8)
        t0 = time.monotonic()
        os.kill(proc.proc.pid, signal.SIGTERM)
        proc.proc.wait(20)
        took = time.monotonic() - t0
        client.join(30)
        assert took < TIMEOUT_MS / 1000 + 5, took      # the drain's bound: the request deadline, and a margin
        assert answers and answers[0] in (408, 503), answers
    finally:
        for pid in process_tree(proc.proc.pid)[1:]:
            os.kill(pid, signal.SIGKILL)
        proc.stop(10)
