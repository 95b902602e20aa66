"""`docs/reference/api.md`, the Python API's reference, generated from the code as the other reference pages are
(`python -m rsinfer_cli.cli.docgen .`; a test diffs it): `load` and `Model`'s methods with their signatures and
docstrings, the result types, the Ray classes, the Spark functions and the column types they answer in."""

from __future__ import annotations

import inspect
from typing import Any


def _signature(fn: Any, name: str) -> str:
    sig = str(inspect.signature(fn)).replace("'", "")
    return f"```python\n{name}{sig}\n```\n"


def _doc(obj: Any) -> str:
    return inspect.cleandoc(obj.__doc__ or "").strip() + "\n"


def api_md() -> str:
    from .. import api, ray, spark
    from ..api import arrow, model

    out = ["# Python API reference\n", "Generated from the code (`rsinfer_cli.api`, `rsinfer_cli.ray`, "
           "`rsinfer_cli.spark`); the guide is [Bulk jobs](../bulk.md).\n", "## rsinfer_cli.load\n",
           _signature(api.load, "rsinfer_cli.load"), _doc(api.load), "## Model\n", _doc(model.Model)]
    out += ["| property | what |", "|---|---|"]
    for prop in ("name", "kind", "chunk_rows"):
        out.append(f"| `{prop}` | {_doc(getattr(model.Model, prop)).strip()} |")
    out.append("")
    methods = [n for n, v in vars(model.Model).items() if callable(v) and not n.startswith("_")]
    for name in methods:           # every public method, in the class's order: a new one is documented at once
        fn = getattr(model.Model, name)
        out += [f"### Model.{name}\n", _signature(fn, name), _doc(fn)]
    out.append("## Result types\n")
    import dataclasses

    for cls in (model.SparseVector, model.Ranked, model.Label, model.RedactedText):
        fields = getattr(cls, "_fields", None) or tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
        out.append(f"- `{cls.__name__}({', '.join(fields)})`: {_doc(cls).strip()}")
    out.append("- `Entity`, `Redacted` (a span of `RedactedText.spans`), `ZeroShot`, `TrueFalse`: the pipelines' own "
               "types, with `to_json()`.\n")
    out += ["## Column types (Ray, Spark, Parquet)\n", _doc(arrow)]
    out += ["## rsinfer_cli.ray\n", _doc(ray)]
    for name in ray.__all__:
        out.append(f"- `rsinfer_cli.ray.{name}`: {_doc(getattr(ray, name)).strip()}")
    out += ["", "## rsinfer_cli.spark\n", _doc(spark)]
    for name in spark.__all__:
        fn = getattr(spark, name)
        out.append(f"- `rsinfer_cli.spark.{name}(path=None, **keys)`: {_doc(fn).strip()}")
    return "\n".join(out) + "\n"
