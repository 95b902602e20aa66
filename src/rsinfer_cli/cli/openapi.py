"""Print the OpenAPI 3.1 document of rsinfer's HTTP API (what `GET /openapi.json` serves), without a server."""

from __future__ import annotations

from pathlib import Path

import typer

from .common import CONFIG_OPT


def openapi_cmd(
    config: Path = CONFIG_OPT,
    output: Path = typer.Option(None, "--output", "-o", help="Write the document to this file instead of stdout."),
) -> None:
    import json
    import sys

    from ..server.openapi import document

    secured = False
    if config is not None:
        from ..config import load_config

        secured = bool(load_config(config).server.api_keys)  # the bearer scheme, as that server would show it
    text = json.dumps(document(secured=secured), indent=2) + "\n"
    if output is None:
        sys.stdout.write(text)
        return
    from .io import check_writable

    check_writable(output, "--output")
    output.write_text(text, encoding="utf-8")
