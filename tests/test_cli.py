"""The command line: start-up imports, exit codes, inspect/download, generated completions and man page."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import synth
from conftest import ROOT

# what no help screen needs; pydantic: typer 0.29 builds a pydantic adapter per option (+70 ms a subcommand's help)
HEAVY = ("onnxruntime", "numpy", "aiohttp", "tokenizers", "huggingface_hub", "prometheus_client", "pydantic",
         "ray", "pyspark", "pyarrow", "pandas")


def rsinfer(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rsinfer_cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("argv", [["--help"], ["--version"]] + [[c, "--help"] for c in (
    "serve", "inspect", "download", "embed", "rerank", "redact", "detect", "classify", "bench", "openapi", "batch",
    "sparse", "predict")])
def test_help_imports_nothing_heavy(argv):
    code = ("import sys\nfrom rsinfer_cli.cli.app import main\n"
            f"try:\n    main({argv!r})\nexcept SystemExit as e:\n    assert e.code in (0, None), e.code\n"
            f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})\n"
            "print('HEAVY=' + ','.join(heavy), file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY=\n" in proc.stderr or proc.stderr.rstrip().endswith("HEAVY="), proc.stderr


def test_engine_imports_no_transport():
    code = ("import sys\nimport rsinfer_cli.engine.registry, rsinfer_cli.engine.scheduler, "
            "rsinfer_cli.pipelines.embedding, rsinfer_cli.pipelines.pii, rsinfer_cli.pipelines.zeroshot, "
            "rsinfer_cli.pipelines.rerank, rsinfer_cli.hub\n"
            "bad = [m for m in ('aiohttp', 'typer', 'rich', 'prometheus_client') if m in sys.modules]\n"
            "assert not bad, bad\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_usage_error_exit_2():
    proc = rsinfer("inspect", "--bogus")
    assert proc.returncode == 2 and "No such option" in proc.stderr


def test_no_model_named_is_exit_2():
    proc = rsinfer("inspect")
    assert proc.returncode == 2
    assert "say which model" in proc.stderr and "Traceback" not in proc.stderr


def test_unknown_dtype_is_exit_2():
    proc = rsinfer("download", "org/x", "out", "--dtype", "bf3")
    assert proc.returncode == 2 and "Invalid value for '--dtype': 'bf3' is not one of 'auto', 'fp32'" in proc.stderr


@pytest.mark.shared
class TestInspectShared:
    def test_minilm(self, shared_models):
        proc = rsinfer("inspect", "--path", str(shared_models / "all-minilm-l6-v2"), "--json")
        assert proc.returncode == 0, proc.stderr
        rep = json.loads(proc.stdout)
        assert rep["graph"]["file"] == "onnx/model.onnx"
        assert [(i["name"], i["dtype"]) for i in rep["graph"]["inputs"]] == \
            [("input_ids", "int64"), ("attention_mask", "int64"), ("token_type_ids", "int64")]
        assert [o["name"] for o in rep["graph"]["outputs"]] == ["last_hidden_state"]
        assert rep["graph"]["outputs"][0]["shape"][-1] == 384
        assert rep["execution_providers"]["resolved"] == ["cpu"]
        assert rep["tokenizer"]["max_len"] == 256
        assert rep["pipeline"]["pooling"] == "mean" and rep["kind"] == "embedding"

    def test_minilm_int8(self, shared_models):
        proc = rsinfer("inspect", "--path", str(shared_models / "all-minilm-l6-v2"), "--json", "--dtype", "int8")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["graph"]["file"] == "onnx/model_quantized.onnx"

    def test_rampart_pii_picks_q4(self, shared_models):
        proc = rsinfer("inspect", "--path", str(shared_models / "rampart-pii"), "--json")
        assert proc.returncode == 0, proc.stderr
        rep = json.loads(proc.stdout)
        assert rep["graph"]["file"] == "onnx/model_q4.onnx"
        assert rep["kind"] == "pii"
        assert rep["graph"]["outputs"][0]["name"] == "logits"
        assert rep["graph"]["outputs"][0]["shape"][-1] == 35
        assert len(rep["pipeline"]["labels"]) == 35

    def test_table_for_people(self, shared_models, tmp_path):
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"models:\n  - {{name: mini, kind: embedding, path: {shared_models / 'all-minilm-l6-v2'}}}\n")
        proc = rsinfer("inspect", "mini", "--config", str(cfg), env={"COLUMNS": "200"})
        assert proc.returncode == 0, proc.stderr
        assert "onnx/model.onnx" in proc.stdout and "[batch_size, sequence_length, 384]" in proc.stdout


class TestDownloadCli:
    def test_download_prints_files_and_stub(self, fake_hub, tmp_path):
        root = synth.write_model_dir(tmp_path / "repo")
        fake_hub.add("org/emb", synth.dir_files(root))
        out = tmp_path / "out"
        env = {"HF_ENDPOINT": fake_hub.url, "HF_HOME": str(tmp_path / "home")}
        proc = rsinfer("download", "org/emb", str(out), env=env)
        assert proc.returncode == 0, proc.stderr
        assert f"downloaded org/emb@main into {out}" in proc.stdout
        assert re.search(r"onnx/model.onnx +[0-9.]+ (B|KiB)\n", proc.stdout), proc.stdout
        assert f"path: {out}" in proc.stdout
        again = rsinfer("download", "org/emb", str(out), "--json", env=env)
        assert all(not f["written"] for f in json.loads(again.stdout)["files"])
        assert json.loads(again.stdout)["kind"] == "embedding"      # the kind the stub names
        # the folder boots offline through the CLI
        offline = rsinfer("inspect", "--path", str(out), "--json",
                          env={**env, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"})
        assert offline.returncode == 0, offline.stderr
        assert json.loads(offline.stdout)["provenance"]["downloaded_from"]["repo"] == "org/emb"

    def test_missing_repo_is_exit_4(self, fake_hub, tmp_path):
        proc = rsinfer("download", "org/none", str(tmp_path / "o"), env={"HF_ENDPOINT": fake_hub.url})
        assert proc.returncode == 4
        assert "repository 'org/none' not found" in proc.stderr


class TestGenerated:
    def test_completions_and_man_are_current(self):
        from rsinfer_cli.cli.docgen import generated

        stale = [rel for rel, text in generated().items() if (ROOT / rel).read_text(encoding="utf-8") != text]
        assert not stale, f"regenerate with `make completions man docs-ref`: {stale}"

    def test_every_config_key_has_its_comment(self):
        """The configuration reference is made from the comments beside the dataclass fields: a key added
        without one fails here, so the reference never shows an empty row."""
        from rsinfer_cli.cli.docref import undocumented

        assert undocumented() == []

    def test_man_lists_every_command_option_and_exit_code(self):
        from rsinfer_cli.cli.app import EXIT_DOCS, app

        page = (ROOT / "man/rsinfer.1").read_text()
        for cmd in app.registered_commands:
            assert f'.SS "rsinfer {cmd.name}"' in page
        for opt in ("\\-\\-dtype", "\\-\\-tokenizer\\-hf", "\\-\\-json", "\\-\\-config"):
            assert opt in page
        for code in EXIT_DOCS:
            assert f".B {int(code)}\n" in page

    def test_rendered_man_page_and_reference_keep_examples_apart(self):
        """Rendered by groff as `man` would: every example command is a line of its own, `code` is set in bold
        (no literal backticks), an unset option shows no default; on the site, `--min-*/--max-*` is no emphasis."""
        from rsinfer_cli.cli.appspec import blocks, commands

        groff = shutil.which("groff")
        if groff is None:
            pytest.skip("groff is not installed")
        proc = subprocess.run([groff, "-man", "-Tutf8", "-rLL=200n", str(ROOT / "man/rsinfer.1")],
                              capture_output=True, text=True, timeout=30, env={**os.environ, "LC_ALL": "C.UTF-8"})
        assert proc.returncode == 0, proc.stderr
        page = re.sub(r".\x08", "", proc.stdout)             # overstrike bold/underline to plain text
        lines = {" ".join(line.split()) for line in page.splitlines()}
        examples = [cmd for c in commands() for kind, body in blocks(c.help) if kind == "code"
                    for cmd in body.splitlines()]
        assert len(examples) > 20
        missing = [cmd for cmd in examples if " ".join(cmd.split()) not in lines]
        assert not missing, missing
        assert "`" not in page and "(None, None)" not in page
        reference = (ROOT / "docs/reference/cli.md").read_text(encoding="utf-8")
        assert "--min-\\*/--max-\\*" in reference and "```sh\nrsinfer quantize models/minilm" in reference

    @pytest.mark.parametrize(("words", "expected"), [
        ("rsinfer ", None),  # every command
        ("rsinfer inspect --dt", {"--dtype"}),
        ("rsinfer inspect --dtype ", {"auto", "fp32", "f32", "float32", "fp16", "f16", "half", "float16", "int8", "q8",
                                      "quantized"}),
        ("rsinfer download org/x out --d", {"--dtype"}),
    ])
    def test_bash_completion_works(self, words, expected):
        script = ROOT / "completions/rsinfer.bash"
        cmd = (f"source {script}; COMP_WORDS=({words.strip()}{' ' + repr('') if words.endswith(' ') else ''}); "
               "COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _rsinfer; printf '%s\\n' \"${COMPREPLY[@]}\"")
        proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=10)
        assert proc.returncode == 0, proc.stderr
        if expected is None:
            from rsinfer_cli.cli.app import app

            expected = {c.name for c in app.registered_commands} | {"--help", "--version"}
        assert set(proc.stdout.split()) == expected

    @pytest.mark.parametrize(("shell", "file", "flag"), [("zsh", "_rsinfer", "-n"), ("fish", "rsinfer.fish", "-n")])
    def test_other_shells_parse(self, shell, file, flag):
        if shutil.which(shell) is None:
            require = f"RSINFER_REQUIRE_{shell.upper()}"
            if os.environ.get(require) == "1":
                pytest.fail(f"{shell} is not installed and {require}=1", pytrace=False)
            pytest.skip(f"{shell} is not installed")
        proc = subprocess.run([shell, flag, str(ROOT / "completions" / file)], capture_output=True, text=True,
                              timeout=10)
        assert proc.returncode == 0, proc.stderr

    def test_installed_with_the_package(self):
        text = (ROOT / "pyproject.toml").read_text()
        for rel in ("completions/rsinfer.bash", "completions/_rsinfer", "completions/rsinfer.fish",
                    "man/rsinfer.1"):
            assert f'"{rel}"' in text


def test_no_import_cycle_between_server_and_workers():
    """workers/ builds on server/ (front ends are aiohttp apps); server/ never imports workers/."""
    import ast

    for path in (ROOT / "src" / "rsinfer_cli" / "server").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and "workers" in node.module.split("."):
                raise AssertionError(f"{path.relative_to(ROOT)}:{node.lineno} imports {node.module}")
            if isinstance(node, ast.Import) and any("rsinfer_cli.workers" in a.name for a in node.names):
                raise AssertionError(f"{path.relative_to(ROOT)}:{node.lineno} imports the workers package")


def test_docs_cli_table_lists_every_command():
    """docs/cli.md's table is one Markdown table (no blank line inside it) with a row per command."""
    import re
    from pathlib import Path

    from rsinfer_cli.cli.app import app

    text = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text(encoding="utf-8")
    section = text.split("# The CLI", 1)[1].split("\n\n**(model options)**", 1)[0]
    rows = section.strip().splitlines()
    assert all(line.startswith("|") for line in rows), "a blank or stray line breaks the table"
    listed = {m.group(1) for line in rows if (m := re.match(r"\| `rsinfer ([\w-]+)", line))}
    commands = {c.name for c in app.registered_commands}
    assert listed == commands, (sorted(commands - listed), sorted(listed - commands))


class TestExitCodes:
    """One test per documented exit code (EXIT_DOCS, the table in the man page and docs/reference/cli.md), each
    through the command line; a code added without a case here fails test_every_code_has_a_case."""

    CASES = ("ok", "internal", "usage", "input", "hub", "model", "busy", "gate", "interrupted")

    def test_every_code_has_a_case(self):
        from rsinfer_cli.cli.app import EXIT_DOCS, ExitCode

        assert {ExitCode[c.upper()] if c not in ("ok", "internal", "hub") else
                {"ok": ExitCode.OK, "internal": ExitCode.ERROR, "hub": ExitCode.HUB}[c] for c in self.CASES} \
            == set(EXIT_DOCS)
        reference = (ROOT / "docs/reference/cli.md").read_text(encoding="utf-8")
        assert all(f"\n| {int(code)} | " in reference for code in EXIT_DOCS)
        assert "Exit codes: 0 ok" not in (ROOT / "docs/cli.md").read_text(encoding="utf-8")   # one table, generated

    @staticmethod
    def _model(tmp_path):
        return synth.write_model_dir(tmp_path / "m")

    def test_0_ok(self, tmp_path):
        proc = rsinfer("embed", "--path", str(self._model(tmp_path)), "hello")
        assert proc.returncode == 0 and json.loads(proc.stdout)["index"] == 0

    @staticmethod
    def _raised(exc, tmp_path, monkeypatch):
        """`rsinfer embed` whose model raises `exc` as it opens: the exit code main() maps it to."""
        from rsinfer_cli.cli import app

        def raises(*_a, **_k):
            raise exc

        monkeypatch.setattr("rsinfer_cli.cli.common.open_model", raises)
        with pytest.raises(SystemExit) as info:
            app.main(["embed", "--path", str(TestExitCodes._model(tmp_path)), "hello"])
        return info.value.code

    def test_1_internal_error(self, tmp_path, monkeypatch, capsys):
        assert self._raised(ZeroDivisionError("a bug"), tmp_path, monkeypatch) == 1
        assert "internal error: ZeroDivisionError: a bug (set RSINFER_DEBUG=1" in capsys.readouterr().err

    def test_2_usage(self):
        proc = rsinfer("embed", "--normalize/--no-normalize", "x")
        assert proc.returncode == 2 and "No such option" in proc.stderr

    def test_3_input(self, tmp_path):
        bad = tmp_path / "in.jsonl"
        bad.write_text('{"text": "a"}\n{"text": \n', encoding="utf-8")
        proc = rsinfer("embed", "--path", str(self._model(tmp_path)), "--input", str(bad))
        assert proc.returncode == 3 and "line 2" in proc.stderr

    @pytest.mark.parametrize("command", ["embed", "serve"])
    def test_4_model_files_unavailable(self, tmp_path, command):
        """The same missing folder is exit 4 for `serve` as for a one-shot command (serve said 5)."""
        cfg = tmp_path / "cfg.yaml"
        cfg.write_text(f"server: {{bind: '127.0.0.1:9'}}\nmodels:\n  - {{name: m, kind: embedding, "
                       f"path: '{tmp_path / 'gone'}'}}\n", encoding="utf-8")
        args = ["embed", "--config", str(cfg), "-m", "m", "x"] if command == "embed" else ["serve", "--config",
                                                                                             str(cfg)]
        proc = rsinfer(*args)
        assert proc.returncode == 4, proc.stderr
        assert "does not exist or is not a folder" in proc.stderr

    def test_5_model(self, tmp_path):
        folder = self._model(tmp_path)
        (folder / "onnx" / "model.onnx").write_bytes(b"not a graph")
        proc = rsinfer("embed", "--path", str(folder), "x")
        assert proc.returncode == 5 and "Traceback" not in proc.stderr

    def test_6_busy(self, tmp_path, monkeypatch, capsys):
        from rsinfer_cli.errors import Saturated

        assert self._raised(Saturated("model 'm' is saturated (queue full)"), tmp_path, monkeypatch) == 6
        assert "saturated" in capsys.readouterr().err

    def test_7_gate(self, tmp_path):
        import numpy as np
        import onnx
        from onnx import numpy_helper

        folder = self._model(tmp_path)
        graph = onnx.load(str(folder / "onnx" / "model.onnx"))
        table = numpy_helper.to_array(graph.graph.initializer[0])
        graph.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.roll(table, 1, axis=1), "table"))
        onnx.save(graph, str(folder / "onnx" / "other.onnx"))
        proc = rsinfer("bench", "--path", str(folder), "--compare", "onnx/model.onnx", "onnx/other.onnx",
                       "--min-cosine", "0.99", "--speed-seconds", "0", "--json")
        assert proc.returncode == 7, proc.stderr
        assert json.loads(proc.stdout)["gate"]["passed"] is False

    def test_130_interrupted(self, tmp_path):
        import signal

        proc = subprocess.Popen([sys.executable, "-m", "rsinfer_cli", "embed", "--path", str(self._model(tmp_path))],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "RSINFER_LOG_LEVEL": "INFO"})
        try:
            proc.stdin.write("first line\n")          # read before the model loads
            proc.stdin.flush()
            for _ in range(200):                      # the model is loaded; the command waits for stdin
                line = proc.stderr.readline()
                if not line or " loaded: " in line:
                    break
            proc.send_signal(signal.SIGINT)
            err = proc.communicate(timeout=30)[1]
        finally:
            proc.kill()
        assert proc.returncode == 130, err
