"""Records in (arguments, a file or stdin; plain lines or JSONL), results out (JSONL on stdout).

stdout carries data, stderr carries people-talk. Reading is lazy, so commands stream in constant memory.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..errors import ConfigError, InputError

FORMATS = ("auto", "lines", "jsonl")


@dataclass
class Record:
    index: int                      # 0-based position among the records
    line: int                       # 1-based line number in its source (0 for arguments)
    text: str
    data: dict[str, Any] | None     # the JSON object, for JSONL input


def get_field(obj: dict[str, Any], path: str) -> Any:
    """`a.b.c` in nested objects; KeyError when absent."""
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise KeyError(path)
        cur = cur[part]
    return cur


def _open(source: Path | None) -> tuple[IO[str], str, bool]:
    """(the input as text with line endings untranslated - a kept line is written back byte for byte -, its name,
    whether the reader closes it)."""
    if source is None or str(source) == "-":
        import io

        buffer = getattr(sys.stdin, "buffer", None)
        if buffer is None:  # a replaced stdin (tests): already text
            return sys.stdin, "<stdin>", False
        return io.TextIOWrapper(buffer, encoding="utf-8", newline=""), "<stdin>", False
    try:
        return open(source, encoding="utf-8", newline=""), str(source), True  # noqa: SIM115 - closed by the reader
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {exc.strerror}") from exc


def read_records(args: Iterable[str] | None, source: Path | None, fmt: str = "auto",
                 field: str = "text") -> Iterator[Record]:
    """Texts from arguments if given, else from `source` (a file, `-` or None for stdin)."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(FORMATS)}, got '{fmt}'")
    args = list(args or [])
    if args:
        if source is not None:
            raise ConfigError("give texts as arguments or with --input, not both")
        for i, text in enumerate(args):
            yield Record(i, 0, text, None)
        return
    if source is None and sys.stdin.isatty():
        raise ConfigError("no input: give texts as arguments, --input FILE, or pipe lines into stdin")
    stream, name, owned = _open(source)
    try:
        index = 0
        mode = None if fmt == "auto" else fmt
        for lineno, raw in enumerate(stream, start=1):
            line = raw.rstrip("\n").rstrip("\r")
            if mode is None:
                if not line.strip():
                    continue
                mode = "jsonl" if line.lstrip().startswith("{") else "lines"
            if mode == "lines":
                yield Record(index, lineno, line, None)
                index += 1
                continue
            if not line.strip():
                continue  # blank lines between JSON records carry nothing
            yield _json_record(line, lineno, index, name, field)
            index += 1
    except UnicodeDecodeError as exc:
        raise InputError(f"{name}: line {lineno + 1}: not UTF-8 text ({exc.reason})") from None
    finally:
        if owned:
            stream.close()
        elif isinstance(stream, io.TextIOWrapper) and stream is not sys.stdin:
            stream.detach()  # a wrapper of stdin's bytes: let go of them without closing stdin


def parse_json_line(line: str, lineno: int, name: str) -> dict[str, Any]:
    """One JSONL line → its object; InputError naming the source and line otherwise. A number that no Python int of
    64 bits or finite float holds (an id of 30 digits, 1e400, NaN) is kept as written, so the line it goes back to
    says the same."""
    from ..jsonio import loads_record

    return loads_record(line, f"{name}: line {lineno}")


def set_field(obj: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    cur = obj
    for part in parts[:-1]:
        cur = cur[part]
    cur[parts[-1]] = value


def read_lines(source: Path | None) -> Iterator[tuple[int, str, str, str]]:
    """(1-based line number, line without its newline, source name, the line as read), lazily; stdin when
    source is None."""
    if source is None and sys.stdin.isatty():
        raise ConfigError("no input: give --input FILE, or pipe lines into stdin")
    stream, name, owned = _open(source)
    lineno = 0
    try:
        for lineno, raw in enumerate(stream, start=1):
            yield lineno, raw.rstrip("\n").rstrip("\r"), name, raw
    except UnicodeDecodeError as exc:
        raise InputError(f"{name}: line {lineno + 1}: not UTF-8 text ({exc.reason})") from None
    finally:
        if owned:
            stream.close()
        elif isinstance(stream, io.TextIOWrapper) and stream is not sys.stdin:
            stream.detach()  # a wrapper of stdin's bytes: let go of them without closing stdin


def _json_record(line: str, lineno: int, index: int, name: str, field: str) -> Record:
    data = parse_json_line(line, lineno, name)
    try:
        text = get_field(data, field)
    except KeyError:
        raise InputError(f"{name}: line {lineno}: no field '{field}' (use --field)") from None
    if not isinstance(text, str):
        raise InputError(f"{name}: line {lineno}: field '{field}' is {type(text).__name__}, not a string")
    return Record(index, lineno, text, data)


def chunks(records: Iterable[Record], size: int) -> Iterator[list[Record]]:
    """Records in chunks of `size`. When reading fails (a bad line), the records before it come out first as a
    last chunk, then the error: a command writes everything before the failing line before it exits."""
    chunk: list[Record] = []
    it = iter(records)
    while True:
        try:
            r = next(it)
        except StopIteration:
            break
        except Exception:
            if chunk:
                yield chunk
            raise
        chunk.append(r)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def write_jsonl(obj: Any, out: IO[str] | None = None) -> None:
    from ..jsonio import dumps_line

    (out or sys.stdout).write(dumps_line(obj))


def check_writable(path: Path, option: str) -> None:
    """A file we are about to write can be: else a usage error naming the path and the OS reason."""
    import os

    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ConfigError(f"{option} {path}: cannot write: folder {folder} does not exist")
    if path.is_dir():
        raise ConfigError(f"{option} {path}: cannot write: it is a folder")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ConfigError(f"{option} {path}: cannot write: permission denied")


class NpyWriter:
    """A .npy of float32 (or `descr`: |i1, |u1) rows written row by row (constant memory); the header's row count
    is fixed up on close."""

    _COUNT_WIDTH = 20

    def __init__(self, path: Path, dim: int, descr: str = "<f4") -> None:
        self.path, self.dim, self.rows, self.descr = path, dim, 0, descr
        try:
            self._f = open(path, "wb")  # noqa: SIM115 - closed in close()
        except OSError as exc:
            raise ConfigError(f"--output {path}: cannot write: {exc.strerror}") from None
        self._f.write(self._header())

    def _header(self) -> bytes:
        shape = f"({self.rows}, {self.dim})".ljust(self._COUNT_WIDTH + 8)
        text = f"{{'descr': '{self.descr}', 'fortran_order': False, 'shape': {shape}, }}"
        total = 10 + len(text) + 1
        text += " " * ((-total) % 64) + "\n"
        return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text.encode("latin1")

    def write(self, rows: Any) -> None:
        import numpy as np

        arr = np.ascontiguousarray(rows, dtype=self.descr)
        self._f.write(arr.tobytes())
        self.rows += arr.shape[0]

    @property
    def dtype_name(self) -> str:
        return {"<f4": "float32", "|i1": "int8", "|u1": "uint8"}.get(self.descr, self.descr)

    def close(self) -> None:
        self._f.seek(0)
        self._f.write(self._header())
        self._f.close()

    def abort(self) -> None:
        self._f.close()
        self.path.unlink(missing_ok=True)


def read_texts(path: Path, option: str) -> list[str]:
    """A file's non-blank lines (texts for a benchmark or a quality check); ConfigError naming `option`."""
    try:
        texts = [x for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    except OSError as exc:
        raise ConfigError(f"{option} {path}: {exc.strerror}") from None
    if not texts:
        raise ConfigError(f"{option} {path} has no texts")
    return texts
