"""`kind: tensor`: any ONNX graph, no tokenizer. Rows are dicts of named arrays along dim 0; the pipeline
concatenates them into feeds and splits each output back per row. Its routes (KServe v2) are not built yet;
`inspect` and `bench` use it already."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..engine.model import sample_feeds
from ..engine.session import Session
from .base import Array, RowPipeline

TensorRow = dict[str, Array]


class TensorPipeline(RowPipeline):
    kind = "tensor"

    def describe(self) -> dict[str, Any]:
        g = self.model.graph
        return {"kind": "tensor", "inputs": [t.to_json() for t in g.inputs],
                "outputs": [t.to_json() for t in g.outputs]}

    def forward(self, session: Session, rows: Sequence[TensorRow]) -> list[Any]:
        """Rows of one or more [1, ...] tensors each → one forward → per row, its slice of every output."""
        names = [t.name for t in self.model.graph.inputs]
        feeds = {n: np.concatenate([r[n] for r in rows], axis=0) for n in names}
        out = self.model.run(session, feeds)
        return [{k: v[j:j + 1] for k, v in out.items()} for j in range(len(rows))]

    def sample_rows(self, batch: int, length: int) -> tuple[list[Any], list[int]]:
        """Rows from the signature: dynamic dims other than the batch get `length`."""
        row = sample_feeds(self.model.graph, {})
        row = {k: v[:1] if v.ndim and v.shape[0] else v for k, v in row.items()}
        return [row] * batch, [1] * batch
