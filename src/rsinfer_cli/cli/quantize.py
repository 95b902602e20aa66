"""Make an int8 or fp16 graph of a model (onnxruntime's quantizer and float16 converter, optionally its transformer
fusions first), written beside the original under the name `dtype:` picks, then check what it lost: the model's own
pipeline runs both graphs on the same texts and reports its family's measures and the speed ratio. Bars
(--min-cosine, --min-rho, ...) make a loss past them exit 7, for CI."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

import typer

from .common import JSON_OPT, Kind, flag_group, phases

EXAMPLES = """

Examples:

  rsinfer quantize models/minilm --dtype int8 --min-cosine 0.97

  rsinfer quantize models/ms-marco --dtype int8 --per-channel --optimize --min-rho 0.9 --json

  rsinfer quantize Xenova/all-MiniLM-L6-v2 --into models/minilm --dtype fp16
"""

QuantizeDtype = Literal["int8", "fp16", "fp32"]    # what engine/quantize.py converts to (OUTPUT_NAMES)


@dataclass(frozen=True)
class GateFlags:
    """The quality bars of `quantize` and `bench --compare`: each is one metric's floor or ceiling."""

    min_cosine: float | None = None
    min_recall: float | None = None
    min_rho: float | None = None
    min_agreement: float | None = None
    min_f1: float | None = None
    max_delta: float | None = None
    max_error: float | None = None


GATE_HELP = {
    "min_cosine": "Fail (exit 7) if an embedding's cosine to the original's falls below this for any text.",
    "min_recall": "Fail if the embeddings' top-10 neighbour recall over the texts falls below this.",
    "min_rho": "Fail if the mean over rerank queries of Spearman's rho between the two graphs' scores falls below "
               "this.",
    "min_agreement": "Fail if the share of texts (queries) with the same top label (document) falls below this.",
    "min_f1": "Fail if PII span F1 against the original graph's spans falls below this.",
    "max_delta": "Fail if any score (rerank, classifier, zero-shot) moves by more than this.",
    "max_error": "Fail if a tensor model's largest absolute output error passes this.",
}


# a command whose `gates: GateFlags` parameter stands for the --min-*/--max-* bars (quantize, bench --compare)
gate_command = flag_group("gates", GateFlags, tuple(
    (f.name, float, typer.Option(None, f"--{f.name.replace('_', '-')}", help=GATE_HELP[f.name]))
    for f in fields(GateFlags)))


GATES = GateFlags()
SPEED_OPT = typer.Option(1.0, "--speed-seconds", help="The check's timing: seconds per graph and batch size (1 and "
                                                      "32), two interleaved rounds; 0 skips it.")


@gate_command
def quantize_cmd(
    model: str = typer.Argument(..., help="A model folder, or a Hub repo id (downloaded first, into --into)."),
    dtype: QuantizeDtype = typer.Option(..., "--dtype", help="int8 (dynamic quantization) | fp16 (inputs and "
                                        "outputs stay float32) | fp32 (with --optimize: the fusions alone)."),
    per_channel: bool = typer.Option(None, "--per-channel/--per-tensor",
                                     help="int8: one scale per output channel (the default: on all-MiniLM-L6-v2 "
                                          "it keeps the mean cosine at 0.993 where one scale per tensor gives "
                                          "0.964, at the same speed) or one per tensor."),
    optimize: bool = typer.Option(False, "--optimize", help="Run onnxruntime's transformer fusions first."),
    out: Path = typer.Option(None, "--out", help="Write this .onnx file instead of the name `dtype:` picks beside "
                                                 "the graph."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a file at the output's name that rsinfer "
                                                              "quantize did not write (the folder's own "
                                                              "model_quantized.onnx): refused without it."),
    into: Path = typer.Option(None, "--into", help="For a Hub repo: the folder to download it into (default: "
                                                   "./<repo name>)."),
    kind: Kind = typer.Option(None, "--kind", help="The family whose pipeline checks the result (default: from "
                                                  "the folder)."),
    texts: Path = typer.Option(None, "--texts", help="Texts for the check, one per line (default: a built-in "
                                                     "corpus of 300 varied texts)."),
    check: bool = typer.Option(True, "--check/--no-check", help="Compare the new graph with the original."),
    speed_seconds: float = SPEED_OPT,
    gates: GateFlags = GATES,
    json_out: bool = JSON_OPT,
) -> None:
    from .. import families
    from ..engine.quantize import quantize, require_onnx
    from ..errors import ConfigError

    require_onnx()
    if kind is not None and kind not in families.kinds():      # before any work: a typo must not cost a conversion
        raise ConfigError(f"--kind must be one of {', '.join(families.kinds())}, got '{kind}'")
    folder, source = _source(model, into)
    per_channel = (dtype == "int8") if per_channel is None else per_channel
    with phases(1) as step:     # onnxruntime's converters report nothing: a spinner and the time it has taken
        step(f"converting {source.name} to {dtype}" + (" (fusions first)" if optimize else ""))
        done = quantize(source, dtype, per_channel=per_channel, optimize=optimize, out=out, overwrite=overwrite)
    result: dict[str, Any] = {"source": str(done.source), "output": str(done.output), "dtype": dtype,
                              "per_channel": per_channel, "optimized": optimize, "bytes": done.bytes,
                              "source_bytes": done.source_bytes}
    if not json_out:
        from .download import human_size

        typer.echo(f"wrote {done.output} ({human_size(done.bytes)}; the original {human_size(done.source_bytes)})")
    if check:
        with phases(3 if speed_seconds > 0 else 2) as step:
            report = compare_graphs(folder, source, done.output, kind, texts, speed_seconds, on_step=step)
        result["check"] = {"kind": report.kind, **report.metrics, **report.speed}
        finish(report, gates, result, json_out)
    elif json_out:
        from .common import print_json

        print_json(result)


def _source(model: str, into: Path | None) -> tuple[Path, Path]:
    """(the model folder, its fp32 graph): a folder as given, or a Hub repo downloaded into `into`."""
    from ..config import hub_cache_dir
    from ..errors import ConfigError
    from ..hub import ModelSource, download

    folder = Path(model)
    if not folder.is_dir():
        repo = model.removeprefix("hf:")
        if repo.count("/") != 1:
            raise ConfigError(f"MODEL '{model}' is neither a folder nor a Hub repo id (org/name)")
        folder = into or Path(repo.split("/")[1])
        download(ModelSource(hf=repo, needs_tokenizer=False, dtype="fp32"), folder, hub_cache_dir(), None)
    return folder, original_graph(folder)


def original_graph(folder: Path) -> Path:
    """The folder's own graph to convert: the resolver's fp32 choice among the graphs rsinfer quantize did not
    write (a folder that ships only model_q4.onnx keeps converting that, not an earlier output)."""
    from ..engine.quantize import OUTPUT_NAMES
    from ..errors import ConfigError
    from ..hub import DEFAULT_GRAPHS, ModelSource, resolve

    ours = set(OUTPUT_NAMES.values())
    found = [p for d in (folder, folder / "onnx") for p in sorted(d.glob("*.onnx")) if p.name not in ours]
    if not found:
        raise ConfigError(f"{folder}: no .onnx graph to convert (besides rsinfer quantize's own outputs)")
    rank = {name: i for i, name in enumerate(DEFAULT_GRAPHS)}
    best = min(found, key=lambda p: (rank.get(p.name, len(rank)), len(p.parts), p.name))
    rel = best.relative_to(folder).as_posix()
    return resolve(ModelSource(path=str(folder), needs_tokenizer=False, file=rel), None).graph_path


def compare_graphs(folder: Path, a: Path, b: Path, kind: str | None, texts: Path | None,
                   speed_seconds: float = 1.0, on_step: Any = None) -> Any:
    """The model's pipeline over graph a and graph b (files of `folder`) on the same texts."""
    import dataclasses

    from ..config import ModelConfig, ServerConfig
    from ..pipelines.quality import compare, corpus
    from .common import guess_source_kind
    from .io import read_texts

    name = folder.resolve().name
    if kind is None:
        kind = guess_source_kind(ModelConfig(name=name, kind="tensor", path=str(folder), replicas=1))[0]
    base = ModelConfig(name=name, kind=kind, path=str(folder), replicas=1)
    rel = [str(p.absolute().relative_to(folder.absolute())) if p.absolute().is_relative_to(folder.absolute())
           else str(p.absolute()) for p in (a, b)]     # symlinks not followed: the folder's own names
    chosen = read_texts(texts, "--texts") if texts is not None else corpus()
    return compare(dataclasses.replace(base, file=rel[0]), dataclasses.replace(base, file=rel[1]), ServerConfig(),
                   chosen, speed_seconds=speed_seconds, on_step=labelled(on_step, len(chosen), speed_seconds))


def labelled(on_step: Any, texts: int, speed_seconds: float) -> Any:
    """compare's phases as the progress line says them."""
    labels = {"loading": "loading both graphs", "checking": f"comparing the two graphs on {texts} texts",
              "timing": f"timing both graphs ({speed_seconds:g} s per batch size and round)"}
    return None if on_step is None else (lambda phase: on_step(labels.get(phase, phase)))


def finish(report: Any, gates: GateFlags, result: dict[str, Any], json_out: bool) -> None:
    """Print the report (a table, or JSON with `result`), then fail (exit 7) on any bar it misses."""
    from ..errors import ConfigError, QualityGateFailed
    from .common import print_json

    try:
        failed = report.failed({f.name: getattr(gates, f.name) for f in fields(GateFlags)})
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    result["gate"] = {"passed": not failed, "failed": failed}
    if json_out:
        print_json(result)
    else:
        _table(report)
    if failed:
        raise QualityGateFailed("quality gate failed: " + "; ".join(failed))


def _table(report: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"quality of the second graph against the first ({report.kind})", title_justify="left")
    t.add_column("measure")
    t.add_column("value", justify="right")
    for name, value in {**report.metrics, **report.speed}.items():
        t.add_row(name, f"{value:.4f}" if abs(value) < 100 else f"{value:.1f}")
    Console().print(t)


quantize_cmd.__doc__ = (__doc__ or "") + EXAMPLES
