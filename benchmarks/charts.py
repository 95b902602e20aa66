"""The docs' performance charts, drawn from data: each benchmark that has a chart (latency.py, batching.py,
clients.py) writes its numbers to docs/charts/<name>.json and draws docs/charts/<name>.png through `draw`; this
script redraws every chart from those files, so that a change of style needs no new run:

    .venv/bin/python benchmarks/charts.py

Every chart carries its title, what it measured on which machine and when (the `note`), and linear axes from 0, at
a size that stays readable in the docs' content column (about 800 px).
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _serve import CHARTS, pyplot, save_chart

FONT = 11


def _frame(plt: Any, rows: int, data: dict[str, Any]) -> tuple[Any, Any]:
    fig, axes = plt.subplots(rows, 1, figsize=(8.5, 3.4 * rows + 1.2), squeeze=False, layout="constrained")
    fig.suptitle(data["title"], fontsize=FONT + 2, fontweight="bold")
    fig.supxlabel(textwrap.fill(data["note"], 110), fontsize=FONT - 2, color="dimgray")
    return fig, [ax for row in axes for ax in row]


def _finish(ax: Any, xlabel: str, ylabel: str, legend_below: bool = False) -> None:
    ax.set_xlabel(xlabel, fontsize=FONT)
    ax.set_ylabel(ylabel, fontsize=FONT)
    ax.set_ylim(bottom=0)
    ax.tick_params(labelsize=FONT - 1)
    ax.grid(alpha=0.3)
    if legend_below:
        ax.legend(fontsize=FONT - 1, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2, frameon=False)
    else:
        ax.legend(fontsize=FONT - 1, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def latency(data: dict[str, Any]) -> Any:
    """Per panel (a route and model), each side's latency percentiles."""
    plt = pyplot()
    fig, axes = _frame(plt, len(data["panels"]), data)
    for ax, panel in zip(axes, data["panels"], strict=True):
        for side in panel["sides"]:
            qs = sorted(side["percentiles"], key=float)
            ax.plot([float(q) for q in qs], [side["percentiles"][q] for q in qs], marker="o", label=side["label"])
        ax.set_title(panel["title"], fontsize=FONT)
        ax.set_xticks([float(q) for q in qs])
        _finish(ax, "percentile", "latency (ms)")
    return fig


def batching(data: dict[str, Any]) -> Any:
    """Texts/s per workload, batching on and off, with the in-process ceiling of the workloads that have one."""
    plt = pyplot()
    fig, (ax,) = _frame(plt, 1, data)
    fig.set_figheight(5.6)
    rows = data["rows"]
    x = list(range(len(rows)))
    ax.bar([i - 0.2 for i in x], [r["on"] for r in rows], 0.4, label="rsinfer, batching on (the default)")
    ax.bar([i + 0.2 for i in x], [r["off"] for r in rows], 0.4, label="rsinfer, batching off")
    for i, r in enumerate(rows):
        if r.get("ceiling"):
            ax.hlines(r["ceiling"], i - 0.45, i + 0.45, colors="black", linestyles="dashed",
                      label="raw pipeline in-process, the best batch (ceiling)" if i == 0 else None)
    ax.set_xticks(x, [textwrap.fill(r["workload"], 14) for r in rows])
    _finish(ax, "workload", "texts/s (rerank: pairs/s)", legend_below=True)
    return fig


def clients(data: dict[str, Any]) -> Any:
    """Texts/s and p50/p95 latency against the number of clients, with the raw pipeline's two baselines."""
    plt = pyplot()
    fig, (rate, lat) = _frame(plt, 2, data)
    rows = data["rows"]
    xs = [r["clients"] for r in rows]
    rate.plot(xs, [r["rps"] for r in rows], marker="o", label="rsinfer serve,\nthe defaults")
    rate.axhline(data["ceiling"], color="black", linestyle="dashed", label="raw pipeline,\nthe best batch (ceiling)")
    rate.axhline(data["batch1"], color="gray", linestyle="dotted", label="raw pipeline,\nbatch 1")
    lat.plot(xs, [r["p50_ms"] for r in rows], marker="o", label="p50")
    lat.plot(xs, [r["p95_ms"] for r in rows], marker="o", label="p95")
    for ax, ylabel in ((rate, "texts/s"), (lat, "latency (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        _finish(ax, "concurrent clients, one short query each", ylabel)
    rate.set_title("throughput", fontsize=FONT)
    lat.set_title("latency", fontsize=FONT)
    return fig


DRAW: dict[str, Callable[[dict[str, Any]], Any]] = {"latency": latency, "batching": batching, "clients": clients}


def draw(name: str, data: dict[str, Any], folder: Path = CHARTS) -> Path:
    """Write the chart's data (docs/charts/<name>.json) and draw it (<name>.png)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    png = folder / f"{name}.png"
    save_chart(DRAW[name](data), png)
    return png


def main() -> int:
    for name in DRAW:
        source = CHARTS / f"{name}.json"
        if source.exists():
            print(f"drew {draw(name, json.loads(source.read_text(encoding='utf-8')))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
