"""Bulk jobs: rows/s of the Python API, `rsinfer embed` on Parquet, Ray Data (1 and 2 actors) and Spark local[2] on
the same 20,000 texts, each as a ratio to the raw in-process pipeline at its best batch size, in one run.

    .venv/bin/python benchmarks/bulk.py          # its section of benchmarks/RESULTS.md

all-minilm-l6-v2 from ../shared/models, the defaults everywhere (threads: the plan's CPUs; Ray: num_cpus per
actor; Spark: spark.task.cpus = 1, two tasks at once). The baseline: tokenize -> session.run -> mean pooling over
length-sorted batches of the best size (16 to 128), the best of 2 sessions x 1 thread and 1 session x 2 threads
(chosen on a fifth of the texts, then run over all of them).
Each job is timed from its first row to its last answer written (`rsinfer embed`: the whole command, model load
included, and apart from it the rows/s after the load; Ray and Spark: their session already up, the actors or
Python workers started and the models loaded inside the timing). Every loop is bounded; Ray and Spark listen on
127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")     # Ray's servers on loopback only

from batching import SHARED, WORDS, Raw, machine  # noqa: E402

ROOT = Path(__file__).resolve().parent
MODEL = SHARED / "all-minilm-l6-v2"


def tickets(n: int, seed: int = 11) -> list[str]:
    """Texts of 5 to 40 words: support tickets, product descriptions."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 40))) for _ in range(n)]


def api_rate(texts: list[str]) -> float:
    import rsinfer_cli

    model = rsinfer_cli.load(MODEL)
    model.embed(texts[:64])
    t0 = time.perf_counter()
    model.embed(texts)
    return len(texts) / (time.perf_counter() - t0)


def parquet_rate(texts: list[str], tmp: Path) -> tuple[float, float]:
    """(rows/s of the whole command, rows/s after the model loaded: from the command's own first progress)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    src, dst = tmp / "in.parquet", tmp / "out.parquet"
    pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), src, row_group_size=4096)
    load = subprocess.run([sys.executable, "-c", f"import rsinfer_cli, time; t=time.perf_counter(); "
                           f"rsinfer_cli.load({str(MODEL)!r}).embed(['x']); print(time.perf_counter()-t)"],
                          capture_output=True, text=True, timeout=300, check=True)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "rsinfer_cli", "embed", "--path", str(MODEL), "--input", str(src),
                    "--output", str(dst)], check=True, timeout=3600, capture_output=True)
    wall = time.perf_counter() - t0
    assert pq.ParquetFile(dst).metadata.num_rows == len(texts)
    started = float(load.stdout.split()[-1])          # a process start, the imports and the model's load
    return len(texts) / wall, len(texts) / max(wall - started, 1e-9)


def ray_rate(texts: list[str], actors: int) -> float:
    import ray
    import ray.data

    import rsinfer_cli.ray as rr

    ds = ray.data.from_items([{"text": t} for t in texts]).materialize()
    t0 = time.perf_counter()
    out = ds.map_batches(rr.Embed, fn_constructor_kwargs={"path": str(MODEL)}, concurrency=actors,
                         num_cpus=2 // actors, batch_size=512, batch_format="pyarrow").materialize()
    rate = len(texts) / (time.perf_counter() - t0)
    assert out.count() == len(texts)
    return rate


def spark_rate(spark, texts: list[str], tmp: Path) -> float:
    from rsinfer_cli import spark as rs

    df = spark.createDataFrame([(t,) for t in texts], ["text"]).repartition(8).cache()
    df.count()
    embed = rs.embed(path=str(MODEL))
    t0 = time.perf_counter()
    df.withColumn("embedding", embed("text")).write.mode("overwrite").parquet(str(tmp / "spark-out"))
    return len(texts) / (time.perf_counter() - t0)


def start_spark(tmp: Path):
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.local.dir", str(tmp / "spark")).getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    return session


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--write", action="store_true", help="replace the section of RESULTS.md")
    args = ap.parse_args()
    texts = tickets(args.rows)
    raw = Raw(MODEL)
    # the best layout and batch size chosen on a fifth of the texts, then measured over all of them
    sample = texts[: max(len(texts) // 5, 1000)]
    best = max((raw.ceiling(sample, [16, 32, 64, 128], s, t) + (s, t) for s, t in ((2, 1), (1, 2))))
    base = (raw.ceiling(texts, [best[1]], best[2], best[3])[0], best[1], f"{best[2]} x {best[3]}")
    print(f"raw ceiling {base[0]:.0f} rows/s (batch {base[1]}, {base[2]})", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        rate = api_rate(texts)
        rows.append(("Python API: `rsinfer_cli.load(path).embed(texts)`", rate, ""))
        whole, after = parquet_rate(texts, tmp)
        rows.append(("`rsinfer embed --input in.parquet --output out.parquet`", whole,
                     f"after the model's load: {after:.0f} rows/s ({after / base[0]:.2f})"))
        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
        try:
            for actors in (1, 2):
                rows.append((f"Ray Data, {actors} actor{'s' if actors > 1 else ''} x {2 // actors} CPU"
                             f"{'s' if actors == 1 else ''}", ray_rate(texts, actors), "actor start and load inside"))
        finally:
            ray.shutdown()
        spark = start_spark(tmp)
        try:
            rows.append(("Spark local[2], `rsinfer_cli.spark.embed`", spark_rate(spark, texts, tmp),
                         "2 tasks x 1 thread; Python workers and loads inside"))
        finally:
            spark.stop()
    for name, rate, note in rows:
        print(f"{name}: {rate:.0f} rows/s ({rate / base[0]:.2f}) {note}", flush=True)
    section = ["## Bulk jobs: API, Parquet, Ray Data and Spark against the raw pipeline (`bulk.py`)", "",
               f"Machine: {machine()}. Reproduce: `.venv/bin/python benchmarks/bulk.py --write`. "
               f"all-MiniLM-L6-v2 fp32, {len(texts):,} texts of 5-40 words.\n",
               f"Baseline (in-process, same texts): the raw pipeline's best, {base[0]:.0f} rows/s (length-sorted "
               f"batches of {base[1]}, {base[2]} thread(s)).\n",
               "| job | rows/s | / baseline | note |", "|---|---|---|---|"]
    section += [f"| {name} | {rate:.0f} | {rate / base[0]:.2f} | {note} |" for name, rate, note in rows]
    if args.write:
        from _serve import write_results

        write_results(ROOT / "RESULTS.md", section)
    else:
        print("\n".join(section))


if __name__ == "__main__":
    main()
