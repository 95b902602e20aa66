"""Zero-shot (`--labels`) or true/false (`--question` / `--assertion`) classification of texts with an NLI model."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from .common import (
    COLUMN_OPT,
    ERROR_COLUMN_OPT,
    FIELD_OPT,
    FORMAT_OPT,
    INPUT_OPT,
    MODEL_FLAGS,
    TABLE_OUTPUT_OPT,
    Format,
    ModelFlags,
    model_command,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    from .io import Record

EXAMPLES = """

Examples:

  rsinfer classify --config cfg.yaml --model nli --labels billing,shipping,other --input tickets.jsonl

  rsinfer classify --path models/nli --question "Is this email urgent?" "The server is down!" "Lunch at noon?"
"""


@model_command
def classify_cmd(
    texts: list[str] = typer.Argument(None, help="Texts to classify (else --input or stdin)."),
    labels: str = typer.Option(None, "--labels", "-l", help="Zero-shot: candidate labels, comma-separated."),
    multi_label: bool = typer.Option(False, "--multi-label", help="Score each label on its own."),
    template: str = typer.Option(None, "--template", help="Hypothesis template with {label} (model default)."),
    question: str = typer.Option(None, "--question", help="True/false: a yes/no question about each text."),
    assertion: str = typer.Option(None, "--assertion", help="True/false: the statement to judge (beats --question)."),
    threshold: float = typer.Option(0.5, "--threshold", help="True/false: is_true when P(true) >= this."),
    input_: Path = INPUT_OPT,
    fmt: Format = FORMAT_OPT,
    field: str = FIELD_OPT,
    table: bool = typer.Option(False, "--table", help="A table for people instead of JSONL."),
    output: Path = TABLE_OUTPUT_OPT,
    column: str = COLUMN_OPT,
    error_column: str = ERROR_COLUMN_OPT,
    batch_size: int = typer.Option(None, "--batch-size",
                                   help="Pairs per forward (default: the model's batching.max_rows)."),
    source: ModelFlags = MODEL_FLAGS,
) -> None:
    import sys

    from ..pipelines.zeroshot import ZeroShotPipeline
    from .common import open_model
    from .io import chunks, read_records, write_jsonl
    from .tables import table_command, wants_table

    label_list, judged = _task(labels, question, assertion, template, threshold)
    zero_shot = judged is None
    if wants_table(input_, output):
        from .common import table_job

        options = ({"labels": label_list, "multi_label": multi_label, "template": template} if zero_shot else
                   {"assertion": judged, "threshold": threshold})
        table_command(ZeroShotPipeline.kind, source, table_job("classify", options, column, field, error_column),
                      input_, output, batch_size)
        return
    records = read_records(texts, input_, fmt, field)
    first = next(records, None)
    model = open_model(ZeroShotPipeline.kind, source, max_rows=batch_size)
    rows = []

    def all_records() -> Iterator[Record]:
        if first is not None:
            yield first
        yield from records

    per_chunk = max(256 // max(len(label_list), 1), 8)
    for chunk in chunks(all_records(), per_chunk):
        batch = [r.text for r in chunk]
        if judged is None:
            outs = [{"labels": r.labels, "scores": r.scores} for r in
                    model.classify(batch, label_list, multi_label=multi_label, template=template)]
        else:
            outs = [r.to_json() for r in model.classify(batch, assertion=judged, threshold=threshold)]
        for rec, out in zip(chunk, outs, strict=True):
            if table:
                rows.append((rec, out))
            else:
                write_jsonl({"index": rec.index, **out, **(rec.data if rec.data is not None else {"text": rec.text})})
        sys.stdout.flush()
    if table:
        _table(rows, zero_shot, judged)


def _task(labels: str | None, question: str | None, assertion: str | None, template: str | None,
          threshold: float) -> tuple[list[str], str | None]:
    """The options checked: (the candidate labels, None) for zero-shot, ([], the assertion) for true/false."""
    from ..errors import ConfigError, InputError
    from ..pipelines.zeroshot import assertion_for

    zero_shot = labels is not None
    if zero_shot == (question is not None or assertion is not None):
        raise ConfigError("give either --labels (zero-shot) or --question / --assertion (true/false)")
    if template is not None and "{label}" not in template and "{}" not in template:
        raise ConfigError("--template must contain {label} or {}")
    if not 0.0 <= threshold <= 1.0:
        raise ConfigError(f"--threshold must be between 0 and 1, got {threshold}")
    if labels is not None:
        label_list = [x.strip() for x in labels.split(",") if x.strip()]
        if not label_list:
            raise ConfigError("--labels is empty")
        return label_list, None
    try:
        return [], assertion_for(question, assertion)
    except InputError as exc:
        raise ConfigError(f"--question: {exc}") from None


def _table(rows: list[tuple[Record, dict[str, Any]]], zero_shot: bool, judged: str | None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=None if zero_shot else f"assertion: {judged}", title_justify="left")
    t.add_column("index", justify="right")
    t.add_column("text")
    if zero_shot:
        t.add_column("best")
        t.add_column("scores")
    else:
        t.add_column("label")
        t.add_column("P(true)", justify="right")
    for rec, out in rows:
        text = rec.text if len(rec.text) < 80 else rec.text[:77] + "..."
        if zero_shot:
            scores = ", ".join(f"{label} {s:.3f}" for label, s in zip(out["labels"], out["scores"], strict=True))
            t.add_row(str(rec.index), escape(text), escape(out["labels"][0]), escape(scores))
        else:
            t.add_row(str(rec.index), escape(text), out["label"], f"{out['true_probability']:.3f}")
    Console().print(t)


classify_cmd.__doc__ = (__doc__ or "") + EXAMPLES
