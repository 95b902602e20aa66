"""Benchmark a model in-process on each execution provider, or a running server over HTTP (`--url`)."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import typer

from .common import CONFIG_OPT, DTYPE_OPT, HF_OPT, PATH_OPT, REVISION_OPT, Dtype, Kind, phases, print_json, progress_bar
from .quantize import GATES, SPEED_OPT, GateFlags, finish, gate_command, labelled

EXAMPLES = """

Examples:

  rsinfer bench --path models/minilm --eps cpu,cuda,tensorrt --batch-sizes 1,8,32 --seq-lens 16,128

  rsinfer bench --url http://127.0.0.1:8080 --route /v1/embeddings --concurrency 16 --duration 30
"""

WORDS = ("the order shipped late and the invoice listed the wrong address so the customer asked support to "
         "refund the card before friday while the warehouse team checked the tracking history of every parcel "
         "printing presses changed how ideas spread across europe in the fifteenth century").split()


def builtin_corpus(n: int = 512, seed: int = 7) -> list[str]:
    """Deterministic texts of mixed length (5 to 120 words)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 120))) for _ in range(n)]


def percentiles(xs: list[float]) -> dict[str, float]:
    import numpy as np

    if not xs:
        return {"p50_ms": 0.0, "p95_ms": 0.0, "p99_ms": 0.0}
    a = np.array(xs) * 1000
    return {"p50_ms": float(np.percentile(a, 50)), "p95_ms": float(np.percentile(a, 95)),
            "p99_ms": float(np.percentile(a, 99))}


def _ints(value: str, option: str) -> list[int]:
    from ..errors import ConfigError

    try:
        out = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{option} must be comma-separated integers, got '{value}'") from None
    if not out or any(x < 1 for x in out):
        raise ConfigError(f"{option} must list integers >= 1, got '{value}'")
    return out


def _shapes(values: list[str]) -> dict[str, list[int]]:
    """`--shape NAME=d0,d1` options → {NAME: [d0, d1]}."""
    from ..errors import ConfigError

    out: dict[str, list[int]] = {}
    for value in values:
        name, sep, dims = value.partition("=")
        if not sep or not name:
            raise ConfigError(f"--shape must be NAME=d0,d1,…, got '{value}'")
        out[name] = _ints(dims, f"--shape {name}")
    return out


# ---------------------------------------------------------------- in-process


def bench_in_process(cfg: Any, server: Any, eps: list[str], batch_sizes: list[int], seq_lens: list[int],
                     warmup: int, repeats: int, shapes: dict[str, list[int]] | None = None) -> list[dict[str, Any]]:
    from ..config import EPS
    from ..engine.session import PROVIDERS, available_providers
    from ..errors import ConfigError

    unknown = [e for e in eps if e not in EPS]
    if unknown:
        raise ConfigError(f"--eps: unknown {', '.join(unknown)} (one of {', '.join(EPS)})")
    available = available_providers()
    rows: list[dict[str, Any]] = []
    with progress_bar(len(eps) * len(batch_sizes) * len(seq_lens), "bench") as bar:
        task = bar.add_task("bench", total=len(eps) * len(batch_sizes) * len(seq_lens))
        for ep in eps:
            if PROVIDERS[ep] not in available:
                rows.append({"ep": ep, "skipped": f"{PROVIDERS[ep]} is not installed in this onnxruntime build"})
                bar.advance(task, len(batch_sizes) * len(seq_lens))
                continue
            pipe = _ep_pipeline(cfg, server, ep, max(batch_sizes), shapes)
            if isinstance(pipe, str):
                rows.append({"ep": ep, "skipped": pipe})
                bar.advance(task, len(batch_sizes) * len(seq_lens))
                continue
            for seq in seq_lens:
                for batch in batch_sizes:
                    times = _timed(pipe, batch, seq, shapes, warmup, repeats)
                    rows.append({"ep": ep, "batch": batch, "seq_len": seq, "rows_per_s": batch * len(times) /
                                 sum(times), **percentiles(times)})
                    bar.advance(task)
    base = {(r["batch"], r["seq_len"]): r["rows_per_s"] for r in rows if r["ep"] == eps[0] and "rows_per_s" in r}
    for r in rows:
        if "rows_per_s" in r and (r["batch"], r["seq_len"]) in base:
            r["speedup"] = r["rows_per_s"] / base[(r["batch"], r["seq_len"])]
    return rows


def _ep_pipeline(cfg: Any, server: Any, ep: str, max_batch: int, shapes: dict[str, list[int]] | None) -> Any:
    """The model's pipeline on one replica of `ep` alone; a string when the session fell back to another EP."""
    import dataclasses

    from ..config import hub_cache_dir
    from ..engine.model import load_model
    from ..errors import ConfigError, InputError, ModelLoadError
    from ..pipelines import build_pipeline

    run_cfg = dataclasses.replace(cfg, eps=(ep,), replicas=1)
    if cfg.kind == "tensor" and cfg.max_batch_size == 0:  # batch sizes along dimension 0
        run_cfg = dataclasses.replace(run_cfg, max_batch_size=max_batch)
    model = load_model(run_cfg, server, hub_cache_dir(server.hf_cache_dir))
    if model.providers[0] != ep:
        return f"the session fell back to {model.providers[0]}"
    try:
        pipe = build_pipeline(model)
    except ModelLoadError:  # a graph without a batch dimension: run it as it is
        model.config = dataclasses.replace(model.config, max_batch_size=0)
        pipe = build_pipeline(model)
    try:
        pipe.sample_rows(1, 1, shapes)  # a --shape that does not fit is an option error
    except InputError as exc:
        raise ConfigError(str(exc)) from None
    return pipe


def _timed(pipe: Any, batch: int, seq: int, shapes: dict[str, list[int]] | None, warmup: int,
           repeats: int) -> list[float]:
    """Seconds of each of `repeats` forwards of `batch` rows of `seq` (the family's rows of that shape), after
    `warmup` untimed ones."""
    session = pipe.model.sessions[0]
    sample, _ = pipe.sample_rows(batch, seq, shapes)
    for _ in range(warmup):
        pipe.forward(session, sample)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        pipe.forward(session, sample)
        times.append(time.perf_counter() - t0)
    return times


# ---------------------------------------------------------------- HTTP


def request_body(route: str, model: str | None, texts: list[str]) -> dict[str, Any]:
    """The body `route` takes for these texts, from the family that serves the route."""
    from .. import families
    from ..errors import ConfigError

    r = route.rstrip("/") or "/"
    for family in families.all_families():
        make = family.bench_bodies().get(r)
        if make is not None:
            body: dict[str, Any] = dict(make(texts))
            if model:
                body["model"] = model
            return body
    raise ConfigError(f"--route {route}: not one of rsinfer's POST routes")


async def _drive(url: str, route: str, model: str | None, corpus: list[str], concurrency: int, requests: int,
                 duration: float, per_request: int, advance: Any) -> dict[str, Any]:
    import asyncio

    import aiohttp

    latencies: list[float] = []
    statuses: dict[str, int] = {}
    texts_done = 0
    next_i = 0
    deadline = time.monotonic() + duration
    started = time.perf_counter()

    async def client(http: aiohttp.ClientSession) -> None:
        nonlocal texts_done, next_i
        while next_i < requests and time.monotonic() < deadline:
            i = next_i
            next_i += 1
            texts = [corpus[(i * per_request + k) % len(corpus)] for k in range(per_request)]
            t0 = time.perf_counter()
            try:
                async with http.post(url.rstrip("/") + route, json=request_body(route, model, texts)) as r:
                    await r.read()
                    key = str(r.status)
            except (aiohttp.ClientError, TimeoutError) as exc:
                key = type(exc).__name__
            statuses[key] = statuses.get(key, 0) + 1
            if key == "200":
                latencies.append(time.perf_counter() - t0)
                texts_done += per_request
            advance()

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=max(duration, 30))) as http:
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    ok = statuses.get("200", 0)
    return {"url": url, "route": route, "concurrency": concurrency, "requests": sum(statuses.values()),
            "ok": ok, "seconds": elapsed, "requests_per_s": ok / elapsed if elapsed else 0.0,
            "texts_per_s": texts_done / elapsed if elapsed else 0.0, "errors": {k: v for k, v in statuses.items()
                                                                             if k != "200"},
            **percentiles(latencies)}


def bench_http(url: str, route: str, model: str | None, corpus: list[str], concurrency: int, requests: int,
               duration: float, per_request: int) -> dict[str, Any]:
    import asyncio

    with progress_bar(requests, route) as bar:
        task = bar.add_task(route, total=requests)
        return asyncio.run(_drive(url, route, model, corpus, concurrency, requests, duration, per_request,
                                  lambda: bar.advance(task)))


# ---------------------------------------------------------------- command


@gate_command
def bench_cmd(
    url: str = typer.Option(None, "--url", help="Benchmark a running server at this base URL (HTTP mode)."),
    route: str = typer.Option("/v1/embeddings", "--route", help="HTTP mode: the POST route to drive."),
    concurrency: int = typer.Option(16, "--concurrency", help="HTTP mode: clients sending at once."),
    requests: int = typer.Option(1000, "--requests", help="HTTP mode: at most this many requests."),
    duration: float = typer.Option(60.0, "--duration", help="HTTP mode: at most this many seconds."),
    texts_per_request: int = typer.Option(1, "--texts-per-request", help="HTTP mode: texts in each request."),
    corpus: Path = typer.Option(None, "--corpus", help="Texts, one per line (default: a built-in mixed corpus)."),
    eps: str = typer.Option("cpu", "--eps", help="In-process: execution providers to compare, e.g. cpu,cuda."),
    batch_sizes: str = typer.Option("1,8,32", "--batch-sizes", help="In-process: rows per forward."),
    seq_lens: str = typer.Option("16,128", "--seq-lens", help="In-process: tokens per row (tensor models: the size "
                                 "of their other variable dimensions)."),
    shape: list[str] = typer.Option(None, "--shape", help="In-process, tensor models: NAME=d0,d1,… the shape of an "
                                    "input (repeatable; dimension 0 becomes each --batch-sizes value)."),
    warmup: int = typer.Option(3, "--warmup", help="In-process: untimed forwards first."),
    repeats: int = typer.Option(20, "--repeats", help="In-process: timed forwards per shape."),
    model: str = typer.Option(None, "--model", "-m", help="Model name (in --config, or sent to --url)."),
    config: Path = CONFIG_OPT,
    path: Path = PATH_OPT,
    hf: str = HF_OPT,
    revision: str = REVISION_OPT,
    dtype: Dtype = DTYPE_OPT,
    kind: Kind = typer.Option(None, "--kind", help="Pipeline of a --path/--hf model (default: from config.json)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON for programs instead of a table."),
    compare: tuple[str, str] = typer.Option((None, None), "--compare",
                                            help="In-process: the quality gate between two graphs of the model, "
                                                 "each FILE, FILE@EP or @EP (e.g. onnx/model.onnx "
                                                 "onnx/model_quantized.onnx, or @cpu @openvino): the family's "
                                                 "measures on --corpus (default: 300 varied texts) and the speed "
                                                 "ratio; the --min-*/--max-* bars exit 7 when missed."),
    gates: GateFlags = GATES,
    speed_seconds: float = SPEED_OPT,
) -> None:
    from ..errors import ConfigError

    if url is not None:
        _check_http(url, concurrency, requests, texts_per_request, duration)
        request_body(route, model, [])  # validates the route before any traffic
        res = bench_http(url, route, model, _corpus(corpus), concurrency, requests, duration, texts_per_request)
        if json_out:
            print_json(res)
        else:
            _http_table(res)
        return
    from .common import guess_source_kind, model_from_options

    ep_list = [e.strip() for e in eps.split(",") if e.strip()]
    if not ep_list:
        raise ConfigError("--eps is empty")
    if warmup < 0 or repeats < 1:
        raise ConfigError("--warmup must be >= 0 and --repeats >= 1")
    shapes = _ints(batch_sizes, "--batch-sizes"), _ints(seq_lens, "--seq-lens")  # checked before any loading
    cfg, server = model_from_options(name=model, config=config, path=path, hf=hf, revision=revision, dtype=dtype,
                                     kind=kind, replicas=1)
    if kind is None and (path is not None or hf is not None):
        import dataclasses

        from ..config import hub_cache_dir

        cfg = dataclasses.replace(cfg, kind=guess_source_kind(cfg, hub_cache_dir(server.hf_cache_dir))[0])
    if compare[0] is not None:
        _compare(cfg, server, compare, corpus, gates, json_out, speed_seconds)
        return
    rows = bench_in_process(cfg, server, ep_list, *shapes, warmup, repeats, _shapes(shape or []))
    if json_out:
        print_json({"model": cfg.name, "kind": cfg.kind, "results": rows})
    else:
        _ep_table(cfg.name, rows)


def _compare(cfg: Any, server: Any, sides: tuple[str, str], corpus: Path | None, gates: GateFlags,
             json_out: bool, speed_seconds: float) -> None:
    """`--compare A B`: the model with graph/EP A against the model with graph/EP B."""
    import dataclasses

    from ..config import EPS, hub_cache_dir
    from ..errors import ConfigError
    from ..pipelines.quality import compare
    from ..pipelines.quality import corpus as builtin

    configs = []
    for side in sides:
        file, _, ep = side.partition("@")
        if ep and ep not in EPS:
            raise ConfigError(f"--compare {side}: unknown execution provider '{ep}' (one of {', '.join(EPS)})")
        configs.append(dataclasses.replace(cfg, file=file or cfg.file, eps=(ep,) if ep else cfg.eps, replicas=1))
    texts = _corpus(corpus) if corpus is not None else builtin()
    with phases(3 if speed_seconds > 0 else 2) as step:
        report = compare(configs[0], configs[1], server, texts, cache_dir=hub_cache_dir(server.hf_cache_dir),
                         speed_seconds=speed_seconds, on_step=labelled(step, len(texts), speed_seconds))
    finish(report, gates, {"model": cfg.name, "a": sides[0], "b": sides[1],
                           "check": {"kind": report.kind, **report.metrics, **report.speed}}, json_out)


def _check_http(url: str, concurrency: int, requests: int, texts_per_request: int, duration: float) -> None:
    from ..errors import ConfigError

    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--url must start with http:// or https://, got '{url}'")
    for name, value in (("--concurrency", concurrency), ("--requests", requests),
                        ("--texts-per-request", texts_per_request)):
        if value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")
    if duration <= 0:
        raise ConfigError(f"--duration must be > 0, got {duration}")


def _corpus(corpus: Path | None) -> list[str]:
    """--corpus's texts, one per non-blank line; the built-in corpus without it."""
    from .io import read_texts

    return builtin_corpus() if corpus is None else read_texts(corpus, "--corpus")


def _ep_table(name: str, rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{name}: forwards per execution provider", title_justify="left")
    for col in ("EP", "batch", "seq", "rows/s", "p50 ms", "p95 ms", "p99 ms", "speed-up"):
        t.add_column(col, justify="left" if col == "EP" else "right")
    skipped = [r for r in rows if "skipped" in r]
    for r in rows:
        if "skipped" in r:
            t.add_row(r["ep"], "-", "-", "[yellow]skipped[/]", "-", "-", "-", "-")
            continue
        t.add_row(r["ep"], str(r["batch"]), str(r["seq_len"]), f"{r['rows_per_s']:.1f}", f"{r['p50_ms']:.2f}",
                  f"{r['p95_ms']:.2f}", f"{r['p99_ms']:.2f}", f"{r.get('speedup', 1.0):.2f}x")
    con = Console()
    con.print(t)
    for r in skipped:
        con.print(f"[yellow]{r['ep']} skipped:[/] {r['skipped']}")


def _http_table(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{res['url']}{res['route']} at concurrency {res['concurrency']}", title_justify="left")
    for col in ("requests", "ok", "req/s", "texts/s", "p50 ms", "p95 ms", "p99 ms", "errors"):
        t.add_column(col, justify="right")
    errors = ", ".join(f"{k}: {v}" for k, v in sorted(res["errors"].items())) or "none"
    t.add_row(str(res["requests"]), str(res["ok"]), f"{res['requests_per_s']:.1f}", f"{res['texts_per_s']:.1f}",
              f"{res['p50_ms']:.1f}", f"{res['p95_ms']:.1f}", f"{res['p99_ms']:.1f}", errors)
    Console().print(t)


bench_cmd.__doc__ = (__doc__ or "") + EXAMPLES
