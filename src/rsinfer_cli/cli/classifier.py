"""Classify texts with a sequence classifier (sentiment, intent, toxicity, language ID): every label's score per
text, best first; JSONL in input order (streamed), or a table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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

EXAMPLES = """

Examples:

  rsinfer predict --path models/sentiment "I love it" "It broke after a day"

  rsinfer predict --config cfg.yaml --model intent --input tickets.jsonl --field body --top-k 1
"""


@model_command
def predict_cmd(
    texts: list[str] = typer.Argument(None, help="Texts to classify (else --input or stdin)."),
    top_k: int = typer.Option(None, "--top-k", help="Keep the K best labels per text (default: every label)."),
    raw: bool = typer.Option(False, "--raw", help="Raw logits instead of scores."),
    function: str = typer.Option(None, "--function",
                                 help="sigmoid | softmax | none (default: the model's function_to_apply)."),
    input_: Path = INPUT_OPT,
    fmt: Format = FORMAT_OPT,
    field: str = FIELD_OPT,
    table: bool = typer.Option(False, "--table", help="A table for people instead of JSONL."),
    output: Path = TABLE_OUTPUT_OPT,
    column: str = COLUMN_OPT,
    error_column: str = ERROR_COLUMN_OPT,
    batch_size: int = typer.Option(None, "--batch-size",
                                   help="Texts per forward (default: the model's batching.max_rows)."),
    source: ModelFlags = MODEL_FLAGS,
    truncate: bool = typer.Option(None, "--truncate/--no-truncate",
                                  help="Cut texts over max_len (default: the model's `truncate`)."),
) -> None:
    import sys

    from ..errors import ConfigError, InputError
    from ..pipelines.classifier import ClassifierPipeline, check_function
    from .common import open_model
    from .io import chunks, read_records, write_jsonl
    from .tables import table_command, wants_table

    if top_k is not None and top_k < 1:
        raise ConfigError(f"--top-k must be >= 1, got {top_k}")
    try:
        chosen = check_function(function, "--function")
    except InputError as exc:
        raise ConfigError(str(exc).replace("`", "")) from None
    if wants_table(input_, output):
        from .common import table_job

        job = table_job("predict", {"top_k": top_k, "raw": raw, "function": chosen, "truncate": truncate}, column,
                        field, error_column)
        table_command(ClassifierPipeline.kind, source, job, input_, output, batch_size)
        return
    records = read_records(texts, input_, fmt, field)
    model = open_model(ClassifierPipeline.kind, source, max_rows=batch_size)
    rows = []
    for chunk in chunks(records, model.chunk_rows):
        found = model.predict([r.text for r in chunk], raw=raw, function=chosen, top_k=top_k, truncate=truncate)
        for rec, labels in zip(chunk, ([x._asdict() for x in r] for r in found), strict=True):
            if table:
                rows.append((rec, labels))
            else:
                write_jsonl({"index": rec.index, "labels": labels,
                             **(rec.data if rec.data is not None else {"text": rec.text})})
        sys.stdout.flush()
    if table:
        _table(rows)


def _table(rows: list[tuple[Any, list[dict[str, Any]]]]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    t = Table()
    for col, justify in (("index", "right"), ("text", "left"), ("label", "left"), ("score", "right"),
                         ("others", "left")):
        t.add_column(col, justify=justify)  # type: ignore[arg-type]
    for rec, labels in rows:
        text = rec.text if len(rec.text) < 80 else rec.text[:77] + "..."
        best: dict[str, Any] = labels[0] if labels else {"label": "", "score": float("nan")}
        others = ", ".join(f"{x['label']} {x['score']:.3f}" for x in labels[1:])
        t.add_row(str(rec.index), escape(text), escape(str(best["label"])), f"{best['score']:.4f}", escape(others))
    Console().print(t)


predict_cmd.__doc__ = (__doc__ or "") + EXAMPLES
