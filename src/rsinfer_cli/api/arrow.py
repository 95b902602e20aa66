"""A batch of rows (an Arrow table or record batch) through one of a Model's methods, the answers as typed Arrow
columns beside every other column: what `rsinfer embed|redact|... --input x.parquet`, the Ray Data classes and
the Spark column functions all run, so the three give the same answers as the API.

The output columns, typed so that a writer keeps them (Parquet, Delta, Lance, Iceberg):

    embed     embedding   fixed_size_list<float32>[dim]
    sparse    sparse      list<struct<index: int32, value: float32>>
    colbert   colbert     list<fixed_size_list<float32>[dim]>       (one vector per token)
    score     score       float64                                   (query column against text column)
    predict   labels      list<struct<label: string, score: float64>>
    classify  classify    struct<labels: list<string>, scores: list<float64>>   (zero-shot), or
                          struct<label: string, is_true: bool, true_probability: float64>   (true/false)
    detect    entities    list<struct<entity_type, text, score, start, end, scheme>>
    redact    redacted    string, and `<output>_spans`: list<struct<entity_type, score, start, end, replacement,
                          redacted_start, redacted_end>> (where each value was, never the value)
    redact_json  redacted  string: a column of JSON records, each redacted by a record policy

A null text gives a null answer. A row whose text the model refuses (too long with `truncate: false`, ...)
fails the batch with an InputError naming the row (`on_error="fail"`), or gets a null answer and its message in
the error column (`on_error="column"`): never dropped, never reordered.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, InputError

if TYPE_CHECKING:
    import pyarrow as pa

    from .model import Model

ON_ERROR = ("fail", "column")
ERROR_COLUMN = "error"


def pyarrow() -> Any:
    """pyarrow, or a ConfigError saying which extra installs it."""
    try:
        import pyarrow as pa
    except ImportError:
        raise ConfigError("Parquet, Ray and Spark need pyarrow: pip install 'rsinfer[data]'") from None
    return pa


@dataclass(frozen=True)
class Method:
    """One Model method as a column function: its default output column and how its answers become Arrow."""

    name: str
    output: str
    to_arrow: Callable[[Any, list[Any], Model], pa.Array]
    pairs: bool = False           # score: a query per row beside the text


def _embedding(pa: Any, got: list[Any], model: Model) -> pa.Array:
    import numpy as np

    missing = [v is None for v in got]
    if got and not any(missing):      # the usual batch: its rows back into one array, no per-row loop
        flat = np.ascontiguousarray(np.stack(got), dtype=np.float32)
        return pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel(), pa.float32()), flat.shape[1])
    width = next((len(v) for v in got if v is not None), _width(model))
    flat = np.zeros((len(got), width), dtype=np.float32)
    for i, v in enumerate(got):
        if v is not None:
            flat[i] = v
    mask = pa.array(missing) if any(missing) else None
    return pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel(), pa.float32()), width, mask=mask)


def _width(model: Model) -> int:
    dim = getattr(model.pipeline, "dim", 0)
    return dim if isinstance(dim, int) else 0


SPARSE = ("index", "value")


def _sparse(pa: Any, got: list[Any], model: Model) -> pa.Array:
    import numpy as np

    kept = [g for g in got if g is not None]
    offsets = np.zeros(len(got) + 1, dtype=np.int32)
    np.cumsum([len(g.indices) if g is not None else 0 for g in got], out=offsets[1:])
    ids = np.concatenate([g.indices for g in kept]).astype(np.int32) if kept else np.zeros(0, np.int32)
    values = np.concatenate([g.values for g in kept]).astype(np.float32) if kept else np.zeros(0, np.float32)
    items = pa.StructArray.from_arrays([pa.array(ids), pa.array(values)], names=list(SPARSE))
    mask = pa.array([g is None for g in got]) if len(kept) < len(got) else None
    return pa.ListArray.from_arrays(pa.array(offsets), items, mask=mask)


def _colbert(pa: Any, got: list[Any], model: Model) -> pa.Array:
    import numpy as np

    kept = [g for g in got if g is not None]
    width = kept[0].shape[1] if kept else _width(model)
    offsets = np.zeros(len(got) + 1, dtype=np.int32)
    np.cumsum([len(g) if g is not None else 0 for g in got], out=offsets[1:])
    flat = np.concatenate(kept).astype(np.float32).ravel() if kept else np.zeros(0, np.float32)
    tokens = pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), width)
    mask = pa.array([g is None for g in got]) if len(kept) < len(got) else None
    return pa.ListArray.from_arrays(pa.array(offsets), tokens, mask=mask)


def _python(kind: Callable[[Any], Any], convert: Callable[[Any], Any]) -> Callable[[Any, list[Any], Model], Any]:
    def to_arrow(pa: Any, got: list[Any], model: Model) -> pa.Array:
        return pa.array([None if g is None else convert(g) for g in got], type=kind(pa))

    return to_arrow


def _labels_type(pa: Any) -> Any:
    return pa.list_(pa.struct([("label", pa.string()), ("score", pa.float64())]))


def _entity_type(pa: Any) -> Any:
    return pa.list_(pa.struct([("entity_type", pa.string()), ("text", pa.string()), ("score", pa.float64()),
                               ("start", pa.int64()), ("end", pa.int64()), ("scheme", pa.string())]))


def spans_type(pa: Any) -> Any:
    return pa.list_(pa.struct([("entity_type", pa.string()), ("score", pa.float64()), ("start", pa.int64()),
                               ("end", pa.int64()), ("replacement", pa.string()), ("redacted_start", pa.int64()),
                               ("redacted_end", pa.int64())]))


def _classify(pa: Any, got: list[Any], model: Model) -> pa.Array:
    first = next((g for g in got if g is not None), None)
    if first is not None and hasattr(first, "is_true"):
        kind = pa.struct([("label", pa.string()), ("is_true", pa.bool_()), ("true_probability", pa.float64())])
        rows = [None if g is None else {"label": g.label, "is_true": g.is_true,
                                        "true_probability": g.true_probability} for g in got]
    else:
        kind = pa.struct([("labels", pa.list_(pa.string())), ("scores", pa.list_(pa.float64()))])
        rows = [None if g is None else {"labels": g.labels, "scores": g.scores} for g in got]
    return pa.array(rows, type=kind)


def _entities(g: Any) -> list[dict[str, Any]]:
    return [{"entity_type": e.entity_type, "text": e.text, "score": e.score, "start": e.start, "end": e.end,
             "scheme": e.scheme} for e in g]


def _redacted(pa: Any, got: list[Any], model: Model) -> pa.Array:
    return pa.array([None if g is None else g.text for g in got], type=pa.string())


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("embed", "embedding", _embedding),
    Method("sparse", "sparse", _sparse),
    Method("colbert", "colbert", _colbert),
    Method("score", "score", lambda pa, got, model: pa.array(got, type=pa.float64()), pairs=True),
    Method("predict", "labels", _python(_labels_type, lambda g: [x._asdict() for x in g])),
    Method("classify", "classify", _classify),
    Method("detect", "entities", _python(_entity_type, _entities)),
    Method("redact", "redacted", _redacted),
    Method("redact_json", "redacted", _python(lambda pa: pa.string(), lambda g: g)),
)}


def method(name: str) -> Method:
    if name not in METHODS:
        raise ConfigError(f"no column function '{name}' (one of {', '.join(METHODS)})")
    return METHODS[name]


@dataclass(frozen=True)
class Job:
    """What to run on every batch: a method with its options, which column it reads and which it writes."""

    method: str
    column: str = "text"
    output_column: str | None = None
    options: tuple[tuple[str, Any], ...] = ()
    on_error: str = "fail"
    error_column: str = ERROR_COLUMN
    query_column: str = "query"          # score: the column holding each row's query
    spans: bool = True                   # redact: the spans column beside the text
    spans_column: str | None = None      # its name (default `<output>_spans`)

    def __post_init__(self) -> None:
        method(self.method)
        if self.on_error not in ON_ERROR:
            raise ConfigError(f"on_error must be one of {', '.join(ON_ERROR)}, got '{self.on_error}'")

    @property
    def output(self) -> str:
        return self.output_column or METHODS[self.method].output

    @property
    def spans_output(self) -> str:
        return self.spans_column or f"{self.output}_spans"

    def columns(self) -> list[str]:
        """The columns it adds or replaces."""
        out = [self.output]
        if self.method == "redact" and self.spans:
            out.append(self.spans_output)
        if self.on_error == "column":
            out.append(self.error_column)
        return out

    def run(self, model: Model, table: pa.Table | pa.RecordBatch, first_row: int | None = None) -> pa.Table:
        """The table with the job's columns added (or replaced where they share a name), every other column as
        it was. `first_row`: the table's first row's number in its source, for messages (None: a batch of a
        dataset, its rows named by their place in it)."""
        pa = pyarrow()
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        texts = _strings(table, self.column, first_row)
        queries = _strings(table, self.query_column, first_row) if METHODS[self.method].pairs else None
        got, errors = self._answers(model, texts, queries, first_row)
        out = {self.output: METHODS[self.method].to_arrow(pa, got, model)}
        if self.method == "redact" and self.spans:
            out[self.spans_output] = pa.array(
                [None if g is None else [s.to_json() for s in g.spans] for g in got], type=spans_type(pa))
        if self.on_error == "column":
            out[self.error_column] = pa.array(errors, type=pa.string())
        for name, values in out.items():
            where = table.schema.get_field_index(name)
            table = table.set_column(where, name, values) if where >= 0 else table.append_column(name, values)
        return table

    def _answers(self, model: Model, texts: list[str | None], queries: list[str | None] | None,
                 first_row: int | None) -> tuple[list[Any], list[str | None]]:
        """Each row's answer (None: a null text, or a refused row with on_error=column) and error message."""
        rows = [i for i, t in enumerate(texts) if t is not None and (queries is None or queries[i] is not None)]
        got: list[Any] = [None] * len(texts)
        errors: list[str | None] = [None] * len(texts)
        try:
            answers = self.call(model, [texts[i] for i in rows], [queries[i] for i in rows] if queries else None)
        except InputError:
            self.call(model, [], [] if queries is not None else None)  # an option at fault fails here, row-less
            answers = None                   # which row: each one alone
        if answers is not None:
            for i, a in zip(rows, answers, strict=True):
                got[i] = a
            return got, errors
        for i in rows:
            try:
                got[i] = self.call(model, [texts[i]], [queries[i]] if queries else None)[0]
            except InputError as exc:
                message = str(exc).replace("input[0] ", "the text ", 1)
                if self.on_error == "fail":
                    row = f"row {i} of the batch" if first_row is None else f"row {first_row + i}"
                    raise InputError(f"{row}: column '{self.column}': {message}", param=self.column) from None
                errors[i] = message
        return got, errors

    def call(self, model: Model, texts: list[Any], queries: list[Any] | None) -> Sequence[Any]:
        options = dict(self.options)
        if queries is not None:
            return list(model.score(queries, texts, **options))
        return list(getattr(model, self.method)(texts, **options))


def _strings(table: pa.Table, column: str, first_row: int | None) -> list[str | None]:
    """A column of strings (nulls as None); ConfigError for a missing or non-string column."""
    import pyarrow.types as t

    if column not in table.column_names:
        raise ConfigError(f"no column '{column}' (the columns: {', '.join(table.column_names)})")
    values = table.column(column)
    kind = values.type
    if t.is_dictionary(kind):
        values, kind = values.cast(kind.value_type), kind.value_type
    if not (t.is_string(kind) or t.is_large_string(kind) or t.is_string_view(kind) or t.is_null(kind)):
        raise InputError(f"column '{column}' holds {kind}, not strings", param=column)
    return values.to_pylist()  # type: ignore[no-any-return]


def job_of(method_name: str, options: Mapping[str, Any], **how: Any) -> Job:
    """A Job with the method's options held to its signature: an unknown option is a ConfigError naming it."""
    import inspect

    from .model import Model

    fn = getattr(Model, "score" if method(method_name).pairs else method_name)
    known = {p for p in inspect.signature(fn).parameters if p not in ("self", "texts", "queries", "documents")}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"{', '.join(unknown)}: not an option of {method_name}() (its options: "
                          f"{', '.join(sorted(known))})")
    return Job(method_name, options=tuple(options.items()), **how)


JOB_KEYS = ("column", "output_column", "on_error", "error_column", "query_column", "spans", "spans_column")


def split_keys(method_name: str, keys: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """An adapter's keyword arguments as (load's, the method's options, the Job's): the method's options are the
    names its signature has, the Job's are JOB_KEYS, the rest go to `load` (which refuses what it does not know)."""
    import inspect

    from .model import Model

    fn = getattr(Model, "score" if method(method_name).pairs else method_name)
    own = {p for p in inspect.signature(fn).parameters if p not in ("self", "texts", "queries", "documents")}
    options = {k: v for k, v in keys.items() if k in own}
    how = {k: v for k, v in keys.items() if k in JOB_KEYS}
    load = {k: v for k, v in keys.items() if k not in own and k not in JOB_KEYS}
    return load, options, how


def output_type(method_name: str, options: Mapping[str, Any]) -> pa.DataType:
    """The Arrow type of a method's answer column before any row is run (what Spark declares); redact's is a
    struct of the text and its spans."""
    pa = pyarrow()
    floats = pa.list_(pa.float32())
    kinds: dict[str, Any] = {
        "embed": lambda: floats,
        "sparse": lambda: pa.list_(pa.struct([("index", pa.int32()), ("value", pa.float32())])),
        "colbert": lambda: pa.list_(floats),
        "score": pa.float64,
        "predict": lambda: _labels_type(pa),
        "classify": lambda: (
            pa.struct([("labels", pa.list_(pa.string())), ("scores", pa.list_(pa.float64()))])
            if options.get("labels") is not None else
            pa.struct([("label", pa.string()), ("is_true", pa.bool_()), ("true_probability", pa.float64())])),
        "detect": lambda: _entity_type(pa),
        "redact_json": pa.string,
        "redact": lambda: pa.struct([("text", pa.string()), ("spans", spans_type(pa))]),
    }
    return kinds[method(method_name).name]()
