"""How long `rsinfer --help` and `rsinfer CMD --help` take, against a bare Python start in the same run.

    .venv/bin/python benchmarks/startup.py          # its section of benchmarks/RESULTS.md

Each command runs `--runs` times in a fresh process (the first run is dropped: the page cache); the median is
reported. `python -X importtime` names where the time of the slowest help screen goes.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from _serve import write_results

ROOT = Path(__file__).resolve().parent
RSINFER = [str(Path(sys.executable).parent / "rsinfer")]     # the entry point users run (not `python -m`)


def median_s(argv: list[str], runs: int) -> float:
    times = []
    for _ in range(runs + 1):
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        watchdog = threading.Timer(60, proc.kill)   # bounded; a blocking wait (`wait(timeout)` polls in steps of
        watchdog.start()                            # up to 50 ms, which would be measured)
        code = proc.wait()
        times.append(time.perf_counter() - t0)
        watchdog.cancel()
        if code != 0:
            raise SystemExit(f"{' '.join(argv)} exited {code}")
    return statistics.median(times[1:])


def top_imports(argv: list[str], n: int = 6) -> list[tuple[str, float]]:
    """The top-level imports (cumulative ms) of one run."""
    err = subprocess.run([sys.executable, "-X", "importtime", *argv], capture_output=True, text=True,
                         timeout=60).stderr
    rows = []
    for line in err.splitlines():
        if line.startswith("import time:") and "|" in line:
            _, cum, name = line.split("|")
            if cum.strip().isdigit() and not name.startswith("  ") and name.strip():   # top level only
                rows.append((name.strip(), int(cum) / 1000))
    return sorted(rows, key=lambda r: -r[1])[:n]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--out", type=Path, default=ROOT / "RESULTS.md")
    args = ap.parse_args()
    import typer

    bare = median_s([sys.executable, "-c", "pass"], args.runs)
    cmds = [["--help"], ["serve", "--help"], ["embed", "--help"], ["redact", "--help"], ["bench", "--help"]]
    got = {" ".join(c): median_s(RSINFER + c, args.runs) for c in cmds}
    slowest = max(got, key=lambda k: got[k])
    lines = ["", "## Start-up: help screens (`startup.py`)", "",
             f"Reproduce: `.venv/bin/python benchmarks/startup.py`. Median of {args.runs} fresh processes, typer "
             f"{typer.__version__}; a bare `python -c pass` takes {bare * 1000:.0f} ms in the same run.", "",
             "| command | ms | minus bare Python |", "|---|---|---|"]
    lines += [f"| `rsinfer {k}` | {v * 1000:.0f} | {(v - bare) * 1000:.0f} |" for k, v in got.items()]
    lines += ["", f"Where `rsinfer {slowest}` spends its imports (cumulative ms): " + ", ".join(
        f"{name} {ms:.0f}" for name, ms in top_imports(RSINFER + slowest.split())) + ".", ""]
    return write_results(args.out, lines)


if __name__ == "__main__":
    sys.exit(main())
