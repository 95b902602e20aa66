"""Embed texts from arguments, a file or stdin (lines or JSONL) → JSONL on stdout, or a .npy file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import typer

from .common import (
    COLUMN_OPT,
    ERROR_COLUMN_OPT,
    FIELD_OPT,
    FORMAT_OPT,
    INPUT_OPT,
    MODEL_FLAGS,
    Format,
    ModelFlags,
    model_command,
)

Precision = Literal["float32", "int8", "uint8", "binary", "ubinary"]   # pipelines/outtypes.py's TYPES

if TYPE_CHECKING:
    from collections.abc import Iterator

    from .io import Record

EXAMPLES = """

Examples:

  rsinfer embed --path models/minilm "first text" "second text"

  cat docs.jsonl | rsinfer embed --config cfg.yaml --model minilm --field body > vectors.jsonl

  rsinfer embed --hf Xenova/all-MiniLM-L6-v2 --input lines.txt --output vectors.npy

  rsinfer embed --path models/e5 --prompt-name query "how do I reset my password?"

  rsinfer embed --path models/minilm --input docs.parquet --column body --output vectors.parquet
"""


@model_command
def embed_cmd(
    texts: list[str] = typer.Argument(None, help="Texts to embed (else --input or stdin)."),
    input_: Path = INPUT_OPT,
    fmt: Format = FORMAT_OPT,
    field: str = FIELD_OPT,
    output: Path = typer.Option(None, "--output", "-o", help="Write a float32 .npy [n, dim] instead of JSONL; with a "
                                ".parquet or .csv --input: .parquet, .csv or .jsonl (every column kept, `embedding` "
                                "added)."),
    column: str = COLUMN_OPT,
    error_column: str = ERROR_COLUMN_OPT,
    source: ModelFlags = MODEL_FLAGS,
    dimensions: int = typer.Option(None, "--dimensions", help="Keep the first N dimensions, re-normalised."),
    normalize: bool = typer.Option(None, "--normalize/--no-normalize",
                                   help="L2-normalise the vectors (default: as the model says: a sentence-transformers"
                                        " folder when its modules end in Normalize, any other folder always)."),
    truncate: bool = typer.Option(None, "--truncate/--no-truncate",
                                  help="Cut texts over max_len (default: the model's `truncate`)."),
    batch_size: int = typer.Option(None, "--batch-size",
                                   help="Rows per forward (default: the model's batching.max_rows)."),
    prompt_name: str = typer.Option(None, "--prompt-name",
                                    help="A prompt of the model put before each text, e.g. query (default: the "
                                         "model's default prompt)."),
    prompt: str = typer.Option(None, "--prompt", help="Text put before each text instead of a named prompt "
                                                      "('' for none)."),
    images: list[Path] = typer.Option(None, "--images", help="Image files or folders (a CLIP or SigLIP model): "
                                      "their vectors instead of texts', as `rsinfer embed-images`."),
    precision: Precision = typer.Option("float32", "--precision",
                                        help="float32, or int8, uint8, binary, ubinary vectors as "
                                             "sentence-transformers' quantize_embeddings makes them (the model's "
                                             "ranges: [-1, 1] or its quantization_calibration); a .npy --output holds "
                                             "that dtype."),
) -> None:
    from ..errors import ConfigError
    from ..pipelines.embedding import Embedder, EmbeddingPipeline
    from .common import open_model, table_job
    from .io import check_writable, read_records
    from .tables import table_command, wants_table

    if images:
        if texts or input_ is not None:
            raise ConfigError("--images embeds images: give no texts or --input with it")
        from .image_text import embed_images

        embed_images(images, output, normalize is not False, 64, source)
        return
    options = {"dimensions": dimensions, "normalize": normalize, "truncate": truncate, "prompt_name": prompt_name,
               "prompt": prompt}
    if precision != "float32":
        options["precision"] = precision
    if wants_table(input_, output):
        if precision != "float32":
            raise ConfigError("--precision applies to JSONL and .npy output; a table's `embedding` column is float32")
        table_command(EmbeddingPipeline.kind, source, table_job("embed", options, column, field, error_column),
                      input_, output, batch_size)
        return
    if output is not None and output.suffix != ".npy":
        raise ConfigError(f"--output must end in .npy (or, with a .parquet or .csv --input, .parquet, .csv or "
                          f".jsonl), got '{output}'")
    if output is not None:
        check_writable(output, "--output")  # before loading any model
    records = read_records(texts, input_, fmt, field)
    first = next(records, None)  # validate the input before loading the model
    model = open_model(EmbeddingPipeline.kind, source, max_rows=batch_size)
    pipe = model.pipeline
    assert isinstance(pipe, Embedder)
    pipe.check_dimensions(dimensions)       # a bad --dimensions or prompt name fails before any text is read
    pipe.prompt_text(prompt_name, prompt)

    def all_records() -> Iterator[Record]:
        if first is not None:
            yield first
        yield from records

    _write(model, all_records(), output, options)


def _write(model: Any, records: Iterator[Record], output: Path | None, options: dict[str, Any]) -> None:
    """The records' vectors as JSONL lines (each record's fields kept) or into a .npy; a bad line stops the run
    after the rows before it are written (the .npy closed with them)."""
    import sys

    from ..errors import InputError
    from .io import NpyWriter, chunks, write_jsonl

    writer = None
    try:
        for chunk in chunks(records, model.chunk_rows):
            vectors = model.embed([r.text for r in chunk], **options)
            if output is not None:
                if writer is None:
                    writer = NpyWriter(output, vectors.shape[1], vectors.dtype.str)
                writer.write(vectors)
                continue
            for r, vec in zip(chunk, vectors, strict=True):
                obj = dict(r.data) if r.data is not None else {}
                obj.update(index=r.index, embedding=vec)
                write_jsonl(obj)
            sys.stdout.flush()
    except InputError:
        if writer is not None:  # a bad line: the rows before it are written, as in JSONL
            writer.close()
            print(f"wrote {writer.rows} x {writer.dim} {writer.dtype_name} to {output} (before the bad line)",
                  file=sys.stderr)
        raise
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    if output is not None:
        if writer is None:
            dim = options.get("dimensions") or model.pipeline.dim
            width = dim if isinstance(dim, int) else 0
            packed = options.get("precision") in ("binary", "ubinary")
            writer = NpyWriter(output, -(-width // 8) if packed else width,
                               {"int8": "|i1", "binary": "|i1", "uint8": "|u1", "ubinary": "|u1"}.get(
                                   options.get("precision", ""), "<f4"))
        writer.close()
        print(f"wrote {writer.rows} x {writer.dim} {writer.dtype_name} to {output}", file=sys.stderr)


embed_cmd.__doc__ = (__doc__ or "") + EXAMPLES
