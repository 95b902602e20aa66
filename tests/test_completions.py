"""The shipped completions, exercised in bash, zsh and fish themselves: every word a shell offers after
`rsinfer CMD --` and after a choice option is one the CLI's parser accepts, and every option is offered."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

import pytest

from conftest import ROOT

COMPLETIONS = ROOT / "completions"


def _shell(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        require = f"RSINFER_REQUIRE_{name.upper()}"
        if os.environ.get(require) == "1":
            pytest.fail(f"{name} is not installed and {require}=1", pytrace=False)
        pytest.skip(f"{name} is not installed")
    return path


@functools.cache
def _click_commands() -> dict:
    import typer.main

    from rsinfer_cli.cli.app import app

    return typer.main.get_command(app).commands


def _lines() -> list[str]:
    """The command lines to complete: each command's options, and each choice option's values."""
    from rsinfer_cli.cli.appspec import commands

    lines = []
    for cmd in commands():
        lines.append(f"rsinfer {cmd.name} --")
        lines += [f"rsinfer {cmd.name} {p.opts[0]} " for p in cmd.params if p.choices]
    return lines


def _parse(cmd_name: str, words: list[str]) -> None:
    """Parse `words` (plus placeholders for what the command requires) as the CLI does: raises on a word the
    parser rejects ("No such option", a value not among the choices)."""
    cmd = _click_commands()[cmd_name]
    extra = []
    for p in cmd.params:
        if p.required and not any(w in getattr(p, "opts", ()) for w in words):
            extra += [p.opts[0], _value(p)] if p.param_type_name == "option" else ["x"]
    cmd.make_context(cmd_name, words + extra)


def _value(p) -> str:
    choices = getattr(p.type, "choices", None)
    return str(choices[0]) if choices else "1"


def _option(cmd_name: str, word: str):
    for p in _click_commands()[cmd_name].params:
        if word in getattr(p, "opts", ()) or word in getattr(p, "secondary_opts", ()):
            return p
    raise AssertionError(f"rsinfer {cmd_name}: the shell offers {word}, which the CLI does not have")


def _check(offered: dict[str, set[str]]) -> None:
    """Every offered word is accepted; `--` offers every long option; a choice option offers all its values."""
    for line, words in offered.items():
        _, cmd_name, *rest = line.split()
        if line.endswith("--"):
            p_words = {w for p in _click_commands()[cmd_name].params if p.param_type_name == "option"
                       for w in (*p.opts, *p.secondary_opts) if w.startswith("--")} | {"--help"}
            assert words == p_words, (line, words ^ p_words)
            for word in words - {"--help"}:
                p = _option(cmd_name, word)
                _parse(cmd_name, [word] if p.is_flag else [word] + [_value(p)] * p.nargs)
        else:
            p = _option(cmd_name, rest[0])
            assert words == {str(c) for c in p.type.choices}, (line, words)
            for value in words:
                _parse(cmd_name, [rest[0], value])


def _collect(output: str) -> dict[str, set[str]]:
    offered: dict[str, set[str]] = {}
    line = None
    for row in output.splitlines():
        if row.startswith("="):
            line = row[1:]
            offered[line] = set()
        elif row.strip() and line is not None:
            offered[line].add(row.split("\t")[0].strip())
    return offered


def test_the_choice_options_are_typed():
    """The completions read the values from the parser: each option that takes a known set is a Literal, and that
    set is what the code below it handles."""
    from rsinfer_cli.cli.appspec import commands
    from rsinfer_cli.config import DTYPE_ALIASES
    from rsinfer_cli.engine.quantize import OUTPUT_NAMES
    from rsinfer_cli.families import kinds
    from rsinfer_cli.pipelines.replacer import MODES

    choices = {(c.name, o): p.choices for c in commands() for p in c.params for o in p.opts}
    assert set(choices[("embed", "--dtype")]) == set(DTYPE_ALIASES)
    assert set(choices[("quantize", "--dtype")]) == {d for d, _ in OUTPUT_NAMES}   # no `auto`: quantize has none
    assert choices[("redact", "--mode")] == MODES
    assert choices[("inspect", "--kind")] == choices[("bench", "--kind")] == kinds()
    assert choices[("embed", "--format")] == ("auto", "lines", "jsonl")
    assert choices[("serve", "--log-format")] == ("text", "json")


def test_bash_offers_only_what_the_cli_accepts():
    bash = _shell("bash")
    script = ["source completions/rsinfer.bash"]
    for line in _lines():
        words = line.split() + ([""] if line.endswith(" ") else [])
        quoted = " ".join(f"'{w}'" for w in words)
        script += [f"echo '={line}'", f"COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; COMPREPLY=()",
                   "_rsinfer; printf '%s\\n' \"${COMPREPLY[@]}\""]
    proc = subprocess.run([bash, "-c", "\n".join(script)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    _check(_collect(proc.stdout))


def test_fish_offers_only_what_the_cli_accepts():
    fish = _shell("fish")
    script = ["source completions/rsinfer.fish"]
    script += [f"echo '={line}'; complete -C '{line}'" for line in _lines()]
    proc = subprocess.run([fish, "-N", "-c", "; ".join(script)], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    _check(_collect(proc.stdout))


def test_zsh_offers_only_what_the_cli_accepts():
    """zsh's own completion system (compinit, _arguments) run on a pseudo-terminal (tests/shells/capture.zsh)."""
    zsh = _shell("zsh")
    lines = _lines()
    proc = subprocess.run([zsh, "-f", str(ROOT / "tests/shells/capture.zsh"), str(COMPLETIONS), *lines],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    offered = _collect(proc.stdout)
    assert set(offered) == set(lines), "capture.zsh lost a line"
    # zsh offers `--opt` and `--opt=` forms of a value option: the word is the option either way
    _check({line: {w.rstrip("=") for w in words} for line, words in offered.items()})


def test_a_flag_pair_is_two_words_and_a_rejected_value_is_a_usage_error():
    """What the completions offered before: `--normalize/--no-normalize` as one word, `auto` for quantize --dtype."""
    from typer.testing import CliRunner

    from rsinfer_cli.cli.app import app

    for shipped in ("rsinfer.bash", "_rsinfer", "rsinfer.fish"):
        assert "normalize/" not in (COMPLETIONS / shipped).read_text()
    result = CliRunner().invoke(app, ["quantize", "some/folder", "--dtype", "auto"])
    assert result.exit_code == 2 and "--dtype" in result.output
    result = CliRunner().invoke(app, ["redact", "--mode", "scramble"])
    assert result.exit_code == 2 and "'scramble' is not one of" in result.output
