"""Every shell and Python example of the README and the docs site runs here, against a live `rsinfer serve` on
../shared/models, with the model names the examples use (EXAMPLES_CONFIG). A block whose text states its output
(`# → text`, alone on a line or after a statement) must print that text. A block that must not run says so on the
line above its fence, with the reason: `<!-- not run: starts the daemon and pulls models from the Hub -->`.

Blocks run from a scratch folder that holds what the examples name: `models/<name>` (links to the shared models),
`cfg.yaml` (this config), `../shared/models`, and small input files (`reviews.jsonl`, `records.jsonl`, ...).
`localhost:8080` and `127.0.0.1:8080` are rewritten to the live server's address, and `curl -s` gets
`--fail-with-body` (an HTTP error fails the block); nothing else is changed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from serverutil import ServeProcess, free_port

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "reference" not in p.parts)]
RUNS = ("sh", "bash", "python")
SKIP = re.compile(r"<!-- not run: (.+?) -->")
# a block of a client library rsinfer does not depend on runs in their venv (make clients-venv; docs/clients.md)
CLIENTS = re.compile(r"<!-- runs in \.venv-clients -->")

# the examples' model names → the shared models that stand in for them
MODELS = {"minilm": ("embedding", "all-minilm-l6-v2", {"default": True}),
          "e5": ("embedding", "tiny-st-prompts", {}),            # prompts query / document, 24 wide
          "ms-marco": ("rerank", "tiny-reranker-1", {}),
          "nli": ("zeroshot", "tiny-nli", {}), "pii": ("pii", "rampart-pii", {}),
          "sentiment": ("classifier", "tiny-textcls", {}),
          "splade": ("sparse", "tiny-splade", {}), "colbert": ("late_interaction", "tiny-colbert", {}),
          "m3": ("m3", "tiny-bge-m3", {}), "clip": ("image_text", "tiny-clip", {}),
          "adder": ("tensor", "tensor-models/add_one", {"max_batch_size": 8})}
INPUTS = {
    "reviews.jsonl": '{"body": "I love it"}\n{"body": "It broke after a day"}\n',
    "records.jsonl": '{"text": "Mail alex@example.com", "message": {"body": "Call +1 415 555 0100"}}\n',
    "docs.jsonl": '{"body": "hello world"}\n{"body": "second text"}\n',
    "lines.txt": "hello world\nsecond text\n",
}


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    code: str
    skip: str | None
    clients: bool = False

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def blocks() -> list[Block]:
    out = []
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            m = re.match(r"(\s*)```(\w*)\s*$", lines[i])
            if not m:
                i += 1
                continue
            indent, lang, start = m.group(1), m.group(2), i
            i += 1
            body = []
            while i < len(lines) and not re.match(r"\s*```\s*$", lines[i]):
                body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
                i += 1
            i += 1
            if lang in RUNS:
                above = lines[start - 1] if start else ""
                skip = SKIP.search(above)
                out.append(Block(str(page.relative_to(ROOT)), start + 1, lang, "\n".join(body) + "\n",
                                 skip.group(1) if skip else None, bool(CLIENTS.search(above))))
    return out


def expected(block: Block) -> list[str]:
    """What the text says the block prints: every `# → text`."""
    return [m.group(1).strip() for m in re.finditer(r"#\s*→\s*(.+)$", block.code, re.M)]


BLOCKS = blocks()


def test_examples_were_found_and_every_skip_says_why():
    assert len(BLOCKS) >= 20, [b.id for b in BLOCKS]
    assert all(b.skip.strip() for b in BLOCKS if b.skip is not None)
    assert any(expected(b) for b in BLOCKS if b.lang == "python")
    assert sum(b.skip is None for b in BLOCKS) > sum(b.skip is not None for b in BLOCKS)


@pytest.fixture(scope="module")
def live(shared_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("examples")
    work = root / "work"
    (work / "models").mkdir(parents=True)
    (root / "shared").mkdir()
    (root / "shared" / "models").symlink_to(shared_models)
    for name, (_, folder, _) in MODELS.items():
        (work / "models" / name).symlink_to(shared_models / folder)
    (work / "models" / "add_one").symlink_to(shared_models / "tensor-models" / "add_one")
    (work / "models" / "rampart-pii").symlink_to(shared_models / "rampart-pii")
    for name, text in INPUTS.items():
        (work / name).write_text(text)
    port, grpc_port = free_port(), free_port()
    config = {"server": {"bind": f"127.0.0.1:{port}", "grpc_bind": f"127.0.0.1:{grpc_port}"},
              "models": [{"name": n, "kind": k, "path": f"models/{n}", **extra}
                         for n, (k, _, extra) in MODELS.items()]}
    (work / "cfg.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    srv = ServeProcess(work / "cfg.yaml", port)
    try:
        srv.wait_ready(120)
        yield srv, work
    finally:
        srv.stop()


def _clients_python() -> str:
    python = Path(os.environ.get("RSINFER_CLIENTS_PYTHON") or ROOT / ".venv-clients" / "bin" / "python")
    if not python.exists():
        if os.environ.get("RSINFER_REQUIRE_CLIENTS") == "1":
            pytest.fail(f"{python} is missing (make clients-venv) and RSINFER_REQUIRE_CLIENTS=1", pytrace=False)
        pytest.skip(f"the client libraries' venv is missing: {python} (make clients-venv)")
    return str(python)


def _run(block: Block, url: str, work: Path) -> subprocess.CompletedProcess[str]:
    code = block.code.replace("localhost:8080", url).replace("127.0.0.1:8080", url)
    code = re.sub(r"\bcurl -s\b", "curl -s --fail-with-body", code)     # an HTTP error fails the block
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "NO_COLOR": "1", "RSINFER_CONFIG": str(work / "cfg.yaml")}
    python = _clients_python() if block.clients else sys.executable
    cmd = [python, "-c", code] if block.lang == "python" else ["bash", "-e", "-o", "pipefail", "-c", code]
    return subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.skip is None], ids=lambda b: b.id)
def test_example_runs(block, live):
    srv, work = live
    proc = _run(block, srv.url.removeprefix("http://"), work)
    assert proc.returncode == 0, f"{block.id} failed ({proc.returncode}):\n{block.code}\n{proc.stdout}\n{proc.stderr}"
    for text in expected(block):
        assert text in proc.stdout, f"{block.id}: the text says it prints {text!r}; it printed:\n{proc.stdout}"


def yaml_blocks() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in re.finditer(r"^```yaml\n(.*?)^```", text, re.M | re.S):
            line = text[:m.start()].count("\n") + 1
            out.append((f"{page.relative_to(ROOT)}:{line}", m.group(1)))
    return out


@pytest.mark.parametrize(("where", "text"), [b for b in yaml_blocks() if re.match(r"(models|server):", b[1], re.M)],
                         ids=lambda v: v if ":" in str(v)[:40] and "\n" not in str(v) else "")
def test_yaml_examples_are_valid_configs(where, text):
    """A YAML block that is a whole config (top-level `models:` or `server:`) passes rsinfer's config checks."""
    from rsinfer_cli.config import parse_config

    data = yaml.safe_load(text)
    data.setdefault("models", [{"name": "x", "kind": "embedding", "path": "x"}])
    parse_config(data)
