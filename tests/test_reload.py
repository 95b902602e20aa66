"""Reloading the config on SIGHUP through real `rsinfer serve` processes, one process and `--workers 2`: a model
added, one removed and one changed while 16 clients load the unchanged ones - none of their requests fails; a
broken file changes nothing and is logged with its key path. And no leak: the RSS after ten unload/load cycles of
all-MiniLM through the repository API stays within 10 % of the RSS after the first."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from serverutil import ServeProcess, free_port
from synth import add_graph

CLIENTS = 16


def entry(name: str, folder: Path, **more) -> dict:
    return {"name": name, "kind": "tensor", "path": str(folder), "max_batch_size": 8, **more}


def infer(client: httpx.Client, url: str, model: str) -> httpx.Response:
    return client.post(f"{url}/v2/models/{model}/infer", json={"inputs": [
        {"name": "X", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 1.0]}]})


def wait_for(check, timeout: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Load:
    """16 clients, each sending requests to the unchanged models in turn until stopped (bounded in time)."""

    def __init__(self, url: str, models: list[str], limit_s: float = 120.0) -> None:
        self.url, self.models, self.limit_s = url, models, limit_s
        self.ok = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(CLIENTS)]

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def _run(self, i: int) -> None:
        deadline = time.monotonic() + self.limit_s
        with httpx.Client(timeout=30) as client:
            n = 0
            while not self._stop.is_set() and time.monotonic() < deadline:
                model = self.models[(i + n) % len(self.models)]
                n += 1
                try:
                    r = infer(client, self.url, model)
                    good = r.status_code == 200 and r.json()["outputs"][0]["data"] == [2.0, 2.0]
                    why = f"{model}: {r.status_code} {r.text[:200]}"
                except httpx.HTTPError as exc:
                    good, why = False, f"{model}: {exc!r}"
                with self._lock:
                    if good:
                        self.ok += 1
                    else:
                        self.failures.append(why)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)


@pytest.mark.parametrize("workers", [1, 2])
def test_sighup_applies_the_difference_under_load(tmp_path, workers):
    plus1 = add_graph(tmp_path / "plus1" / "model.onnx", 1.0).parent
    plus2 = add_graph(tmp_path / "plus2" / "model.onnx", 2.0).parent
    path = tmp_path / "rsinfer.yaml"
    server = {"grpc_bind": None}
    path.write_text(yaml.safe_dump({"server": server, "models": [
        entry("keep_a", plus1), entry("keep_b", plus1), entry("gone", plus1), entry("changed", plus1)]}))
    srv = ServeProcess(path, free_port(), args=["--workers", str(workers)])
    try:
        srv.wait_ready(120)
        url = srv.url
        with httpx.Client(timeout=30) as c:
            assert infer(c, url, "changed").json()["outputs"][0]["data"] == [2.0, 2.0]
            with Load(url, ["keep_a", "keep_b"]) as load:
                wait_for(lambda: load.ok > 50, what="the load to run")
                path.write_text(yaml.safe_dump({"server": server, "models": [
                    entry("keep_a", plus1), entry("keep_b", plus1), entry("changed", plus2),
                    entry("added", plus2)]}))
                os.kill(srv.proc.pid, signal.SIGHUP)
                # done: the one process has applied it; with workers, the supervisor hears it once every front end
                # serves the new set - so from then on every connection (spread over the front ends) finds it
                done = "reload: engine cpu:" if workers > 1 else "reload of"
                wait_for(lambda: done in srv.output, what="the reload's end")
                for _ in range(12):
                    with httpx.Client(timeout=30) as fresh:
                        assert infer(fresh, url, "added").status_code == 200
                wait_for(lambda: infer(c, url, "changed").json()["outputs"][0]["data"] == [3.0, 3.0],
                         what="the changed model's new version")
                wait_for(lambda: infer(c, url, "gone").status_code == 404, what="the removed model's 404")
                before = load.ok
                wait_for(lambda: load.ok > before + 50, what="the load after the reload")
            assert load.failures == [], load.failures[:5]
            assert infer(c, url, "added").json()["outputs"][0]["data"] == [3.0, 3.0]
            assert "Request for unknown model: 'gone' is not found" in infer(c, url, "gone").json()["error"]
            names = {m["id"] for m in c.get(url + "/v1/models").json()["data"]}
            assert names == {"keep_a", "keep_b", "changed", "added"}
            assert re.search(r"reload.*added added; changed changed; removed gone", srv.output), srv.output

            # a broken file: nothing changes, the error is logged with its key path
            path.write_text(yaml.safe_dump({"server": server, "models": [
                {"name": "keep_a", "path": str(plus1)}]}))
            os.kill(srv.proc.pid, signal.SIGHUP)
            wait_for(lambda: "models[0].kind" in srv.output, what="the refused reload's log line")
            assert re.search(r"refused.*models\[0\]\.kind", srv.output), srv.output
            assert infer(c, url, "added").status_code == 200
            assert infer(c, url, "changed").json()["outputs"][0]["data"] == [3.0, 3.0]
            assert {m["id"] for m in c.get(url + "/v1/models").json()["data"]} == names
            assert srv.proc.poll() is None
    finally:
        assert srv.stop(60) == 0, srv.output


def rss_of(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.shared
def test_unload_load_cycles_do_not_leak(shared_models, tmp_path):
    """Ten unload/load cycles of all-MiniLM (87 MB of weights) through the repository API: the server's RSS after
    the tenth is within 10 % of its RSS after the first (sessions and arenas are freed, not kept)."""
    path = tmp_path / "rsinfer.yaml"
    path.write_text(yaml.safe_dump({"server": {"model_control": True}, "models": [
        {"name": "minilm", "kind": "embedding", "path": str(shared_models / "all-minilm-l6-v2")}]}))
    srv = ServeProcess(path, free_port())
    try:
        srv.wait_ready(120)
        rss = []
        with httpx.Client(timeout=60) as c:
            for _ in range(10):
                assert c.post(srv.url + "/v2/repository/models/minilm/unload").status_code == 200
                assert c.post(srv.url + "/v2/repository/models/minilm/load").status_code == 200
                r = c.post(srv.url + "/v1/embeddings", json={"model": "minilm", "input": ["a short query"] * 8})
                assert r.status_code == 200
                time.sleep(0.3)           # the replaced version is freed once its queue is quiet
                rss.append(rss_of(srv.proc.pid))
        assert rss[-1] <= rss[0] * 1.10, [f"{r / 2**20:.0f} MiB" for r in rss]
        assert srv.output.count("model minilm: READY") >= 10
    finally:
        srv.stop(60)
