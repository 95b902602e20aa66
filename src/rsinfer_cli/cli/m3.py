"""BGE-M3 outputs of texts from arguments, a file or stdin (lines or JSONL): JSONL in input order (streamed), each
text with what was asked of its dense vector, lexical weights and ColBERT vectors, from one forward, as
FlagEmbedding's `BGEM3FlagModel.encode` gives them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from .common import FIELD_OPT, FORMAT_OPT, INPUT_OPT, MODEL_FLAGS, Format, ModelFlags, model_command

EXAMPLES = """

Examples:

  rsinfer m3 --hf BAAI/bge-m3 --sparse --colbert "what is BGE-M3?"

  cat docs.jsonl | rsinfer m3 --config cfg.yaml --model m3 --field body --no-dense --sparse > lexical.jsonl
"""


@model_command
def m3_cmd(
    texts: list[str] = typer.Argument(None, help="Texts to encode (else --input or stdin)."),
    input_: Path = INPUT_OPT,
    fmt: Format = FORMAT_OPT,
    field: str = FIELD_OPT,
    dense: bool = typer.Option(True, "--dense/--no-dense", help="The dense vector (`dense_vecs`)."),
    sparse: bool = typer.Option(False, "--sparse", help="The lexical weights by token id (`lexical_weights`)."),
    colbert: bool = typer.Option(False, "--colbert", help="The ColBERT vectors (`colbert_vecs`)."),
    source: ModelFlags = MODEL_FLAGS,
    truncate: bool = typer.Option(None, "--truncate/--no-truncate",
                                  help="Cut texts over max_len (default: the model's `truncate`)."),
    batch_size: int = typer.Option(None, "--batch-size",
                                   help="Rows per forward (default: the model's batching.max_rows)."),
) -> None:
    import sys

    from ..errors import ConfigError
    from ..pipelines.m3 import M3Pipeline
    from .common import open_model
    from .io import chunks, read_records, write_jsonl

    if not (dense or sparse or colbert):
        raise ConfigError("ask for at least one of --dense, --sparse, --colbert")
    records = read_records(texts, input_, fmt, field)
    model = open_model(M3Pipeline.kind, source, max_rows=batch_size)
    for chunk in chunks(records, model.chunk_rows):
        got = model.m3([r.text for r in chunk], dense=dense, sparse=sparse, colbert=colbert, truncate=truncate)
        for k, rec in enumerate(chunk):
            obj: dict[str, Any] = dict(rec.data) if rec.data is not None else {"text": rec.text}
            obj["index"] = rec.index
            obj.update({key: values[k] for key, values in got.items()})
            write_jsonl(obj)
        sys.stdout.flush()


m3_cmd.__doc__ = (__doc__ or "") + EXAMPLES
