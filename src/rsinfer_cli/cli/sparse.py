"""Sparse (SPLADE) vectors of texts from arguments, a file or stdin (lines or JSONL): JSONL in input order
(streamed) with each text's non-zero weights by vocabulary id, or a table of each text's top tokens."""

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

  rsinfer sparse --path models/splade "how do I reset my password?"

  cat docs.jsonl | rsinfer sparse --config cfg.yaml --model splade --field body --top-k 256 > sparse.jsonl

  rsinfer sparse --hf naver/splade-v3 --tokens --table "the capital of France"
"""


@model_command
def sparse_cmd(
    texts: list[str] = typer.Argument(None, help="Texts to encode (else --input or stdin)."),
    input_: Path = INPUT_OPT,
    fmt: Format = FORMAT_OPT,
    field: str = FIELD_OPT,
    top_k: int = typer.Option(None, "--top-k", help="Keep the K largest weights per text (default: all, or the "
                                                    "model's max_active_dims)."),
    tokens: bool = typer.Option(False, "--tokens", help="Add each index's vocabulary token (`tokens`)."),
    table: bool = typer.Option(False, "--table", help="A table of each text's top tokens, for people."),
    output: Path = TABLE_OUTPUT_OPT,
    column: str = COLUMN_OPT,
    error_column: str = ERROR_COLUMN_OPT,
    source: ModelFlags = MODEL_FLAGS,
    truncate: bool = typer.Option(None, "--truncate/--no-truncate",
                                  help="Cut texts over max_len (default: the model's `truncate`)."),
    batch_size: int = typer.Option(None, "--batch-size",
                                   help="Rows per forward (default: the model's batching.max_rows; the model's "
                                        "max_logits_mb caps it too)."),
    prompt_name: str = typer.Option(None, "--prompt-name",
                                    help="A prompt of the model put before each text (default: the model's default "
                                         "prompt)."),
) -> None:
    import sys

    import numpy as np

    from ..errors import ConfigError
    from ..pipelines.sparse import SparseEncoder, SparsePipeline
    from .common import open_model
    from .io import chunks, read_records, write_jsonl
    from .tables import table_command, wants_table

    if top_k is not None and top_k < 1:
        raise ConfigError(f"--top-k must be >= 1, got {top_k}")
    if wants_table(input_, output):
        from .common import table_job

        job = table_job("sparse", {"top_k": top_k, "truncate": truncate, "prompt_name": prompt_name}, column, field,
                        error_column)
        table_command(SparsePipeline.kind, source, job, input_, output, batch_size)
        return
    records = read_records(texts, input_, fmt, field)
    model = open_model(SparsePipeline.kind, source, max_rows=batch_size)
    pipe = model.pipeline
    assert isinstance(pipe, SparseEncoder)
    pipe.prompt_text(prompt_name)        # an unknown prompt name fails before any text is read
    rows: list[tuple[Any, list[tuple[str, float]]]] = []
    for chunk in chunks(records, model.chunk_rows):
        vectors = model.sparse([r.text for r in chunk], top_k=top_k, truncate=truncate, prompt_name=prompt_name)
        for rec, (ids, values) in zip(chunk, vectors, strict=True):
            if table:
                order = np.argsort(-values, kind="stable")[:8]   # sentence-transformers' `decode`: by weight
                rows.append((rec, list(zip(model.tokens(ids[order]), values[order].tolist(), strict=True))))
                continue
            obj: dict[str, Any] = dict(rec.data) if rec.data is not None else {"text": rec.text}
            obj.update(index=rec.index, indices=ids, values=values)
            if tokens:
                obj["tokens"] = model.tokens(ids)
            write_jsonl(obj)
        sys.stdout.flush()
    if table:
        _table(rows)


def _table(rows: list[tuple[Any, list[tuple[str, float]]]]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    t = Table()
    for col, justify in (("index", "right"), ("text", "left"), ("top tokens", "left")):
        t.add_column(col, justify=justify)  # type: ignore[arg-type]
    for rec, top in rows:
        text = rec.text if len(rec.text) < 60 else rec.text[:57] + "..."
        t.add_row(str(rec.index), escape(text), escape(", ".join(f"{tok} {w:.2f}" for tok, w in top)))
    Console().print(t)


sparse_cmd.__doc__ = (__doc__ or "") + EXAMPLES
