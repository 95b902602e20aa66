"""deploy/compose: the Compose file validates (`docker-compose config`), Prometheus' config and alert rules pass
`promtool check` and the rule unit tests (`promtool test rules`), and every metric that a rule or a dashboard panel
reads exists in the /metrics of a live rsinfer that served every family (the PromQL parsed, not grepped)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from conftest import ROOT

COMPOSE = ROOT / "deploy" / "compose"
PROM = COMPOSE / "prometheus"


def tool(name: str, env: str) -> str:
    path = shutil.which(name)
    if path is None:
        if os.environ.get(env) == "1":
            pytest.fail(f"{name} is required ({env}=1) but not installed")
        pytest.skip(f"{name} is not installed (apt-get install {'prometheus' if name == 'promtool' else name})")
    return path


def run(*argv: str, cwd: Path = COMPOSE) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_compose_file_validates():
    compose = tool("docker-compose", "RSINFER_REQUIRE_COMPOSE")
    proc = run(compose, "-f", "docker-compose.yml", "config")
    assert proc.returncode == 0, proc.stderr
    services = yaml.safe_load(proc.stdout)["services"]
    assert set(services) == {"rsinfer", "redis", "redis-exporter", "prometheus", "grafana"}
    assert services["rsinfer"]["build"]["dockerfile"] == "Dockerfile"
    rsinfer_cfg = yaml.safe_load((COMPOSE / "rsinfer.yaml").read_text())
    assert rsinfer_cfg["server"]["cache"]["url"].startswith("redis://redis:")     # the redis service


def test_prometheus_config_rules_and_rule_tests():
    promtool = tool("promtool", "RSINFER_REQUIRE_PROMTOOL")
    for argv in (("check", "config", "prometheus.yml"), ("check", "rules", "rules.yml"),
                 ("test", "rules", "rules_test.yml")):
        proc = run(promtool, *argv, cwd=PROM)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    alerts = {r["alert"] for g in yaml.safe_load((PROM / "rules.yml").read_text())["groups"] for r in g["rules"]
              if "alert" in r}
    assert alerts == {"RsinferHighErrorRatio", "RsinferSlowRequests", "RsinferQueueSaturated", "RsinferCacheDown"}


def selectors(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (its vector selectors), from the parsed expression."""
    import promql_parser as p

    names: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, p.VectorSelector):
            if node.name:
                names.add(node.name)
            return
        for attr in ("lhs", "rhs", "expr", "param", "vector_selector"):
            child = getattr(node, attr, None)
            if child is not None:
                walk(child)
        for arg in getattr(node, "args", None) or ():
            walk(arg)

    walk(p.parse(expr))
    return names


def expressions() -> list[tuple[str, str]]:
    """(where, expr) of every alert and recording rule and every dashboard target."""
    out = []
    for g in yaml.safe_load((PROM / "rules.yml").read_text())["groups"]:
        for r in g["rules"]:
            out.append((f"rules.yml {r.get('alert') or r.get('record')}", r["expr"]))
    for dash in (COMPOSE / "grafana" / "dashboards").glob("*.json"):
        for panel in json.loads(dash.read_text())["panels"]:
            for t in panel["targets"]:
                out.append((f"{dash.name} '{panel['title']}'", t["expr"]))
    return out


@pytest.mark.shared
def test_every_metric_read_exists_in_a_live_rsinfer(shared_models, tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    from rsinfer_cli.config import parse_config

    from serverutil import ServerThread

    cfg = parse_config({"server": {"cache": {"backend": "memory"}, "rate_limit": {"requests": 100000,
                                                                                  "window_s": 60}},
                        "models": [
        {"name": "mini", "kind": "embedding", "path": str(shared_models / "all-minilm-l6-v2")},
        {"name": "rr", "kind": "rerank", "path": str(shared_models / "tiny-reranker-1")},
        {"name": "pii", "kind": "pii", "path": str(shared_models / "rampart-pii")},
        {"name": "nli", "kind": "zeroshot", "path": str(shared_models / "tiny-nli")},
        {"name": "t", "kind": "tensor", "path": str(shared_models / "tensor-models" / "add_one"),
         "max_batch_size": 8}]})
    with ServerThread(cfg, grpc=True) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        for route, body in (("/v1/embeddings", {"model": "mini", "input": "hello"}),
                            ("/v1/rerank", {"model": "rr", "query": "q", "documents": ["a", "b"]}),
                            ("/pii/redact", {"model": "pii", "text": "mail alex@example.com"}),
                            ("/classify/zero-shot", {"model": "nli", "input": "x", "candidate_labels": ["a", "b"]}),
                            ("/v2/models/t/infer", {"inputs": [{"name": "INPUT0", "datatype": "FP32",
                                                                "shape": [1, 4], "data": [1, 2, 3, 4]}]})):
            assert c.post(route, json=body).status_code == 200, route
        import tritonclient.grpc as tg

        assert tg.InferenceServerClient(srv.grpc_url).is_server_live()
        text = c.get("/metrics").text
    exported: set[str] = set()
    for fam in text_string_to_metric_families(text):
        exported.add(fam.name)
        exported |= {s.name for s in fam.samples}
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ()}
        exported |= {fam.name + s for s in suffixes.get(fam.type, ())}
    missing = []
    for where, expr in expressions():
        for name in selectors(expr):
            if name.startswith("redis_") or ":" in name:   # the Redis exporter's, and recording rules
                continue
            if name not in exported:
                missing.append(f"{where}: {name}")
    assert not missing, missing
    assert len(expressions()) >= 15
