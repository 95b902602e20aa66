"""Score documents against a query with a cross-encoder, or by MaxSim with a ColBERT model (any model whose family
serves rerank); JSONL sorted by score, or a table."""

from __future__ import annotations

from pathlib import Path

import typer

from .common import FIELD_OPT, FORMAT_OPT, INPUT_OPT, MODEL_FLAGS, Format, ModelFlags, model_command

EXAMPLES = """

Examples:

  rsinfer rerank --path models/ms-marco --query "capital of France" "Paris is ..." "Berlin is ..."

  rsinfer rerank --config cfg.yaml --model ms-marco -q "refund policy" --input docs.jsonl --field body --top-n 5
"""


@model_command
def rerank_cmd(
    documents: list[str] = typer.Argument(None, help="Documents to score (else --input or stdin)."),
    query: str = typer.Option(..., "--query", "-q", help="The query every document is scored against."),
    input_: Path = INPUT_OPT,
    fmt: Format = FORMAT_OPT,
    field: str = FIELD_OPT,
    top_n: int = typer.Option(None, "--top-n", help="Keep the N best documents."),
    raw: bool = typer.Option(False, "--raw", help="Raw logits instead of scores in (0, 1)."),
    table: bool = typer.Option(False, "--table", help="A table for people instead of JSONL."),
    source: ModelFlags = MODEL_FLAGS,
    truncate: bool = typer.Option(None, "--truncate/--no-truncate",
                                  help="Cut pairs over max_len (default: the model's `truncate`)."),
) -> None:
    from ..errors import ConfigError
    from ..pipelines.rerank import Reranker
    from .common import open_model
    from .io import read_records, write_jsonl

    if top_n is not None and top_n < 0:
        raise ConfigError(f"--top-n must be >= 0, got {top_n}")
    records = list(read_records(documents, input_, fmt, field))  # ranking needs every document
    model = open_model(Reranker.kind, source)
    pipe = model.pipeline
    assert isinstance(pipe, Reranker)
    order = model.rerank(query, [r.text for r in records], top_n=top_n, raw=raw, truncate=truncate)
    if table:
        from rich.console import Console
        from rich.table import Table

        t = Table(title=f"{query}  ({pipe.rule(raw)})", title_justify="left")
        for col, justify in (("rank", "right"), ("index", "right"), ("score", "right"), ("document", "left")):
            t.add_column(col, justify=justify)  # type: ignore[arg-type]
        for rank, r in enumerate(order, start=1):
            text = records[r.index].text
            t.add_row(str(rank), str(r.index), f"{r.score:.4f}", text if len(text) < 100 else text[:97] + "...")
        Console().print(t)
        return
    for r in order:
        rec = records[r.index]
        write_jsonl({"index": r.index, "score": r.score, **(rec.data if rec.data is not None else {"text": rec.text})})


rerank_cmd.__doc__ = (__doc__ or "") + EXAMPLES
