"""Images through a CLIP or SigLIP model (`kind: image_text`): their vectors as JSONL (or a .npy), and zero-shot
image classification as a table or JSONL. Images are files, or folders of them (their files in name order)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from .common import MODEL_FLAGS, ModelFlags, model_command

EXAMPLES = """

Examples:

  rsinfer embed-images --hf Xenova/clip-vit-base-patch32 photos/ > vectors.jsonl

  rsinfer classify-image --path models/clip --labels cat,dog,car photo.jpg
"""
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif")


def image_files(paths: list[Path]) -> list[Path]:
    """The files named, a folder's image files in name order (ConfigError for a path that is neither)."""
    from ..errors import ConfigError

    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out += sorted(f for f in p.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
        elif p.is_file():
            out.append(p)
        else:
            raise ConfigError(f"{p}: no such file or folder")
    if not out:
        raise ConfigError("no images given (files, or folders holding .png, .jpg, .webp or .gif files)")
    return out


@model_command
def embed_images_cmd(
    images: list[Path] = typer.Argument(..., help="Image files, or folders of them."),
    output: Path = typer.Option(None, "--output", "-o", help="Write a float32 .npy [n, dim] instead of JSONL."),
    normalize: bool = typer.Option(True, "--normalize/--no-normalize",
                                   help="Unit-length vectors (else transformers' get_image_features as it is)."),
    batch: int = typer.Option(64, "--batch", help="Images read and embedded together (memory stays bounded)."),
    source: ModelFlags = MODEL_FLAGS,
) -> None:
    embed_images(images, output, normalize, batch, source)


def embed_images(images: list[Path], output: Path | None, normalize: bool, batch: int, source: ModelFlags) -> None:
    """The images' vectors as JSONL lines in name order, or into a .npy (`rsinfer embed-images`, `embed --images`)."""
    from ..errors import ConfigError
    from ..pipelines.image_text import ImageTextPipeline
    from .common import open_model
    from .io import NpyWriter, check_writable, write_jsonl

    files = image_files(images)
    if output is not None:
        if output.suffix != ".npy":
            raise ConfigError(f"--output must end in .npy, got '{output}'")
        check_writable(output, "--output")
    model = open_model(ImageTextPipeline.kind, source)
    writer = None
    for at in range(0, len(files), max(1, batch)):
        chunk = files[at:at + max(1, batch)]
        vectors = model.embed_images([f.read_bytes() for f in chunk], normalize=normalize)
        if output is not None:
            writer = writer or NpyWriter(output, vectors.shape[1])
            writer.write(vectors)
            continue
        for k, (f, vec) in enumerate(zip(chunk, vectors, strict=True)):
            write_jsonl({"index": at + k, "image": str(f), "embedding": vec})
        sys.stdout.flush()
    if output is not None:
        writer = writer or NpyWriter(output, 0)
        writer.close()
        print(f"wrote {writer.rows} x {writer.dim} float32 to {output}", file=sys.stderr)


@model_command
def classify_image_cmd(
    images: list[Path] = typer.Argument(..., help="Image files, or folders of them."),
    labels: str = typer.Option(..., "--labels", help="Candidate labels, comma-separated."),
    template: str = typer.Option(None, "--template", help="The label's prompt, {} for the label (default: the "
                                                          "model's zero_shot_template)."),
    table: bool = typer.Option(False, "--table", help="A table of each image's best labels, for people."),
    source: ModelFlags = MODEL_FLAGS,
) -> None:
    from ..errors import ConfigError
    from ..pipelines.image_text import ImageTextPipeline
    from .common import open_model
    from .io import write_jsonl

    names = [x.strip() for x in labels.split(",") if x.strip()]
    if not names:
        raise ConfigError("--labels: name at least one label")
    files = image_files(images)
    model = open_model(ImageTextPipeline.kind, source)
    rows: list[tuple[Path, list[Any]]] = []
    for at in range(0, len(files), 64):
        chunk = files[at:at + 64]
        for k, (f, ranked) in enumerate(zip(chunk, model.classify_image([f.read_bytes() for f in chunk], names,
                                                                        template=template), strict=True)):
            if table:
                rows.append((f, ranked))
                continue
            write_jsonl({"index": at + k, "image": str(f), "labels": [lb.label for lb in ranked],
                         "scores": [lb.score for lb in ranked]})
        sys.stdout.flush()
    if table:
        _table(rows)


def _table(rows: list[tuple[Path, list[Any]]]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    t = Table()
    for col in ("image", "best labels"):
        t.add_column(col)
    for f, ranked in rows:
        t.add_row(escape(f.name), escape(", ".join(f"{lb.label} {lb.score:.3f}" for lb in ranked[:3])))
    Console().print(t)


embed_images_cmd.__doc__ = "Image vectors from a CLIP or SigLIP model: JSONL {index, image, embedding}, or a .npy." \
    + EXAMPLES
classify_image_cmd.__doc__ = ("Zero-shot image classification (CLIP's softmax, SigLIP's sigmoid): JSONL {index, image, "
                              "labels, scores} best first, or a table.") + EXAMPLES
