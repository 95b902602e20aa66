"""Pipelines: sync numpy code that turns requests into rows, runs forwards, and post-processes results. Which
pipeline a model gets is its family's (see `rsinfer_cli.families`)."""

from __future__ import annotations

from typing import Any

from .. import families
from ..engine.model import LoadedModel
from .base import RowPipeline


def build_pipeline(model: LoadedModel) -> RowPipeline:
    """The pipeline of a loaded model's family, validated against the model now (a mismatch is a load error). It
    takes the model alone: a family's settings are its models' keys (`Family.options`), never the server's."""
    factory = families.get(model.kind).pipeline_factory()
    pipe = factory(model)
    if not isinstance(pipe, RowPipeline):
        raise TypeError(f"kind '{model.kind}': its pipeline factory made a {type(pipe).__name__}, not a RowPipeline")
    return pipe


def describe(model: LoadedModel) -> dict[str, Any]:
    """What the pipeline will do with this model (pooling, labels, scoring, signature), for `inspect` and
    /v1/models."""
    return build_pipeline(model).describe()
