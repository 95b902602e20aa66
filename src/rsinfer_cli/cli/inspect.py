"""Show a model's graph, the file chosen and why, execution providers, and what the pipeline will do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from .common import (
    CONFIG_OPT,
    DTYPE_OPT,
    FILE_OPT,
    HF_OPT,
    JSON_OPT,
    PATH_OPT,
    REVISION_OPT,
    SUBFOLDER_OPT,
    TOKENIZER_HF_OPT,
    Dtype,
    Kind,
    print_json,
)

KIND_OPT = typer.Option(None, "--kind", help="Pipeline to describe (default: from config.json architectures).")


def inspect_report(model: Any, kind_reason: str, plan: Any = None) -> dict[str, Any]:
    """`plan`: the thread plan `serve` would make (engine/threads.py); the model's own threads without it."""
    from ..engine.session import SHORT, available_providers
    from ..pipelines import describe

    r = model.resolved
    threads = plan.models.get(model.key, model.threads) if plan is not None else model.threads
    return {
        "name": model.name,
        "kind": model.kind,
        "kind_reason": kind_reason,
        "source": r.source,
        "backend": model.backend,
        **({"program": model.program} if model.program else {}),
        "provenance": r.provenance(),
        "graph": {
            "file": r.graph_file,
            "reason": r.graph_reason,
            "candidates": list(r.candidates),
            "external_data": list(r.external_data),
            "bytes": model.stats.get("file_bytes"),
            "inputs": [t.to_json() for t in model.graph.inputs],
            "outputs": [t.to_json() for t in model.graph.outputs],
        },
        "execution_providers": {
            "available": [SHORT.get(p, p) for p in available_providers()],
            "requested": list(model.eps.requested),
            "resolved": model.providers,
            "skipped": [{"ep": ep, "reason": why} for ep, why in model.eps.skipped],
        },
        "tokenizer": {"file": r.aux_origin.get("tokenizer.json"),
                      "max_len": model.max_len if r.tokenizer_path else None,
                      "max_len_source": model.max_len_source if r.tokenizer_path else "no tokenizer"},
        "aux_files": r.aux_origin,
        "pipeline": describe(model),
        "warmup": model.stats.get("warmup"),     # what `warmup:` ran (engine/warmup.py), None without one
        "threads": {**threads.to_json(), "plan": threads.describe(),
                    **({"cpus": plan.cpus.to_json(), "warnings": list(plan.warnings)} if plan is not None else {})},
    }


def _print_table(rep: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    con = Console()
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("model", f"{rep['name']} ({rep['kind']}: {rep['kind_reason']})")
    head.add_row("source", rep["source"])
    if rep["backend"] != "onnx":
        head.add_row("backend", f"{rep['backend']}: {rep.get('program', '')}")
    if rep["provenance"].get("commit"):
        head.add_row("commit", rep["provenance"]["commit"])
    g = rep["graph"]
    head.add_row("graph", f"{g['file']} ({(g['bytes'] or 0) / 2**20:.1f} MiB)")
    head.add_row("why", g["reason"])
    if g["external_data"]:
        head.add_row("external data", ", ".join(g["external_data"]))
    ep = rep["execution_providers"]
    head.add_row("EPs", f"resolved {', '.join(ep['resolved'])} (requested {', '.join(ep['requested'])}; "
                        f"available {', '.join(ep['available'])})")
    for s in ep["skipped"]:
        head.add_row("", f"[yellow]skipped {s['ep']}: {s['reason']}[/]")
    tok = rep["tokenizer"]
    head.add_row("max_len", f"{tok['max_len']} ({tok['max_len_source']})")
    th = rep["threads"]
    if "cpus" in th:
        head.add_row("CPUs", f"{th['cpus']['count']} ({'; '.join(th['cpus']['why'])})")
    head.add_row("threads", th["plan"])
    ran = rep["warmup"]
    head.add_row("warm-up", f"{ran['forwards']} forwards ({', '.join(ran['shapes'])}) in {ran['seconds']:.2f}s"
                 if ran else "none (models[].warmup)")
    for w in th.get("warnings", ()):
        head.add_row("", f"[yellow]{escape(w)}[/]")
    for key, value in rep["pipeline"].items():
        if key == "kind":
            continue
        if isinstance(value, list):
            text = ", ".join(map(str, value)) if key != "modules" else " → ".join(map(str, value))
        elif isinstance(value, dict):
            text = ", ".join(f"{k}: {v!r}" for k, v in value.items()) or "none"
        else:
            text = str(value)
        head.add_row(key, escape(text))
    con.print(head)
    for title in ("inputs", "outputs"):
        t = Table(title=f"graph {title}", title_justify="left")
        for col in ("name", "dtype", "shape"):
            t.add_column(col)
        for item in g[title]:
            t.add_row(item["name"], item["dtype"], escape("[" + ", ".join(str(d) for d in item["shape"]) + "]"))
        con.print(t)


def inspect_cmd(
    name: str = typer.Argument(None, help="Model name in the config (with --config)."),
    config: Path = CONFIG_OPT,
    path: Path = PATH_OPT,
    hf: str = HF_OPT,
    revision: str = REVISION_OPT,
    file: str = FILE_OPT,
    subfolder: str = SUBFOLDER_OPT,
    tokenizer_hf: str = TOKENIZER_HF_OPT,
    dtype: Dtype = DTYPE_OPT,
    kind: Kind = KIND_OPT,
    json_out: bool = JSON_OPT,
) -> None:
    import dataclasses

    from .. import families
    from ..config import hub_cache_dir, load_config
    from ..engine.model import load_model
    from ..engine.threads import plan_models
    from ..errors import ConfigError
    from .common import guess_source_kind, model_from_options

    if kind is not None and kind not in families.kinds():
        raise ConfigError(f"--kind must be one of {', '.join(families.kinds())}, got '{kind}'")
    cfg, server = model_from_options(name=name, config=config, path=path, hf=hf, revision=revision, file=file,
                                     subfolder=subfolder, tokenizer_hf=tokenizer_hf, dtype=dtype, kind=kind)
    reason = "config" if (path is None and hf is None) else "--kind"
    if (path is not None or hf is not None) and kind is None:
        guessed, reason = guess_source_kind(cfg, hub_cache_dir(server.hf_cache_dir))
        cfg = dataclasses.replace(cfg, kind=guessed)
    # the threads `serve` gives it beside the config's other models; one forward is enough to inspect
    served = [vc for m in load_config(config).models for vc in m.version_configs()] if config is not None else [cfg]
    plan = plan_models(served, server)
    model = load_model(dataclasses.replace(cfg, replicas=1), server, hub_cache_dir(server.hf_cache_dir))
    rep = inspect_report(model, reason, plan)
    if json_out:
        print_json(rep)
    else:
        _print_table(rep)
