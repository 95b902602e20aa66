"""Parquet and CSV through the one-shot commands: streamed at bounded memory, every other column and the row order
kept, the answers typed (the API's, byte for byte), and bad tables refused by name with the documented exit codes."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import rsinfer_cli

EXIT_USAGE, EXIT_INPUT = 2, 3


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rsinfer_cli", *args], capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)


def tickets(n: int) -> list[str]:
    return [f"Ticket {i}: mail ana.souza{i}@example.org or call +44 20 7946 {i % 10000:04d}" if i % 9 else
            f"ticket {i} has no personal data" for i in range(n)]


def test_embed_parquet_is_the_api_and_keeps_every_column(shared_models, tmp_path):
    path = shared_models / "all-minilm-l6-v2"
    texts = tickets(300)
    table = pa.table({"id": pa.array(range(300), pa.int64()), "body": texts,
                      "meta": pa.array([{"k": i, "tags": ["a"] * (i % 3)} for i in range(300)]),
                      "when": pa.array(range(300), pa.int64()).cast(pa.timestamp("ms"))})
    pq.write_table(table, tmp_path / "in.parquet", row_group_size=70)
    proc = cli("embed", "--path", str(path), "--input", str(tmp_path / "in.parquet"), "--column", "body",
               "--output", str(tmp_path / "out.parquet"))
    assert proc.returncode == 0, proc.stderr
    out = pq.read_table(tmp_path / "out.parquet")
    assert out.column_names == ["id", "body", "meta", "when", "embedding"]
    assert out.schema.field("embedding").type == pa.list_(pa.float32(), 384)
    assert out.select(["id", "body", "meta", "when"]).equals(table)
    got = np.asarray(out.column("embedding").combine_chunks().flatten()).reshape(300, 384)
    assert got.tobytes() == rsinfer_cli.load(path).embed(texts).tobytes()


def test_redacting_a_large_parquet_file_holds_memory_bounded(shared_models, tmp_path):
    """500 rows beside an 800 KB binary column each (400 MB on disk, row groups of 10 rows): the run's peak RSS
    stays within 120 MB of the same run over the text alone, and every other column comes back byte for byte."""
    rows, blob = 500, 800_000
    texts = tickets(rows)
    rng = np.random.default_rng(7)
    big = tmp_path / "big.parquet"
    small = tmp_path / "small.parquet"
    schema = pa.schema([("id", pa.int64()), ("text", pa.string()), ("payload", pa.binary())])
    with pq.ParquetWriter(big, schema, compression="none") as w:
        for start in range(0, rows, 10):
            ids = list(range(start, start + 10))
            w.write_table(pa.table({"id": ids, "text": texts[start:start + 10],
                                    "payload": [rng.bytes(blob) for _ in ids]}, schema=schema))
    pq.write_table(pa.table({"id": list(range(rows)), "text": texts}), small, row_group_size=10)
    assert big.stat().st_size > 380e6

    def peak(src: Path, dst: Path) -> int:
        """The command's peak RSS (kB), measured by a wrapper whose only child it is."""
        code = ("import resource, subprocess, sys\n"
                f"p = subprocess.run([sys.executable, '-m', 'rsinfer_cli', 'redact', '--path', "
                f"{str(shared_models / 'rampart-pii')!r}, '--input', {str(src)!r}, '--output', {str(dst)!r}, "
                "'--mode', 'replace', '--spans'], stdin=subprocess.DEVNULL)\n"
                "assert p.returncode == 0\nprint(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        return int(proc.stdout.split()[-1])

    base = peak(small, tmp_path / "small-out.parquet")
    used = peak(big, tmp_path / "big-out.parquet")
    assert used - base < 120_000, (used, base)
    want = rsinfer_cli.load(shared_models / "rampart-pii").redact(texts, mode="replace")
    done = 0
    original = pq.ParquetFile(big).iter_batches(batch_size=100)
    for got in pq.ParquetFile(tmp_path / "big-out.parquet").iter_batches(batch_size=100):
        src = next(original)
        assert got.column("id").equals(src.column("id")) and got.column("payload").equals(src.column("payload"))
        assert got.column("text").to_pylist() == [r.text for r in want[done:done + got.num_rows]]
        assert got.column("pii_spans").to_pylist() == [[s.to_json() for s in r.spans]
                                                       for r in want[done:done + got.num_rows]]
        done += got.num_rows
    assert done == rows


def test_csv_quoting_and_newlines_round_trip(shared_models, tmp_path):
    rows = [["id", "text", "note"], ["007", "Call Ana on +44 20 7946 0958,\nthen \"mail\" ana@example.org", "a,b"],
            ["008", "", "multi\r\nline"], ["009", "nothing here", ""]]
    with open(tmp_path / "in.csv", "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    proc = cli("redact", "--path", str(shared_models / "rampart-pii"), "--input", str(tmp_path / "in.csv"),
               "--output", str(tmp_path / "out.csv"), "--mode", "replace")
    assert proc.returncode == 0, proc.stderr
    with open(tmp_path / "out.csv", newline="", encoding="utf-8") as f:
        got = list(csv.reader(f))
    assert got[0] == ["id", "text", "note"]
    assert [r[0] for r in got[1:]] == ["007", "008", "009"] and [r[2] for r in got[1:]] == ["a,b", "multi\r\nline", ""]
    want = rsinfer_cli.load(shared_models / "rampart-pii").redact([r[1] for r in rows[1:]], mode="replace")
    assert [r[1] for r in got[1:]] == [w.text for w in want]
    assert "ana@example.org" not in got[1][1] and "\n" in got[1][1]
    proc = cli("detect", "--path", str(shared_models / "rampart-pii"), "--input", str(tmp_path / "in.csv"))
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(x) for x in proc.stdout.splitlines()]
    assert [x["id"] for x in lines] == ["007", "008", "009"] and lines[0]["pii_spans"]


@pytest.mark.parametrize("command", ["sparse", "predict", "classify"])
def test_other_commands_write_typed_parquet(shared_models, tmp_path, command):
    folder = {"sparse": "tiny-splade", "predict": "tiny-textcls", "classify": "tiny-nli"}[command]
    texts = tickets(40) + [None]
    pq.write_table(pa.table({"text": texts}), tmp_path / "in.parquet")
    extra = ["--labels", "billing,travel"] if command == "classify" else []
    proc = cli(command, "--path", str(shared_models / folder), "--input", str(tmp_path / "in.parquet"),
               "--output", str(tmp_path / "out.parquet"), *extra)
    assert proc.returncode == 0, proc.stderr
    out = pq.read_table(tmp_path / "out.parquet")
    column = out.column(out.column_names[-1])
    assert column.null_count == 1 and column[40].as_py() is None and len(out) == 41
    model = rsinfer_cli.load(shared_models / folder)
    if command == "sparse":
        assert column.type == pa.list_(pa.struct([("index", pa.int32()), ("value", pa.float32())]))
        first = model.sparse(texts[:1])[0]
        assert [x["index"] for x in column[0].as_py()] == first.indices.tolist()
    elif command == "predict":
        assert column[0].as_py() == [x._asdict() for x in model.predict(texts[:1])[0]]
    else:
        assert column[0].as_py()["labels"] == model.classify(texts[:1], ["billing", "travel"])[0].labels


def test_bad_tables_are_named_errors(shared_models, tmp_path):
    pii = str(shared_models / "rampart-pii")
    pq.write_table(pa.table({"body": ["a"], "n": [1]}), tmp_path / "t.parquet")
    proc = cli("redact", "--path", pii, "--input", str(tmp_path / "t.parquet"), "--output", str(tmp_path / "o.parquet"))
    assert proc.returncode == EXIT_USAGE and "no column 'text' (the columns: body, n)" in proc.stderr
    proc = cli("redact", "--path", pii, "--input", str(tmp_path / "t.parquet"), "--column", "n")
    assert proc.returncode == EXIT_INPUT and "column 'n' holds int64, not strings" in proc.stderr
    (tmp_path / "bad.parquet").write_bytes(b"PAR1" + b"\0" * 100 + b"PAR1")
    proc = cli("redact", "--path", pii, "--input", str(tmp_path / "bad.parquet"))
    assert proc.returncode == EXIT_USAGE and "not a readable Parquet file" in proc.stderr
    proc = cli("embed", "--path", str(shared_models / "all-minilm-l6-v2"), "--input", str(tmp_path / "t.parquet"),
               "--column", "body", "--output", str(tmp_path / "o.txt"))
    assert proc.returncode == EXIT_USAGE and "write .parquet, .csv or .jsonl" in proc.stderr
    (tmp_path / "ragged.csv").write_text("id,text\n1,a\n2,b,c\n")
    proc = cli("redact", "--path", pii, "--input", str(tmp_path / "ragged.csv"))
    assert proc.returncode == EXIT_INPUT and "line 3: 3 fields, the header has 2" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = cli("embed", "--path", str(shared_models / "all-minilm-l6-v2"), "--input", str(tmp_path / "t.parquet"),
               "--column", "body", "--dimensions", "100000", "--error-column", "why")
    assert proc.returncode == EXIT_INPUT and "dimensions" in proc.stderr and "row " not in proc.stderr


def test_a_refused_row_stops_after_the_rows_before_or_goes_to_the_error_column(shared_models, tmp_path):
    path = str(shared_models / "all-minilm-l6-v2")
    texts = ["short"] * 300 + ["a much longer text " * 200] + ["short"] * 10
    pq.write_table(pa.table({"text": texts}), tmp_path / "in.parquet", row_group_size=100)
    out = tmp_path / "out.parquet"
    proc = cli("embed", "--path", path, "--input", str(tmp_path / "in.parquet"), "--output", str(out),
               "--no-truncate")
    assert proc.returncode == EXIT_INPUT and "row 300: column 'text'" in proc.stderr
    assert pq.read_table(out).column("text").to_pylist() == ["short"] * 300    # the row groups before row 300
    proc = cli("embed", "--path", path, "--input", str(tmp_path / "in.parquet"), "--output", str(out),
               "--no-truncate", "--error-column", "why")
    assert proc.returncode == 0, proc.stderr
    done = pq.read_table(out)
    assert len(done) == 311 and done.column("embedding").null_count == 1 and done.column("embedding")[300].as_py() \
        is None
    assert done.column("why").to_pylist()[300].startswith("the text has") and done.column("why").null_count == 310
