"""Pipelines: sync numpy code that turns items into rows, runs forwards, and post-processes results."""

from __future__ import annotations

from typing import Any


def build_pipeline(model: Any, server: Any = None) -> Any:
    """The pipeline object for a loaded model's kind (validated at load time); `server` supplies
    server-wide settings (the PII hash salt)."""
    if model.kind == "embedding":
        from .embed import EmbeddingPipeline

        return EmbeddingPipeline(model)
    if model.kind == "rerank":
        from .rerank import RerankPipeline

        return RerankPipeline(model)
    if model.kind == "pii":
        from .pii import PiiPipeline

        return PiiPipeline(model, getattr(server, "pii_hash_salt", None))
    if model.kind == "zeroshot":
        from .nli import NliPipeline

        return NliPipeline(model)
    return None


def describe(model: Any) -> dict[str, Any]:
    """What the pipeline will do with this model (pooling, labels, scoring), for `inspect` and /v1/models."""
    pipe = build_pipeline(model)
    if pipe is not None:
        return pipe.describe()
    info: dict[str, Any] = {"kind": model.kind}
    labels = model.hf_config.get("id2label")
    if isinstance(labels, dict):
        info["labels"] = [labels[k] for k in sorted(labels, key=lambda k: int(k))]
    return info
