"""Config validation: one test per kind of mistake, each asserting the file and key path in the message."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rsinfer_cli.config import Config, load_config, parse_config
from rsinfer_cli.errors import ConfigError

from conftest import ROOT

MINIMAL = "models:\n  - name: e5\n    kind: embedding\n    hf: Xenova/multilingual-e5-small\n"


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    return str(info.value)


def model(**extra) -> dict:
    return {"name": "m", "kind": "embedding", "hf": "org/m", **extra}


def parse_error(data) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data, file="config.yaml")
    return str(info.value)


def test_minimal_defaults(tmp_path):
    cfg = load_config(write(tmp_path, MINIMAL))
    assert isinstance(cfg, Config)
    m = cfg.models[0]
    assert (m.replicas, m.intra_threads, m.revision, m.dtype, m.eps, m.max_len, m.truncate) == \
        (None, 0, "main", "auto", ("cpu",), None, True)
    assert (m.batching.enabled, m.batching.max_rows, m.batching.max_tokens, m.batching.queue_rows) == \
        (True, 64, None, 1024)
    s = cfg.server
    assert (s.bind, s.max_body_mb, s.request_timeout_ms, s.max_queue, s.queue_timeout_ms) == \
        ("127.0.0.1:8080", 32, 120_000, 256, 30_000)
    assert (s.host, s.port) == ("127.0.0.1", 8080)


def test_config_is_frozen(tmp_path):
    cfg = load_config(write(tmp_path, MINIMAL))
    with pytest.raises(AttributeError):
        cfg.models[0].replicas = 3  # type: ignore[misc]


def test_unknown_key_with_did_you_mean(tmp_path):
    msg = error_of(tmp_path, MINIMAL + "    replcas: 2\n")
    assert msg == f"{tmp_path / 'config.yaml'}: models[0].replcas: unknown key (did you mean 'replicas'?)"


def test_unknown_batching_key():
    assert "config.yaml: models[0].batching.max_row: unknown key (did you mean 'max_rows'?)" in \
        parse_error({"models": [model(batching={"max_row": 3})]})


def test_unknown_server_and_top_level_keys():
    msg = parse_error({"servr": {}, "server": {"max_queu": 1}, "models": [model()]})
    assert "config.yaml: servr: unknown key (did you mean 'server'?)" in msg
    assert "config.yaml: server.max_queu: unknown key (did you mean 'max_queue'?)" in msg


def test_impossible_value_names_key_path():
    msg = parse_error({"models": [model(), model(name="b", batching={"max_rows": 0})]})
    assert msg == "config.yaml: models[1].batching.max_rows: must be > 0, got 0"


def test_replicas_zero():
    assert parse_error({"models": [model(replicas=0)]}) == "config.yaml: models[0].replicas: must be >= 1, got 0"


def test_wrong_type():
    assert parse_error({"models": [model(max_len="512")]}) == \
        "config.yaml: models[0].max_len: expected an integer, got a string '512'"
    assert "expected a boolean" in parse_error({"models": [model(normalize="yes")]})
    assert "expected an integer or 'auto', got a boolean" in parse_error({"models": [model(replicas=True)]})


def test_both_or_neither_source():
    both = parse_error({"models": [model(path="/m")]})
    assert "models[0]: model 'm': exactly one of `hf` or `path` must be set (both are set)" in both
    neither = parse_error({"models": [{"name": "m", "kind": "pii"}]})
    assert "models[0]: model 'm': exactly one of `hf` or `path` must be set (neither is set)" in neither


def test_unknown_kind():
    assert ("models[0].kind: must be one of embedding, rerank, zeroshot, classifier, pii, sparse, late_interaction, "
            "m3, image_text, tensor, got 'reranker' (did you mean 'rerank'?)") in \
        parse_error({"models": [model(kind="reranker")]})


def test_missing_kind_and_name():
    msg = parse_error({"models": [{"hf": "a/b"}]})
    assert "models[0].name: required key is missing" in msg
    assert "models[0].kind: required key is missing" in msg


def test_duplicate_model_name():
    assert "models[1].name: duplicate model name 'm' (also models[0])" in \
        parse_error({"models": [model(), model()]})


def test_duplicate_and_unknown_ep():
    msg = parse_error({"models": [model(eps=["cuda", "cpu", "cuda", "tpu"])]})
    assert "models[0].eps[2]: duplicate entry 'cuda'" in msg
    assert "models[0].eps[3]: must be one of cpu, cuda, tensorrt" in msg


def test_no_models():
    assert parse_error({"models": []}) == "config.yaml: models: config has no models"
    assert "models: required key is missing" in parse_error({"server": {}})


def test_bad_bind():
    assert "server.bind: must be host:port" in parse_error({"server": {"bind": "localhost"}, "models": [model()]})


def test_dtype_aliases_and_bad_dtype():
    cfg = parse_config({"models": [model(dtype="half")]})
    assert cfg.models[0].dtype == "fp16"
    assert "models[0].dtype: must be one of auto|fp32|fp16|int8, got 'bf16'" in \
        parse_error({"models": [model(dtype="bf16")]})


def test_pii_recognizers():
    assert parse_config({"models": [model(kind="pii", pii_recognizers=[])]}).models[0].options.pii_recognizers == ()
    assert "models[0].pii_recognizers[0]: must be one of email, url" in \
        parse_error({"models": [model(kind="pii", pii_recognizers=["fax"])]})


def test_threshold_range_and_template():
    assert "models[0].threshold: must be <= 1, got 1.5" in parse_error({"models": [model(kind="pii", threshold=1.5)]})
    assert "models[0].hypothesis_template: must contain {label} or {}" in \
        parse_error({"models": [model(kind="zeroshot", hypothesis_template="About.")]})
    # a family's key on a model of another kind names the family it belongs to, and a typo of a family key is
    # suggested from that family's keys
    assert "models[0].threshold: applies to kind pii only; model 'm' is kind embedding" in \
        parse_error({"models": [model(threshold=0.5)]})
    assert "models[0].poolng: unknown key (did you mean 'pooling'?)" in parse_error({"models": [model(poolng="cls")]})


def test_all_errors_reported_at_once():
    msg = parse_error({"models": [model(replicas=0, max_len=-1)]})
    assert msg.startswith("2 errors in config:")


def test_yaml_syntax_error_names_line(tmp_path):
    msg = error_of(tmp_path, "models:\n  - name: [unclosed\n")
    assert "config.yaml: line" in msg and "invalid YAML" in msg


def test_missing_file_and_toml(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="TOML configs are not supported"):
        load_config(write(tmp_path, "", "config.toml"))


def test_relative_path_is_relative_to_config(tmp_path):
    sub = tmp_path / "etc"
    sub.mkdir()
    cfg = load_config(write(sub, "models:\n  - {name: a, kind: pii, path: models/a}\n"))
    assert cfg.models[0].path == str(sub.resolve() / "models/a")


def test_rs_infer_config_boots_unchanged():
    """Every key of rs-infer's schema (both lineages) is accepted."""
    data = {
        "server": {"bind": "0.0.0.0:8080", "max_body_mb": 32, "request_timeout_ms": 120000, "max_queue": 256,
                   "queue_timeout_ms": 30000, "hf_cache_dir": "/var/cache/rsinfer", "threads": 0},
        "models": [
            {"name": "e5-small", "kind": "embedding", "hf": "Xenova/multilingual-e5-small", "revision": "main",
             "subfolder": "onnx", "file": "onnx/model.onnx", "dtype": "fp32", "tokenizer_hf": "intfloat/e5",
             "max_len": 512, "replicas": 2, "intra_threads": 0, "eps": ["tensorrt", "cuda", "cpu"],
             "default": True, "max_batch": 32, "ort_log_level": "error", "coreml_compute_units": "cpu_and_ne",
             "trt_engine_cache": "/tmp/trt", "device_id": 0, "openvino_device": "CPU", "pooling": "mean",
             "normalize": True, "dimensions": 256, "pooling_in_graph": False,
             "batching": {"enabled": True, "max_rows": 64, "max_tokens": 4096, "queue_rows": 1024}},
            {"name": "ms-marco", "kind": "rerank", "hf": "Xenova/ms-marco-MiniLM-L-6-v2", "scoring": "sigmoid"},
            {"name": "mnli", "kind": "zeroshot", "hf": "Xenova/nli-deberta-v3-xsmall",
             "hypothesis_template": "This example is {}.", "entailment_label": "entailment",
             "contradiction_label": "contradiction"},
            {"name": "pii", "kind": "pii", "path": "/models/pii", "threshold": 0.6},
        ],
    }
    cfg = parse_config(data)
    assert [m.name for m in cfg.models] == ["e5-small", "ms-marco", "mnli", "pii"]
    assert cfg.models[0].batching.max_tokens == 4096


def test_example_config_loads_and_documents_every_key():
    cfg = load_config(ROOT / "config.example.yaml")
    assert cfg.models, "the example serves models"
    text = (ROOT / "config.example.yaml").read_text()
    import dataclasses

    from rsinfer_cli import families
    from rsinfer_cli.config import BatchingConfig, ModelConfig, RateLimitConfig, ServerConfig, TracingConfig

    options = [c for c in (families.options_class(k) for k in families.kinds()) if c is not None]
    for cls in (ServerConfig, ModelConfig, BatchingConfig, RateLimitConfig, TracingConfig, *options):
        for f in dataclasses.fields(cls):
            if f.metadata.get("internal"):       # set by the parser, not written in YAML
                continue
            assert f"{f.name}:" in text, f"config.example.yaml does not document `{f.name}`"
    # every key line carries a comment
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and stripped.endswith(":") is False and ":" in stripped:
            assert "#" in line, f"undocumented line in config.example.yaml: {line!r}"
    assert yaml.safe_load(text)


def test_typo_fails_fast_with_exit_code_2(tmp_path):
    cfg = write(tmp_path, MINIMAL + "    replicaz: 2\n")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "rsinfer_cli", "inspect", "e5", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=30)
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 2, proc.stderr
    assert "models[0].replicaz: unknown key (did you mean 'replicas'?)" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert elapsed < 5  # generous for a loaded CI box; typically ~0.3 s


def test_max_batch_is_rs_infers_name_for_max_rows(caplog):
    cfg = parse_config({"models": [{"name": "a", "kind": "embedding", "hf": "o/a", "max_batch": 5},
                                   {"name": "b", "kind": "embedding", "hf": "o/b", "max_batch": 5,
                                    "batching": {"max_rows": 9}}]})
    assert cfg.models[0].batching.max_rows == 5  # the alias sets the one knob
    assert cfg.models[1].batching.max_rows == 9  # both given: max_rows wins, and the log says so
    assert "models[1].max_batch (5) is ignored" in caplog.text


def test_family_limits_are_model_keys_and_the_old_server_keys_still_read(caplog):
    """max_rerank_documents, max_candidate_labels and pii_hash_salt are their families' model keys; the server keys
    of the same names still work, as the default of every model of that family that sets none, with a deprecation
    line in the log."""
    cfg = parse_config({
        "server": {"max_rerank_documents": 20, "max_candidate_labels": 5, "pii_hash_salt": "s"},
        "models": [{"name": "r1", "kind": "rerank", "hf": "o/r1"},
                   {"name": "r2", "kind": "rerank", "hf": "o/r2", "max_rerank_documents": 7},
                   {"name": "z", "kind": "zeroshot", "hf": "o/z"},
                   {"name": "p", "kind": "pii", "hf": "o/p", "pii_hash_salt": "own"},
                   {"name": "e", "kind": "embedding", "hf": "o/e"}]})
    by = {m.name: m.options for m in cfg.models}
    assert (by["r1"].max_rerank_documents, by["r2"].max_rerank_documents) == (20, 7)   # the model's own wins
    assert by["z"].max_candidate_labels == 5
    assert by["p"].pii_hash_salt == "own"
    assert not hasattr(cfg.server, "max_rerank_documents")
    for key, kind in (("max_rerank_documents", "rerank"), ("max_candidate_labels", "zeroshot"),
                      ("pii_hash_salt", "pii")):
        assert f"server.{key} is deprecated: set `{key}` on each {kind} model" in caplog.text
    defaults = parse_config({"models": [{"name": "r", "kind": "rerank", "hf": "o/r"}]})
    assert defaults.models[0].options.max_rerank_documents == 1000


def test_a_bad_old_server_limit_names_its_key():
    with pytest.raises(ConfigError) as e:
        parse_config({"server": {"max_candidate_labels": 0},
                      "models": [{"name": "z", "kind": "zeroshot", "hf": "o/z", "max_rerank_documents": 3}]})
    assert "server.max_candidate_labels: must be > 0, got 0" in str(e.value)
    assert ("models[0].max_rerank_documents: applies to kind rerank, late_interaction and m3 only; model 'z' is kind "
            "zeroshot") in str(e.value)
