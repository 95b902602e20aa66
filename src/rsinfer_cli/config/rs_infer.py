"""rs-infer's spellings, read into rsinfer's schema. Its config is rsinfer's but for one key: a model's `max_batch`
(the rows of its direct path) is `batching.max_rows` here, the one rows-per-forward knob of every path."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from .schema import ModelConfig

log = logging.getLogger("rsinfer.config")


def fold_max_batch(m: ModelConfig, raw: Any, where: str, file: str) -> ModelConfig:
    """`max_batch` sets `batching.max_rows` when the entry does not; when both are set and differ, max_rows wins and
    the log says so."""
    if m.max_batch is None:
        return m
    batching = raw.get("batching") if isinstance(raw, dict) else None
    given = batching.get("max_rows") if isinstance(batching, dict) else None
    if given is None:
        return dataclasses.replace(m, batching=dataclasses.replace(m.batching, max_rows=m.max_batch))
    if given != m.max_batch:
        log.warning("%s: %s.max_batch (%d) is ignored: batching.max_rows (%d) sets the rows per forward on every "
                    "path", file, where, m.max_batch, given)
    return m
