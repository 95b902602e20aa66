"""What the benchmark scripts share: a free loopback port and `rsinfer serve` started on a config, ready."""

from __future__ import annotations

import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol


def write_results(out: Path, lines: list[str]) -> int:
    """A benchmark's section of RESULTS.md in place of the one there (appended when there is none), and printed; the
    exit status of a benchmark script. A section is named by its `## ` title's last words, the script's name in
    backquotes and brackets: RESULTS.md holds the current results, one section per benchmark; their history is
    git's."""
    title = next(line for line in lines if line.startswith("## "))
    tag = re.search(r"\(`[\w.]+\.py`\)$", title)
    assert tag is not None, f"a section's title ends with its script's name: {title}"
    text = out.read_text(encoding="utf-8") if out.exists() else ""
    section = "\n".join(lines[lines.index(title):]).rstrip("\n") + "\n"
    found = re.search(rf"^## .*{re.escape(tag.group(0))}\n", text, flags=re.M)
    if found is None:
        text = text.rstrip("\n") + "\n\n" + section
    else:     # up to the next section, or the snippet marker (docs' `--8<--` includes) that opens it
        nxt = re.compile(r"^(## |<!-- --8<-- \[start:)", flags=re.M).search(text, found.end())
        old = text[found.start():nxt.start() if nxt is not None else len(text)]
        ends = re.findall(r"^<!-- --8<-- \[end:[\w-]+\] -->$", old, flags=re.M)   # the section's own snippet ends
        section += "".join(f"{marker}\n" for marker in ends)
        text = text[:found.start()] + section + ("\n" + text[nxt.start():] if nxt is not None else "")
    out.write_text(text, encoding="utf-8")
    print(section)
    return 0


CHARTS = Path(__file__).resolve().parents[1] / "docs" / "charts"   # shown on the docs' performance page


def pyplot() -> Any:
    """matplotlib's pyplot on its file-only backend (the `bench` extra): the charts benchmarks draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_chart(fig: Any, path: Path) -> None:
    """A benchmark's figure, laid out, as the PNG at `path` (its folder made when missing)."""
    if fig.get_layout_engine() is None:      # a figure made with layout="constrained" lays itself out
        fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def spread(values: list[float], fmt: str) -> str:
    """A table cell for repeated passes: their mean, and their range in brackets when there are several."""
    mean = sum(values) / len(values)
    return f"{mean:{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]" if len(values) > 1 else f"{mean:{fmt}}"


class Side(Protocol):
    """One server of a floor benchmark, up for the whole run: `load(seconds)` → (rate, CPU µs per request) of one
    block of the load, `stop()` at the end."""

    def load(self, seconds: float) -> tuple[float, float]: ...

    def stop(self) -> None: ...


def interleaved_floor(names: list[str], start: Callable[[str], Side], rate: str, per: str, floor: str,
                      rounds: int, seconds: float) -> list[str]:
    """The floor benchmarks' runs and table. Every server is started first and stays up; then `rounds` rounds, each
    one block of `seconds` of load per server, in an order reversed every round (ABBA...). A row per server: its
    rate and CPU µs per `per` over all its blocks, with the spread of the blocks; × floor = the median, over the
    rounds, of its CPU over the `floor` server's in the same round (blocks seconds apart: the drift of this
    machine's speed, 1.5-2x within an hour, cancels out of a ratio taken so close)."""
    sides: dict[str, Side] = {}
    try:
        for name in names:
            sides[name] = start(name)
        got: dict[str, list[tuple[float, float]]] = {k: [] for k in names}
        for r in range(rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                got[name].append(sides[name].load(seconds))
    finally:
        for side in sides.values():
            side.stop()
    lines = ["", f"| server | {rate} | CPU µs per {per} | × {floor} (median of {rounds} rounds) |",
             "|---|---|---|---|"]
    for name in names:
        ratios = sorted(c / f for (_, c), (_, f) in zip(got[name], got[floor], strict=True))
        median = statistics.median(ratios)
        lines.append(f"| {name} | {spread([r for r, _ in got[name]], '.0f')} | "
                     f"{spread([c for _, c in got[name]], '.0f')} | {median:.2f} [{ratios[0]:.2f}-{ratios[-1]:.2f}] |")
    return lines


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (from /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> dict[int, float]:
    """User + system CPU so far of a process and every descendant, by pid (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(parent, []).append(int(entry))
    out: dict[int, float] = {}
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            out[p] = cpu_seconds(p)
        except OSError:
            continue
        todo.extend(children.get(p, ()))
    return out


def inference_sum(url: str, model: str = "mini") -> float:
    """The forwards' time so far (rsinfer_inference_seconds_sum) of a model, from the server's /metrics."""
    import re

    import httpx

    m = re.search(rf'^rsinfer_inference_seconds_sum{{model="{model}",version=""}} ([0-9.e+-]+)$',
                  httpx.get(url + "/metrics").text, re.M)
    return float(m.group(1)) if m else 0.0


def forward_mean_ms(url: str, model: str = "mini") -> float:
    """The mean forward time (rsinfer_inference_seconds) of a model so far, from the server's /metrics."""
    import re

    import httpx

    text = httpx.get(url + "/metrics").text
    got = {k: float(v) for k, v in re.findall(
        rf'^rsinfer_inference_seconds_(sum|count){{model="{model}",version=""}} ([0-9.e+-]+)$', text, re.M)}
    return 1000 * got.get("sum", 0.0) / got["count"] if got.get("count") else 0.0


def plan_of(url: str, model: str = "mini") -> str:
    """The thread plan a running server resolved for a model (from /v1/models), for a results table."""
    import httpx

    t = next(m for m in httpx.get(url + "/v1/models").json()["data"] if m["id"] == model)["threads"]
    lane = f" + a latency lane of {t['latency_lane_threads']}" if t["latency_lane_threads"] else ""
    return f"{t['lanes']} x {t['threads']} thread{'s' if t['threads'] > 1 else ''}{lane} on {t['cpus']} CPUs " \
           f"({t['source']})"


def peak_rss_bytes(pid: int) -> int:
    """A process's peak resident memory (VmHWM) so far."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Serve:
    """`rsinfer serve` on 127.0.0.1:<port> with the given config text (its `server.bind` is set here)."""

    def __init__(self, models_yaml: str, tmp: Path, server_yaml: str = "", name: str = "bench",
                 src: Path | None = None, cpus: str | None = None, log_level: str = "warning",
                 python: str | None = None) -> None:
        """`src`: run the rsinfer_cli package found there (another checkout's src/) instead of this one; `cpus`:
        run it under `taskset -c CPUS`; `log_level`: "info" is the default a user gets (an access line per
        request, read here from the pipe as journald would)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = tmp / f"{name}.yaml"
        extra = f", {server_yaml}" if server_yaml else ""
        cfg.write_text(f"server: {{bind: '127.0.0.1:{self.port}'{extra}}}\nmodels:\n{models_yaml}")
        env = dict(os.environ)
        if src is not None:
            env["PYTHONPATH"] = f"{src}{os.pathsep}{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(src)
        pin = ["taskset", "-c", cpus] if cpus else []
        self.proc = subprocess.Popen([*pin, python or sys.executable, "-m", "rsinfer_cli", "serve", "--config",
                                      str(cfg), "--log-level", log_level], stderr=subprocess.PIPE, text=True, env=env)
        assert self.proc.stderr is not None
        self.lines: list[str] = []     # its stderr, read on a thread to the end (a full pipe would block it)
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stderr or ()), daemon=True)
        self._reader.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and self.proc.poll() is None:
            listening = next((x for x in self.lines if "listening on" in x), None)
            # with worker processes, ready once it also named them
            if listening and ("front-end processes" not in listening or any("processes:" in x for x in self.lines)):
                return
            time.sleep(0.02)
        self.stop()
        raise RuntimeError("rsinfer serve did not start:\n" + "".join(self.lines))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(60)
        self._reader.join(10)

    def __enter__(self) -> Serve:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
