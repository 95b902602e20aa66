"""Run an OpenAI batch file (`{custom_id, method, url, body}` per line) through the routes `rsinfer serve` would
answer on the same config, in this process: one answer line per request, in order, as vLLM's run_batch.

With --output FILE a rerun resumes: the requests already answered there are skipped, the rest appended."""

from __future__ import annotations

from pathlib import Path

import typer

EXAMPLES = """

Examples:

  rsinfer batch requests.jsonl --config cfg.yaml > results.jsonl

  rsinfer batch requests.jsonl --config cfg.yaml --output results.jsonl   # rerun to resume after a stop

Each line: {"custom_id": "r1", "method": "POST", "url": "/v1/embeddings", "body": {"model": "minilm", "input": "..."}}
Each answer: {"id": "batch_req_…", "custom_id": "r1", "response": {"status_code": 200, "request_id": "…",
"body": {…}}, "error": null}. A request the server refuses is answered with its 4xx status and error body.
"""


def batch_cmd(
    requests: Path = typer.Argument(..., help="The batch file: JSONL, one request a line."),
    config: Path = typer.Option(..., "--config", "-c", help="YAML config file (also $RSINFER_CONFIG).",
                                envvar="RSINFER_CONFIG", show_envvar=False),
    output: Path = typer.Option(None, "--output", "-o", help="Append the answers here (default: stdout); a rerun "
                                "skips the custom_ids already answered in it."),
    concurrency: int = typer.Option(None, "--concurrency", help="Requests in flight at once (default: 4 per CPU)."),
) -> None:
    import sys

    from ..config import load_config
    from ..engine.threads import usable_cpus
    from ..errors import ConfigError
    from ..server.batch import read_requests, run_batch
    from .io import check_writable

    if concurrency is not None and not 1 <= concurrency <= 1024:
        raise ConfigError(f"--concurrency must be 1..1024, got {concurrency}")
    if output is not None:
        check_writable(output, "--output")
    read_requests(requests)                 # a bad line fails before any model loads
    cfg = load_config(config)
    written, failed, skipped = run_batch(cfg, requests, output, concurrency or 4 * usable_cpus().count)
    note = f", {skipped} answered before" if skipped else ""
    print(f"rsinfer: answered {written} request(s), {failed} with an error status{note}", file=sys.stderr)


batch_cmd.__doc__ = (__doc__ or "") + EXAMPLES
