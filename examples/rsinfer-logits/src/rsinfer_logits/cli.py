"""Raw logits of texts, one JSON line each (example plug-in)."""

from __future__ import annotations

from pathlib import Path

import typer

from rsinfer_cli.cli.common import FIELD_OPT, FORMAT_OPT, INPUT_OPT, MODEL_FLAGS, ModelFlags, model_command


@model_command      # `source` is --model/--config/--path/--hf/--revision/--dtype, as in rsinfer's own commands
def logits_cmd(
    texts: list[str] = typer.Argument(None, help="Texts (else --input or stdin)."),
    input_: Path = INPUT_OPT,
    fmt: str = FORMAT_OPT,
    field: str = FIELD_OPT,
    source: ModelFlags = MODEL_FLAGS,
) -> None:
    from rsinfer_cli.cli.common import load_pipeline
    from rsinfer_cli.cli.io import read_records, write_jsonl

    from .pipeline import LogitsPipeline

    records = list(read_records(texts, input_, fmt, field))
    shot = load_pipeline(LogitsPipeline, **source.options())  # one model's runtime
    for rec, row in zip(records, shot.run(shot.pipe.plan, [r.text for r in records]).rows, strict=True):
        write_jsonl({"index": rec.index, "logits": row})
