"""An rsinfer model family from another package: `kind: logits` serves a sequence classifier's raw logits, divided
by the model's `temperature`. rsinfer finds it through the entry point in pyproject.toml; everything it declares is
referred to by "module:attribute", imported on first use, so `rsinfer --help` stays fast."""

from rsinfer_cli.families import Family

FAMILY = Family(
    kind="logits",
    summary="raw logits of a sequence classifier (example plug-in)",
    pipeline="rsinfer_logits.pipeline:LogitsPipeline",
    options="rsinfer_logits.pipeline:LogitsOptions",
    routes="rsinfer_logits.routes:routes",
    ops="rsinfer_logits.routes:OPS",
    bench="rsinfer_logits.routes:BENCH",
    commands=(("logits", "rsinfer_logits.cli:logits_cmd"),),
)
