"""Texts → one row of logits each (the graph's first output, [batch, labels]), divided by `temperature`."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rsinfer_cli.config import opt
from rsinfer_cli.engine.model import LoadedModel
from rsinfer_cli.pipelines.base import LOGIT_OUTPUTS, Array, Timed, Timing, Work, pick_output, stack
from rsinfer_cli.pipelines.text import TextPipeline


@dataclass(frozen=True)
class LogitsOptions:
    temperature: float = opt(1.0, gt=0)     # models[i].temperature, validated by rsinfer with its key path


@dataclass
class Logits(Timed):
    rows: list[list[float]]
    timing: Timing


class LogitsPipeline(TextPipeline):
    kind = "logits"

    def __init__(self, model: LoadedModel) -> None:
        super().__init__(model)
        self.output = pick_output(model, LOGIT_OUTPUTS)
        self.temperature = model.config.options.temperature

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "output": self.output, "temperature": self.temperature}

    def reduce(self, out: Array, mask: Array) -> Array:
        return np.asarray(out, dtype=np.float64).reshape(out.shape[0], -1)

    def plan(self, texts: Sequence[str], truncate: bool | None = None) -> Work[Logits]:
        timing = Timing()
        t0 = time.perf_counter()
        enc = self.encoder.encode(texts, truncate=truncate)
        timing.tokenize_s = time.perf_counter() - t0

        def finish(rows: list[Any]) -> Logits:
            width = len(rows[0]) if rows else 0
            return Logits((stack(rows, width) / self.temperature).tolist(), timing)

        return self.work(enc, finish, timing)
