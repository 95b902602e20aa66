"""rsinfer as a Python library: `load` a model once, call the methods named after the CLI's commands.

    import rsinfer_cli

    with rsinfer_cli.load(path="models/minilm") as model:
        vectors = model.embed(["first text", "second text"])        # float32 [2, 384]

    pii = rsinfer_cli.load(hf="org/pii-model", pii_regions=["US", "GB"])
    clean = [r.text for r in pii.redact(texts, mode="replace")]

The same engine as `rsinfer serve` and the one-shot commands (which are built on this API): the same vectors,
scores and redactions, byte for byte. Importing this module loads nothing heavy; `load` imports ONNX Runtime.
Errors are `rsinfer_cli.errors` types: ConfigError (which model, its keys), ModelLoadError, InputError (texts,
options) — each names the key or item at fault.
"""

from __future__ import annotations

import os
from typing import Any

from .model import Label, Model, Ranked, RedactedText, SparseVector

__all__ = ["Label", "Model", "Ranked", "RedactedText", "SparseVector", "load"]


def load(path: str | os.PathLike[str] | None = None, *, hf: str | None = None,
         config: str | os.PathLike[str] | None = None, model: str | None = None, revision: str = "main",
         dtype: str = "auto", kind: str | None = None, threads: int | None = None, batch_size: int | None = None,
         **model_keys: Any) -> Model:
    """Load one model for in-process use.

    Which model: a folder (`path`, a Hub-repo layout or `rsinfer download` output), a Hub repo (`hf`, at
    `revision`; the Hub cache and HF_HUB_OFFLINE apply), or a config entry (`config` and `model`; `model` may be
    left out when the config has one model).
    kind: the family of a folder or repo (default: what its files say, as `rsinfer inspect` does).
    dtype: the graph's precision when the folder has several (auto, fp32, fp16, int8).
    threads: ONNX Runtime intra-op threads (default: every CPU this process may use — its affinity mask and cgroup
      quota; give the CPUs a Ray actor or Spark task holds).
    batch_size: rows per forward (default: the model's batching.max_rows).
    model_keys: any key of a model entry in the config (`max_len`, `truncate`, ...) or of its family (`pooling`,
      `pii_regions`, `pii_threshold`, ...), as `config.example.yaml` documents them; an unknown key is an error.
    """
    from pathlib import Path

    from .loading import Source

    source = Source(name=model, config=Path(config) if config is not None else None,
                    path=Path(path) if path is not None else None, hf=hf, revision=revision, dtype=dtype, kind=kind,
                    max_rows=batch_size, threads=threads, keys=tuple(model_keys.items()))
    return Model(source.load(None))
