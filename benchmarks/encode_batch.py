"""Would one `encode_batch` for the small text requests of one event-loop iteration save CPU? The tokenizer's cost
per text, one `encode` call each (what a request does now) against one `encode_batch` for N texts (what coalescing
the requests of one iteration would do), as process CPU (all threads: encode_batch spreads over the tokenizer's
own thread pool) and wall time.

    .venv/bin/python benchmarks/encode_batch.py          # its section of benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from _serve import write_results
from batching import ROOT, SHARED, machine

WORDS = ["hi", "yes", "no", "ok", "cat", "dog", "sun", "sea"]
SENTENCE = "the quick brown fox jumps over the lazy dog near the river bank"


def measure(fn: object, texts: list[str], rounds: int) -> tuple[float, float]:
    """(CPU µs, wall µs) per text."""
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(rounds):
        fn(texts)  # type: ignore[operator]
    c1, t1 = time.process_time(), time.perf_counter()
    n = rounds * len(texts)
    return (c1 - c0) / n * 1e6, (t1 - t0) / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "RESULTS.md")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--rows-only", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(SHARED / "all-minilm-l6-v2" / "tokenizer.json"))

    def one_each(texts: list[str]) -> None:
        for t in texts:
            tok.encode(t)

    def batched(texts: list[str]) -> None:
        tok.encode_batch(texts)

    if args.rows_only:                   # one mode's rows, for the parent run below
        for label, base in (("one word", WORDS), ("13-word sentence", [SENTENCE])):
            for n in (8, 64):
                texts = (base * n)[:n]
                for _ in range(2):                   # warm-up, then the second measurement counts
                    each = measure(one_each, texts, args.rounds)
                    batch = measure(batched, texts, args.rounds)
                print(f"| {label} | {n} | {args.rows_only} | {each[0]:.1f} / {each[1]:.1f} | "
                      f"{batch[0]:.1f} / {batch[1]:.1f} |")
        return 0
    lines = ["", "## One encode_batch per loop iteration? (`encode_batch.py`)", "",
             f"Machine: {machine()}. Reproduce: `.venv/bin/python benchmarks/encode_batch.py`. all-MiniLM-L6-v2's "
             f"tokenizer, {args.rounds} rounds per cell, CPU = process time of every thread; the tokenizer's thread "
             "pool on (its default) and off (`TOKENIZERS_PARALLELISM=false`), each in a process of its own.", "",
             "| texts | batch | tokenizer threads | one `encode` each: CPU / wall µs per text | "
             "one `encode_batch`: CPU / wall µs per text |", "|---|---|---|---|---|"]
    for mode, value in (("pool", "true"), ("off", "false")):
        out = subprocess.run([sys.executable, __file__, "--rounds", str(args.rounds), "--rows-only", mode],
                             env={**os.environ, "TOKENIZERS_PARALLELISM": value}, check=True, capture_output=True,
                             text=True, timeout=600).stdout
        lines += [line for line in out.splitlines() if line.startswith("|")]
    lines += ["", "Coalescing would not save CPU: `encode_batch` costs as much per text single-threaded, and more with "
              "its thread pool (only the wall time of a large batch falls). The cost of a text is the tokenizing "
              "itself, not the call.", ""]
    return write_results(args.out, lines)


if __name__ == "__main__":
    sys.exit(main())
