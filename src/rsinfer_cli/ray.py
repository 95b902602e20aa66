"""Ray Data: rsinfer's methods as callable classes for `Dataset.map_batches` on an actor pool - one model loaded
per actor, ONNX Runtime's threads = the CPUs the actor holds.

    import ray, rsinfer_cli.ray as rr

    ds = ray.data.read_parquet("s3://bucket/tickets/")
    ds = ds.map_batches(rr.Redact, fn_constructor_kwargs={"path": "/models/pii", "mode": "replace"},
                        concurrency=4, num_cpus=2, batch_size=512, batch_format="pyarrow")
    ds.write_parquet("s3://bucket/tickets-clean/")

The constructor takes `load`'s keys (path / hf / config + model, any model key), the method's options
(`dimensions`, `mode`, `top_k`, ...) and where to read and write: `column` (default text), `output_column`
(default the method's: embedding, sparse, colbert, score, labels, classify, entities, redacted), `on_error`
(fail: a refused row fails the batch, naming it; column: its message in `error_column`, its answer null). The
answers are typed Arrow columns (api/arrow.py) in every batch format: pyarrow, pandas or numpy.
"""

from __future__ import annotations

from typing import Any, ClassVar

from .api.arrow import job_of, pyarrow, split_keys

__all__ = ["Classify", "Colbert", "Detect", "Embed", "Predict", "Redact", "RedactJson", "Rerank", "Sparse"]


def _actor_cpus() -> int | None:
    """The CPUs Ray gave this actor (its num_cpus), None outside Ray."""
    try:
        import ray
    except ImportError:
        return None
    if not ray.is_initialized():
        return None
    try:
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")  # type: ignore[no-untyped-call]
    except AssertionError:      # the driver: no resources of its own
        return None
    return max(1, round(cpus)) if cpus else None


class _Method:
    """One model per instance (per actor); `__call__` runs a batch through the method."""

    method: ClassVar[str]

    def __init__(self, path: str | None = None, **keys: Any) -> None:
        from .api import load

        load_keys, options, how = split_keys(self.method, keys)
        self.job = job_of(self.method, options, **how)     # options checked before the model loads
        if path is not None:
            load_keys["path"] = path
        load_keys.setdefault("threads", _actor_cpus())
        self.model = load(**load_keys)

    def __call__(self, batch: Any) -> Any:
        pa = pyarrow()
        if isinstance(batch, (pa.Table, pa.RecordBatch)):
            return self.job.run(self.model, batch)
        if isinstance(batch, dict):             # batch_format="numpy"
            return _numpy(self.job.run(self.model, pa.table({k: _column(pa, v) for k, v in batch.items()})))
        return self.job.run(self.model, pa.Table.from_pandas(batch, preserve_index=False)).to_pandas()

    def __repr__(self) -> str:
        return f"rsinfer_cli.ray.{type(self).__name__}({self.model!r})"


def _column(pa: Any, values: Any) -> Any:
    """A numpy column as Arrow: strings (object or unicode arrays) as strings, the rest as pyarrow reads it."""
    import numpy as np

    if isinstance(values, np.ndarray) and values.dtype.kind in "OU" and values.ndim == 1:
        return pa.array(values.tolist(), type=pa.string()) if values.dtype.kind == "U" or all(
            v is None or isinstance(v, str) for v in values) else pa.array(values.tolist())
    return pa.array(values) if not isinstance(values, np.ndarray) or values.ndim == 1 else \
        pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])


def _numpy(table: Any) -> dict[str, Any]:
    """Ray's numpy batch format: a fixed-size list column (vectors) as one 2-D array, others as numpy reads them."""
    import numpy as np
    import pyarrow.types as t

    out = {}
    for name, col in zip(table.column_names, table.columns, strict=True):
        if t.is_fixed_size_list(col.type) and col.null_count == 0:
            out[name] = np.asarray(col.combine_chunks().flatten()).reshape(len(col), col.type.list_size)
        else:
            out[name] = col.to_numpy(zero_copy_only=False)
    return out


class Embed(_Method):
    """Dense vectors: `embedding` fixed_size_list<float32>[dim]."""

    method = "embed"


class Sparse(_Method):
    """Sparse vectors: `sparse` list<struct<index: int32, value: float32>>."""

    method = "sparse"


class Colbert(_Method):
    """Token vectors: `colbert` list<fixed_size_list<float32>[dim]>."""

    method = "colbert"


class Rerank(_Method):
    """A relevance score of each row's text against its query (`query_column`, default query): `score`."""

    method = "score"


class Predict(_Method):
    """Text classification: `labels` list<struct<label, score>>, best first."""

    method = "predict"


class Classify(_Method):
    """Zero-shot (labels=[...]) or true/false (question= / assertion=) with an NLI model: `classify`."""

    method = "classify"


class Detect(_Method):
    """PII spans: `entities` list<struct<entity_type, text, score, start, end, scheme>>."""

    method = "detect"


class Redact(_Method):
    """PII redaction: `redacted` string and `redacted_spans` (where each value was; never the value)."""

    method = "redact"


class RedactJson(_Method):
    """A column of JSON records redacted by a record `policy` (docs: Redacting records): `redacted`, each record
    back as compact JSON. With mode="pseudonym" and one `key`, every actor gives the same token for a value."""

    method = "redact_json"
