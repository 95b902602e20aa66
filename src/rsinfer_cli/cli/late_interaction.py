"""ColBERT token vectors of texts from arguments, a file or stdin (lines or JSONL): JSONL in input order (streamed),
one unit vector per kept token, encoded as documents or (--query) as queries. To rerank with a ColBERT model by
MaxSim, use `rsinfer rerank` with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from .common import FIELD_OPT, FORMAT_OPT, INPUT_OPT, MODEL_FLAGS, Format, ModelFlags, model_command

EXAMPLES = """

Examples:

  rsinfer colbert --path models/colbert "To reset your password, open Settings."

  cat docs.jsonl | rsinfer colbert --config cfg.yaml --model colbert --field body > doc-vectors.jsonl

  rsinfer colbert --hf lightonai/colbertv2.0 --query "how do I reset my password?"

  rsinfer rerank --path models/colbert --query "reset password" --input docs.txt --table
"""


@model_command
def colbert_cmd(
    texts: list[str] = typer.Argument(None, help="Texts to encode (else --input or stdin)."),
    query: bool = typer.Option(False, "--query", help="Encode as queries ([Q] prefix, [MASK] expansion) instead of "
                                                      "documents."),
    input_: Path = INPUT_OPT,
    fmt: Format = FORMAT_OPT,
    field: str = FIELD_OPT,
    source: ModelFlags = MODEL_FLAGS,
    truncate: bool = typer.Option(None, "--truncate/--no-truncate",
                                  help="Cut texts over the query or document length (default: the model's "
                                       "`truncate`)."),
    batch_size: int = typer.Option(None, "--batch-size",
                                   help="Rows per forward (default: the model's batching.max_rows)."),
    prompt_name: str = typer.Option(None, "--prompt-name", help="A prompt of the model put before each text."),
) -> None:
    import sys

    from ..pipelines.late_interaction import LateInteractionPipeline, TokenVectorizer
    from .common import open_model
    from .io import chunks, read_records, write_jsonl

    records = read_records(texts, input_, fmt, field)
    model = open_model(LateInteractionPipeline.kind, source, max_rows=batch_size)
    pipe = model.pipeline
    assert isinstance(pipe, TokenVectorizer)
    pipe.prompt_text(prompt_name)        # an unknown prompt name fails before any text is read
    for chunk in chunks(records, model.chunk_rows):
        found = model.colbert([r.text for r in chunk], is_query=query, truncate=truncate, prompt_name=prompt_name)
        for rec, vectors in zip(chunk, found, strict=True):
            obj: dict[str, Any] = dict(rec.data) if rec.data is not None else {"text": rec.text}
            obj.update(index=rec.index, vectors=vectors)
            write_jsonl(obj)
        sys.stdout.flush()


colbert_cmd.__doc__ = (__doc__ or "") + EXAMPLES
