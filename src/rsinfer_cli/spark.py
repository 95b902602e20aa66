"""Spark: rsinfer's methods as column functions, one model per Python worker (cached across tasks: Spark reuses
its Python workers), ONNX Runtime's threads = `spark.task.cpus`.

    from rsinfer_cli import spark as rs

    embed = rs.embed(path="/models/minilm")
    df = df.withColumn("embedding", embed("text"))

    redact = rs.redact(path="/models/pii", mode="replace")
    df = df.withColumn("clean", redact("body")).withColumn("body", F.col("clean.text"))

Each function takes `load`'s keys and the method's options, as `rsinfer_cli.ray`'s classes do, and returns a
function of one column (rerank: of the query column and the text column). The answers have the Arrow types of
api/arrow.py as Spark types (redact: struct<text, spans>). `on_error="column"` makes the answer a
struct<value, error> where a refused row has a null value and its message, instead of failing the task.

Built on `pandas_udf` with an iterator of batches, which `pyspark.ml.functions.predict_batch_udf` is built on too:
that API returns only numbers, arrays of numbers and flat structs, not the nested answers here (sparse vectors,
labels, spans), and hands strings over as numpy object arrays; the per-worker model cache and batch sizing it adds
are here the same way (`batch_size`: rows per Arrow batch, spark.sql.execution.arrow.maxRecordsPerBatch).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from .api.arrow import job_of, output_type, pyarrow, split_keys

__all__ = ["classify", "colbert", "detect", "embed", "predict", "redact", "redact_json", "redact_records", "rerank",
           "sparse"]

_MODELS: dict[str, Any] = {}       # per Python worker: the models its tasks loaded, by their load keys
_LOCK = threading.Lock()


def _model(load_keys: dict[str, Any]) -> Any:
    """This worker's model for `load_keys`, loaded by its first task; threads = the task's CPUs."""
    from .api import load

    key = repr(sorted(load_keys.items()))
    with _LOCK:
        if key not in _MODELS:
            keys = dict(load_keys)
            keys.setdefault("threads", _task_cpus())
            _MODELS[key] = load(**keys)
        return _MODELS[key]


def _task_cpus() -> int:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return max(1, int(ctx.cpus())) if ctx is not None else 1


def _function(method_name: str, keys: dict[str, Any]) -> Callable[..., Any]:
    import pandas as pd
    from pyspark.sql.pandas.functions import pandas_udf
    from pyspark.sql.pandas.types import from_arrow_type

    load_keys, options, how = split_keys(method_name, keys)
    if how.pop("column", None) is not None or how.pop("output_column", None) is not None:
        from .errors import ConfigError

        raise ConfigError("Spark column functions take their columns as arguments: f('text'), not column=")
    pa = pyarrow()
    job = job_of(method_name, options, column="text", output_column="answer", spans_column="answer_spans", **how)
    answer = output_type(method_name, options)
    kind = pa.struct([("value", answer), ("error", pa.string())]) if job.on_error == "column" else answer
    pairs = job.method == "score"

    def run(columns: list[pd.Series]) -> Any:
        texts = pa.array(columns[-1], type=pa.string(), from_pandas=True)
        table = pa.table({"text": texts, "query": pa.array(columns[0], type=pa.string(), from_pandas=True)}
                         if pairs else {"text": texts})
        done = job.run(_model(load_keys), table)
        value = done.column("answer")
        if job.method == "redact":     # struct<text, spans>
            value = pa.StructArray.from_arrays([value.combine_chunks(), done.column("answer_spans").combine_chunks()],
                                               names=["text", "spans"])
        elif job.method == "embed":
            value = value.cast(pa.list_(pa.float32()))
        if job.on_error == "column":
            return _frame(pa.StructArray.from_arrays([value.combine_chunks() if hasattr(value, "combine_chunks")
                                                      else value, done.column(job.error_column).combine_chunks()],
                                                     names=["value", "error"]))
        return _frame(value) if pa.types.is_struct(value.type) else value.to_pandas()

    def batches(it: Iterator[Any]) -> Iterator[Any]:
        for item in it:
            yield run(list(item) if isinstance(item, tuple) else [item])

    # pandas_udf reads its kind from the hints (evaluated here: this module's annotations are strings): an
    # iterator of batches of one column, or of (query, text) pairs
    batches.__annotations__ = {"it": Iterator[tuple[pd.Series, pd.Series]] if pairs else Iterator[pd.Series],
                               "return": Iterator[pd.Series]}
    udf: Callable[..., Any] = pandas_udf(batches, from_arrow_type(kind))  # type: ignore[call-overload]
    return udf


def _frame(struct: Any) -> Any:
    """A struct column as the pandas DataFrame a struct-typed pandas_udf returns (nested values as Python)."""
    import pandas as pd

    arr = struct.combine_chunks() if hasattr(struct, "combine_chunks") else struct
    return pd.DataFrame({f.name: pd.Series(arr.field(i).to_pylist(), dtype=object)
                         for i, f in enumerate(arr.type)})


def embed(path: str | None = None, **keys: Any) -> Callable[..., Any]:
    """Dense vectors: array<float>."""
    return _function("embed", _with_path(path, keys))


def sparse(path: str | None = None, **keys: Any) -> Callable[..., Any]:
    """Sparse vectors: array<struct<index: int, value: float>>."""
    return _function("sparse", _with_path(path, keys))


def colbert(path: str | None = None, **keys: Any) -> Callable[..., Any]:
    """Token vectors: array<array<float>>."""
    return _function("colbert", _with_path(path, keys))


def rerank(path: str | None = None, **keys: Any) -> Callable[..., Any]:
    """f(query_column, text_column): each row's text scored against its query, double."""
    return _function("score", _with_path(path, keys))


def predict(path: str | None = None, **keys: Any) -> Callable[..., Any]:
    """Text classification: array<struct<label, score>>, best first."""
    return _function("predict", _with_path(path, keys))


def classify(path: str | None = None, **keys: Any) -> Callable[..., Any]:
    """Zero-shot (labels=[...]) or true/false (question= / assertion=): a struct."""
    return _function("classify", _with_path(path, keys))


def detect(path: str | None = None, **keys: Any) -> Callable[..., Any]:
    """PII spans: array<struct<entity_type, text, score, start, end, scheme>>."""
    return _function("detect", _with_path(path, keys))


def redact(path: str | None = None, **keys: Any) -> Callable[..., Any]:
    """PII redaction: struct<text, spans> (where each value was and what replaced it; never the value)."""
    return _function("redact", _with_path(path, keys))


def redact_json(path: str | None = None, **keys: Any) -> Callable[..., Any]:
    """A column of JSON records redacted by a record `policy` (docs: Redacting records): string, the record back
    as compact JSON with its declared fields handled and every other value as it was. With mode="pseudonym" and
    one `key`, every executor gives the same token for the same value."""
    return _function("redact_json", _with_path(path, keys))


def _with_path(path: str | None, keys: dict[str, Any]) -> dict[str, Any]:
    return {**keys, "path": path} if path is not None else keys


def redact_records(df: Any, columns: list[str], *, spans: bool = False, **keys: Any) -> Any:
    """Whole records redacted with `DataFrame.mapInArrow`: each of `columns` replaced by its redacted text in the
    same place, every other column as it was; `spans=True` adds `<column>_spans` beside each (where each value was,
    never the value); `on_error="column"` adds `<column>_error`. `keys`: `load`'s and redact()'s, as `redact`."""
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import StringType, StructField, StructType

    from .api.arrow import spans_type

    load_keys, options, how = split_keys("redact", keys)
    if how.pop("column", None) is not None or how.pop("output_column", None) is not None:
        from .errors import ConfigError

        raise ConfigError("redact_records takes its columns as `columns`, not column=")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        from .errors import ConfigError

        raise ConfigError(f"no column {', '.join(map(repr, missing))} (the columns: {', '.join(df.columns)})")
    jobs = [job_of("redact", options, column=c, output_column=c, spans=spans, spans_column=f"{c}_spans",
                   **{**how, "error_column": f"{c}_error"}) for c in columns]
    fields = list(df.schema.fields)
    pa = pyarrow()
    for c in columns:
        if spans:
            fields.append(StructField(f"{c}_spans", from_arrow_type(spans_type(pa))))
        if jobs[0].on_error == "column":
            fields.append(StructField(f"{c}_error", StringType()))

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        model = _model(load_keys)
        for batch in batches:
            table = pa.Table.from_batches([batch])
            for job in jobs:
                table = job.run(model, table)
            yield from table.to_batches()

    return df.mapInArrow(run, StructType(fields))
