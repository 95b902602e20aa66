"""Tables in and out for the one-shot commands: Parquet (streamed by row group) and CSV (quoted fields, embedded
newlines), chosen by the file's extension. Each batch of rows runs through the API's column functions
(api/arrow.py: the same answers as Ray and Spark get), every other column and the row order kept, the output
schema typed (Parquet), nested answers as JSON text (CSV). Memory stays bounded: a batch at a time.

A bad row stops the run after every row before its batch is written (the output is a valid file of those rows),
unless `--error-column` asks for the refused rows' messages in a column instead.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, InputError

if TYPE_CHECKING:
    import pyarrow as pa

    from ..api.arrow import Job
    from ..api.model import Model

TABLE_SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}
OUTPUT_SUFFIXES = {**TABLE_SUFFIXES, ".jsonl": "jsonl", ".json": "jsonl"}


def table_format(path: Path | None) -> str | None:
    """parquet or csv by the file's extension; None for anything else (lines, JSONL, stdin)."""
    return TABLE_SUFFIXES.get(path.suffix.lower()) if path is not None and str(path) != "-" else None


def wants_table(input_: Path | None, output: Path | None) -> bool:
    return table_format(input_) is not None or table_format(output) is not None


def table_command(kind: str, source: Any, job: Job, input_: Path | None, output: Path | None,
                  max_rows: int | None = None, **overrides: Any) -> None:
    """A command's table run: the files checked, then the model (of `kind`) loaded, then `run_table`."""
    from .common import open_model

    out_kind = _check_files(input_, output)
    assert input_ is not None
    run_table(open_model(kind, source, max_rows=max_rows, **overrides), job, input_, output, out_kind)


def _check_files(input_: Path | None, output: Path | None) -> str:
    """The output's format, once the input is a table there and the output a file that can be written."""
    from ..api.arrow import pyarrow
    from .io import check_writable

    pyarrow()
    if table_format(input_) is None or input_ is None:
        raise ConfigError(f"--output {output}: a table is written from a table: give --input FILE.parquet or .csv")
    if not input_.is_file():
        raise ConfigError(f"--input {input_}: no such file")
    out_kind = OUTPUT_SUFFIXES.get(output.suffix.lower()) if output is not None else "jsonl"
    if out_kind is None:
        raise ConfigError(f"--output {output}: write .parquet, .csv or .jsonl")
    if output is not None:
        check_writable(output, "--output")
        if output.resolve() == input_.resolve():
            raise ConfigError(f"--output {output} is the input: write to another file")
    return out_kind


def run_table(model: Model, job: Job, input_: Path, output: Path | None, out_kind: str) -> None:
    """The input table (checked by `_check_files`) through `job`, batch by batch, into `output` (stdout JSONL
    when None)."""
    from ..api.arrow import pyarrow
    from .common import progress_bar

    kind = table_format(input_)
    pa = pyarrow()
    source = ParquetSource(input_, model.chunk_rows) if kind == "parquet" else CsvSource(input_, model.chunk_rows)
    sink = _sink(out_kind, output)
    done = 0
    with progress_bar(source.rows, f"{job.method} {input_.name}") as bar:
        task = bar.add_task(job.method, total=source.rows)
        try:
            for table in source.batches():    # a row group, or a CSV chunk
                parts = []
                for batch in table.to_batches(max_chunksize=model.chunk_rows):
                    parts.append(job.run(model, pa.Table.from_batches([batch]), first_row=done))
                    done += batch.num_rows
                    bar.update(task, advance=batch.num_rows)
                if parts:
                    sink.write(pa.concat_tables(parts) if len(parts) > 1 else parts[0])
        except InputError:
            sink.close()
            if output is not None:
                print(f"rsinfer: wrote {sink.rows} rows to {output} (those before the failing row's row group or "
                  "chunk)", file=sys.stderr)
            raise
        except BaseException:
            sink.abort()
            raise
    sink.close()
    if output is not None:
        print(f"rsinfer: wrote {sink.rows} rows to {output}", file=sys.stderr)


class ParquetSource:
    """A Parquet file's rows a row group at a time (bounded memory), every column as stored."""

    def __init__(self, path: Path, batch_rows: int) -> None:
        import pyarrow.parquet as pq

        self.path, self.batch_rows = path, batch_rows
        try:
            self.file = pq.ParquetFile(path)
        except FileNotFoundError:
            raise ConfigError(f"--input {path}: no such file") from None
        except Exception as exc:    # pyarrow's ArrowInvalid / OSError for a file that is not Parquet
            raise ConfigError(f"--input {path}: not a readable Parquet file ({_reason(exc)})") from None
        self.rows: int | None = self.file.metadata.num_rows

    def batches(self) -> Iterator[pa.Table]:
        """A row group at a time (memory: about one row group, in and out; the output keeps the input's row
        groups)."""
        done = 0
        for group in range(self.file.num_row_groups):
            try:
                table = self.file.read_row_group(group, use_threads=False)
            except Exception as exc:    # a corrupt page or row group
                raise InputError(f"--input {self.path}: row group {group} (from row {done}) is unreadable "
                                 f"({_reason(exc)})") from None
            done += table.num_rows
            yield table


class CsvSource:
    """A CSV file (a header row, RFC 4180 quoting, newlines inside quoted fields) as batches of string columns:
    every value kept as written."""

    def __init__(self, path: Path, batch_rows: int) -> None:
        self.path, self.batch_rows = path, batch_rows
        self.rows: int | None = None
        try:
            self.stream = open(path, encoding="utf-8", newline="")  # noqa: SIM115 - closed in batches()
        except FileNotFoundError:
            raise ConfigError(f"--input {path}: no such file") from None
        except OSError as exc:
            raise ConfigError(f"--input {path}: cannot read: {exc.strerror}") from None

    def batches(self) -> Iterator[pa.Table]:
        import csv

        import pyarrow as pa

        reader = csv.reader(self.stream, strict=True)
        try:
            header = next(reader, None)
            if not header:
                raise InputError(f"--input {self.path}: no header row")
            rows: list[list[str]] = []
            for row in reader:
                if len(row) != len(header):
                    raise InputError(f"--input {self.path}: line {reader.line_num}: {len(row)} fields, the header "
                                     f"has {len(header)}")
                rows.append(row)
                if len(rows) >= self.batch_rows:
                    yield _string_batch(pa, header, rows)
                    rows = []
            if rows:
                yield _string_batch(pa, header, rows)
        except csv.Error as exc:
            raise InputError(f"--input {self.path}: line {reader.line_num}: {exc}") from None
        except UnicodeDecodeError as exc:
            raise InputError(f"--input {self.path}: not UTF-8 text ({exc.reason})") from None
        finally:
            self.stream.close()


def _string_batch(pa: Any, header: list[str], rows: list[list[str]]) -> Any:
    return pa.Table.from_arrays([pa.array([r[i] for r in rows], pa.string()) for i in range(len(header))],
                                      names=header)


def _reason(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


def _sink(kind: str, output: Path | None) -> Any:
    if kind == "parquet":
        assert output is not None
        return ParquetSink(output)
    if kind == "csv":
        assert output is not None
        return CsvSink(output)
    return JsonlSink(output)


class ParquetSink:
    """A Parquet file written a batch at a time (a row group each); closed, it holds every batch written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.writer: Any = None
        self.rows = 0

    def write(self, table: pa.Table) -> None:
        import pyarrow.parquet as pq

        self.rows += table.num_rows
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.path, table.schema)
        self.writer.write_table(table)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    def abort(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


class CsvSink:
    """CSV with a header; a nested answer (a vector, spans) is its JSON text."""

    def __init__(self, path: Path) -> None:
        import csv

        self.path = path
        try:
            self.stream = open(path, "w", encoding="utf-8", newline="")  # noqa: SIM115 - closed in close()
        except OSError as exc:
            raise ConfigError(f"--output {path}: cannot write: {exc.strerror}") from None
        self.writer = csv.writer(self.stream)
        self.header = False
        self.rows = 0

    def write(self, table: pa.Table) -> None:
        from ..jsonio import dumps

        self.rows += table.num_rows
        if not self.header:
            self.writer.writerow(table.column_names)
            self.header = True
        columns = [c.to_pylist() for c in table.columns]
        for row in zip(*columns, strict=True):
            self.writer.writerow(["" if v is None else v if isinstance(v, str) else dumps(v).decode("utf-8")
                                  for v in row])

    def close(self) -> None:
        self.stream.close()

    def abort(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


class JsonlSink:
    """One JSON object a row, on stdout or into a file."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.stream: Any = sys.stdout if path is None else open(path, "w", encoding="utf-8")  # noqa: SIM115
        self.rows = 0

    def write(self, table: pa.Table) -> None:
        from ..jsonio import dumps_line

        self.rows += table.num_rows
        for row in table.to_pylist():
            self.stream.write(dumps_line(row))
        self.stream.flush()

    def close(self) -> None:
        if self.path is not None:
            self.stream.close()

    def abort(self) -> None:
        self.close()
        if self.path is not None:
            self.path.unlink(missing_ok=True)
