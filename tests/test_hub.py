"""Model resolution: the graph preference order, aux files, and the real huggingface_hub client against a
fake Hub on loopback (gating, revisions, external data, tokenizer_hf, download, offline boot)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rsinfer_cli.config import ModelConfig
from rsinfer_cli.errors import HubError, RepoAccessError
from rsinfer_cli.hub import ModelSource, download, pick_graph, resolve

import synth


def files(*names: str) -> frozenset[str]:
    return frozenset(names)


class TestPreferenceOrder:
    def test_prefers_root_fp32(self):
        assert pick_graph(files("model.onnx", "onnx/model.onnx"))[0] == "model.onnx"

    def test_falls_back_to_onnx_subfolder(self):
        assert pick_graph(files("onnx/model.onnx", "onnx/model_fp16.onnx"))[0] == "onnx/model.onnx"

    def test_quantized_only_repo_picks_quantized_before_q4(self):
        assert pick_graph(files("onnx/model_q4.onnx", "onnx/model_quantized.onnx"))[0] == "onnx/model_quantized.onnx"

    def test_q4_only_repo(self):
        assert pick_graph(files("onnx/model_q4.onnx", "tokenizer.json"))[0] == "onnx/model_q4.onnx"

    def test_candidate_before_folder(self):
        # model.onnx in onnx/ beats model_fp16.onnx at the root: each candidate is searched everywhere first
        assert pick_graph(files("model_fp16.onnx", "onnx/model.onnx"))[0] == "onnx/model.onnx"

    @pytest.mark.parametrize(("dtype", "expected"), [
        ("fp32", "onnx/model.onnx"),
        ("fp16", "onnx/model_fp16.onnx"),
        ("half", "onnx/model_fp16.onnx"),
        ("int8", "onnx/model_int8.onnx"),
        ("q8", "onnx/model_int8.onnx"),
        ("auto", "onnx/model.onnx"),
    ])
    def test_dtype_reorders(self, dtype, expected):
        repo = files("onnx/model.onnx", "onnx/model_fp16.onnx", "onnx/model_int8.onnx", "onnx/model_quantized.onnx")
        assert pick_graph(repo, dtype=dtype)[0] == expected

    def test_int8_prefers_quantized_over_fp32(self):
        assert pick_graph(files("onnx/model.onnx", "onnx/model_quantized.onnx"), dtype="int8")[0] == \
            "onnx/model_quantized.onnx"

    def test_fp16_falls_back_to_fp32_before_quantized(self):
        assert pick_graph(files("onnx/model.onnx", "onnx/model_quantized.onnx"), dtype="fp16")[0] == "onnx/model.onnx"

    def test_subfolder_searched_between_root_and_onnx(self):
        repo = files("sub/model.onnx", "onnx/model.onnx")
        assert pick_graph(repo, subfolder="sub")[0] == "sub/model.onnx"
        assert pick_graph(repo)[0] == "onnx/model.onnx"

    def test_explicit_file_wins(self):
        repo = files("model.onnx", "onnx/model_fp16.onnx")
        rel, why, cands = pick_graph(repo, file="onnx/model_fp16.onnx")
        assert rel == "onnx/model_fp16.onnx" and "pinned" in why and cands[0] == "onnx/model_fp16.onnx"
        assert pick_graph(repo, file="model_fp16.onnx")[0] == "onnx/model_fp16.onnx"

    def test_missing_pinned_file_is_an_error_listing_graphs(self):
        with pytest.raises(HubError, match=r"onnx/nope\.onnx.*model\.onnx"):
            pick_graph(files("model.onnx"), file="onnx/nope.onnx")

    def test_no_graph_is_an_error(self):
        with pytest.raises(HubError, match="no ONNX graph found.*graphs there: weird.onnx"):
            pick_graph(files("weird.onnx", "tokenizer.json"))

    def test_unknown_dtype(self):
        with pytest.raises(ValueError, match="unknown dtype 'bf8'"):
            pick_graph(files("model.onnx"), dtype="bf8")


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return synth.write_model_dir(tmp_path / "repo")


class TestLocalPath:
    def test_resolves_folder(self, model_dir: Path):
        r = resolve(ModelSource(path=str(model_dir)))
        assert r.graph_file == "onnx/model.onnx"
        assert r.source == f"path:{model_dir}"
        assert r.tokenizer_path == model_dir / "tokenizer.json"
        assert set(r.aux) == {"tokenizer.json", "config.json", "1_Pooling/config.json"}

    def test_missing_tokenizer_suggests_tokenizer_hf(self, model_dir: Path):
        (model_dir / "tokenizer.json").unlink()
        with pytest.raises(HubError, match="tokenizer.json not found.*tokenizer_hf"):
            resolve(ModelSource(path=str(model_dir)))

    def test_aux_files_found_in_onnx_folder(self, tmp_path: Path):
        root = synth.write_model_dir(tmp_path / "m", pooling=None)
        (root / "tokenizer.json").rename(root / "onnx" / "tokenizer.json")
        r = resolve(ModelSource(path=str(root)))
        assert r.aux_origin["tokenizer.json"].endswith(":onnx/tokenizer.json")

    def test_missing_folder(self, tmp_path: Path):
        with pytest.raises(HubError, match="does not exist"):
            resolve(ModelSource(path=str(tmp_path / "nope")))


def publish(hub, repo_id: str, root: Path, **kw):
    return hub.add(repo_id, synth.dir_files(root), **kw)


class TestFakeHub:
    def test_resolve_downloads_into_cache_with_provenance(self, fake_hub, model_dir, tmp_path):
        repo = publish(fake_hub, "org/emb", model_dir)
        r = resolve(ModelSource(hf="org/emb"), cache_dir=tmp_path / "cache")
        assert r.graph_file == "onnx/model.onnx"
        assert r.commit == repo.commits["main"]
        assert r.source == "hf:org/emb@main"
        assert r.graph_path.read_bytes() == (model_dir / "onnx/model.onnx").read_bytes()
        assert tmp_path / "cache" in r.graph_path.parents
        # the first call lists the repo, as rs-infer's `honors_hf_endpoint_and_token_env` pins
        assert fake_hub.requests[0][:2] == ("GET", "/api/models/org/emb/revision/main")

    def test_external_data_fetched_beside_graph_and_loadable(self, fake_hub, tmp_path):
        from rsinfer_cli.engine.model import load_model

        root = synth.write_model_dir(tmp_path / "ext", external_data=True)
        assert (root / "onnx" / "model.onnx_data").is_file()
        publish(fake_hub, "org/ext", root)
        cfg = ModelConfig(name="ext", kind="embedding", hf="org/ext", replicas=1)
        model = load_model(cfg, cache_dir=tmp_path / "cache")  # ORT reads the weights from beside the graph
        assert model.resolved.external_data == ("onnx/model.onnx_data",)
        assert (model.resolved.graph_path.parent / "model.onnx_data").is_file()

    def test_revision_selects_other_files(self, fake_hub, model_dir, tmp_path):
        v1 = synth.dir_files(model_dir)
        v1["onnx/model_fp16.onnx"] = v1.pop("onnx/model.onnx")
        repo = publish(fake_hub, "org/rev", model_dir, revisions={"v1": v1})
        r = resolve(ModelSource(hf="org/rev", revision="v1"), cache_dir=tmp_path / "c")
        assert r.graph_file == "onnx/model_fp16.onnx"
        assert r.commit == repo.commits["v1"] != repo.commits["main"]
        assert r.source == "hf:org/rev@v1"

    def test_unknown_revision(self, fake_hub, model_dir, tmp_path):
        publish(fake_hub, "org/rev", model_dir)
        with pytest.raises(HubError, match="revision 'v9' not found"):
            resolve(ModelSource(hf="org/rev", revision="v9"), cache_dir=tmp_path / "c")

    def test_unknown_repo(self, fake_hub, tmp_path):
        with pytest.raises(RepoAccessError, match="'org/missing' not found, gated, or private.*HF_TOKEN"):
            resolve(ModelSource(hf="org/missing"), cache_dir=tmp_path / "c")

    def test_tokenizer_hf_supplies_missing_tokenizer(self, fake_hub, model_dir, tmp_path):
        onnx_only = {k: v for k, v in synth.dir_files(model_dir).items() if k.startswith("onnx/")}
        fake_hub.add("org/onnx-only", onnx_only)
        publish(fake_hub, "org/tok", model_dir)
        with pytest.raises(HubError, match="tokenizer_hf"):
            resolve(ModelSource(hf="org/onnx-only"), cache_dir=tmp_path / "c")
        r = resolve(ModelSource(hf="org/onnx-only", tokenizer_hf="org/tok"), cache_dir=tmp_path / "c")
        assert r.source == "hf:org/onnx-only@main+aux:org/tok"
        assert r.aux_origin["tokenizer.json"] == "org/tok:tokenizer.json"
        assert r.aux_origin["1_Pooling/config.json"] == "org/tok:1_Pooling/config.json"

    def test_gated_repo_needs_token(self, fake_hub, model_dir, tmp_path, monkeypatch):
        publish(fake_hub, "org/gated", model_dir, gated_token="hf_secret")
        with pytest.raises(RepoAccessError, match="gated.*HF_TOKEN"):
            resolve(ModelSource(hf="org/gated"), cache_dir=tmp_path / "c")
        monkeypatch.setenv("HF_TOKEN", "hf_wrong")
        with pytest.raises(RepoAccessError, match="refused"):
            resolve(ModelSource(hf="org/gated"), cache_dir=tmp_path / "c2")
        monkeypatch.setenv("HF_TOKEN", "hf_secret")
        r = resolve(ModelSource(hf="org/gated"), cache_dir=tmp_path / "c3")
        assert r.graph_path.is_file()
        assert ("GET", "/api/models/org/gated/revision/main", "Bearer hf_secret") in fake_hub.requests

    def test_offline_uses_cache_only(self, fake_hub, model_dir, tmp_path, monkeypatch):
        publish(fake_hub, "org/emb", model_dir)
        first = resolve(ModelSource(hf="org/emb"), cache_dir=tmp_path / "c")
        fake_hub.stop()
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        again = resolve(ModelSource(hf="org/emb"), cache_dir=tmp_path / "c")
        assert again.graph_path.read_bytes() == first.graph_path.read_bytes()
        assert again.commit == first.commit
        with pytest.raises(HubError, match="not in the HF cache.*HF_HUB_OFFLINE.*rsinfer download"):
            resolve(ModelSource(hf="org/other"), cache_dir=tmp_path / "c")

    def test_unreachable_hub_falls_back_to_cache(self, fake_hub, model_dir, tmp_path, caplog):
        publish(fake_hub, "org/emb", model_dir)
        resolve(ModelSource(hf="org/emb"), cache_dir=tmp_path / "c")
        fake_hub.stop()
        again = resolve(ModelSource(hf="org/emb"), cache_dir=tmp_path / "c")
        assert again.graph_path.is_file()
        assert "cannot reach the Hub" in caplog.text


class TestDownload:
    def test_download_then_offline_boot(self, fake_hub, model_dir, tmp_path, monkeypatch):
        from rsinfer_cli.engine.model import load_model

        # aux files in a subfolder land at the root of the output, so `path:` finds them with no options
        files_ = synth.dir_files(model_dir)
        files_ = {("sub/" + k if not k.startswith("onnx/") else k): v for k, v in files_.items()}
        repo = fake_hub.add("org/emb", files_)
        out = tmp_path / "out"
        result = download(ModelSource(hf="org/emb", subfolder="sub"), out, cache_dir=tmp_path / "cache")
        assert {p for p, _, _ in result.files} == {"onnx/model.onnx", "tokenizer.json", "config.json",
                                                   "1_Pooling/config.json"}
        prov = json.loads((out / "rsinfer-source.json").read_text())
        assert prov["repo"] == "org/emb" and prov["commit"] == repo.commits["main"]
        fake_hub.stop()
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
        model = load_model(ModelConfig(name="m", kind="embedding", path=str(out), replicas=1))
        assert model.resolved.graph_file == "onnx/model.onnx"
        assert model.resolved.origin["repo"] == "org/emb"

    def test_download_is_idempotent(self, fake_hub, model_dir, tmp_path):
        publish(fake_hub, "org/emb", model_dir)
        out = tmp_path / "out"
        first = download(ModelSource(hf="org/emb"), out, cache_dir=tmp_path / "cache")
        assert all(written for _, _, written in first.files)
        mtimes = {p: (out / p).stat().st_mtime_ns for p, _, _ in first.files}
        second = download(ModelSource(hf="org/emb"), out, cache_dir=tmp_path / "cache")
        assert not any(written for _, _, written in second.files)
        assert mtimes == {p: (out / p).stat().st_mtime_ns for p, _, _ in second.files}

    def test_downloaded_files_are_readable_by_a_service_user(self, fake_hub, model_dir):
        """Files as a plain write makes them (0666 less the umask), not mkstemp's 0600: a folder copied for an
        air-gapped host is read by the service's own user (as `nobody` where this runs as root)."""
        import shutil
        import stat
        import subprocess
        import tempfile

        publish(fake_hub, "org/emb", model_dir)
        root = Path(tempfile.mkdtemp(prefix="rsinfer-mode-"))
        try:
            root.chmod(0o755)
            old = os.umask(0o022)
            try:
                result = download(ModelSource(hf="org/emb"), root / "out", cache_dir=root / "cache")
            finally:
                os.umask(old)
            for rel, _, _ in result.files:
                assert stat.S_IMODE((root / "out" / rel).stat().st_mode) == 0o644, rel
            if os.geteuid() == 0 and shutil.which("runuser"):
                for p in (root / "out").rglob("*"):
                    if p.is_dir():
                        p.chmod(0o755)      # the folders as a copy for the host would make them
                run = subprocess.run(["runuser", "-u", "nobody", "--", "cat", str(root / "out" / "config.json")],
                                     capture_output=True, timeout=30)
                assert run.returncode == 0, run.stderr
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def test_download_with_external_data(self, fake_hub, tmp_path):
        root = synth.write_model_dir(tmp_path / "ext", external_data=True)
        publish(fake_hub, "org/ext", root)
        out = tmp_path / "out"
        download(ModelSource(hf="org/ext"), out, cache_dir=tmp_path / "cache")
        assert (out / "onnx/model.onnx_data").read_bytes() == (root / "onnx/model.onnx_data").read_bytes()

    @pytest.mark.parametrize("evil", ["onnx/model.onnx_data/../../../escape", "onnx/model.onnx_data/../../x"])
    def test_refuses_file_names_that_escape(self, fake_hub, model_dir, tmp_path, evil):
        files_ = synth.dir_files(model_dir)
        files_[evil] = b"pwned"
        fake_hub.add("org/evil", files_)
        out = tmp_path / "deep" / "out"
        with pytest.raises(HubError, match="escape"):
            download(ModelSource(hf="org/evil"), out, cache_dir=tmp_path / "cache")
        assert not (tmp_path / "escape").exists() and not (tmp_path / "deep" / "x").exists()

    def test_refuses_pinned_file_outside(self, fake_hub, model_dir, tmp_path):
        publish(fake_hub, "org/emb", model_dir)
        with pytest.raises(HubError):
            download(ModelSource(hf="org/emb", file="../../etc/model.onnx"), tmp_path / "o", tmp_path / "c")


class Recorder:
    """A hub.Progress that remembers what it was told."""

    def __init__(self) -> None:
        self.started: dict[str, int | None] = {}
        self.bytes: dict[str, int] = {}
        self.finished: list[str] = []

    def start(self, name, total):
        self.started[name] = total

    def advance(self, name, n):
        self.bytes[name] = self.bytes.get(name, 0) + n

    def done(self, name):
        self.finished.append(name)


def test_download_reports_byte_progress(fake_hub, model_dir, tmp_path):
    publish(fake_hub, "org/emb", model_dir)
    rec = Recorder()
    download(ModelSource(hf="org/emb"), tmp_path / "out", cache_dir=tmp_path / "cache", progress=rec)
    size = (model_dir / "onnx/model.onnx").stat().st_size
    assert rec.started["onnx/model.onnx"] == size
    assert rec.bytes["onnx/model.onnx"] == size
    assert "onnx/model.onnx" in rec.finished


def test_server_hf_cache_dir_is_used(fake_hub, model_dir, tmp_path):
    from rsinfer_cli.config import parse_config
    from rsinfer_cli.engine.registry import Registry

    publish(fake_hub, "org/emb", model_dir)
    cfg = parse_config({"server": {"hf_cache_dir": str(tmp_path / "cache")},
                        "models": [{"name": "e", "kind": "embedding", "hf": "org/emb", "replicas": 1}]})
    reg = Registry.load(cfg)
    assert (tmp_path / "cache" / "hf") in reg.models["e"].resolved.graph_path.parents
