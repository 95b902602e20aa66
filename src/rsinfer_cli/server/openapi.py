"""OpenAPI 3.1 from the route table of `schemas.py`: every route and alias, request and response schemas, the error
bodies of each family, and the bearer scheme when API keys are configured."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from .. import families
from .schemas import KServeError, Op, OpenAIError, all_ops

ERRORS = {
    "openai": {"400": "Bad input", "401": "Missing or invalid API key", "404": "Unknown model", "408": "Too slow",
               "413": "Too large: body, texts or characters", "422": "Malformed body: a field missing or mistyped",
               "429": "Queue full; retry later", "503": "Waited too long for a replica"},
    "kserve": {"400": "Bad tensor or request", "401": "Missing or invalid API key", "404": "Unknown model or version",
               "408": "Too slow", "413": "Body too large", "422": "Malformed body",
               "429": "Queue full; retry later", "503": "Waited too long for a replica"},
}
REF = "#/components/schemas/{name}"


class _Components:
    def __init__(self) -> None:
        self.schemas: dict[str, Any] = {}

    def schema(self, tp: Any) -> dict[str, Any]:
        """A JSON Schema (2020-12, what OpenAPI 3.1 uses) for a Struct or type; Structs become components."""
        (schema,), components = msgspec.json.schema_components([tp], ref_template=REF)
        self.schemas.update(components)
        return dict(schema)


def _operation(op: Op, path: str, comps: _Components, secured: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"summary": op.summary, "tags": [op.tag],
                           "operationId": re.sub(r"\W+", "_", f"{op.method.lower()}_{path}").strip("_") or "root"}
    params = re.findall(r"{(\w+)}", path)
    if params:
        out["parameters"] = [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
                             for p in params]
    if op.request is not None:
        out["requestBody"] = {"required": True,
                              "content": {"application/json": {"schema": comps.schema(op.request)}}}
    ok: dict[str, Any] = {"description": "OK"}
    if op.response in ("text", "html"):
        ok["content"] = {f"text/{'plain' if op.response == 'text' else 'html'}": {"schema": {"type": "string"}}}
    elif op.response not in (None, "empty"):
        ok["content"] = {"application/json": {"schema": comps.schema(op.response)}}
    responses: dict[str, Any] = {"200": ok}
    error_schema = comps.schema(KServeError if op.errors == "kserve" else OpenAIError)
    for status, why in sorted({**ERRORS[op.errors], **dict(op.more)}.items()):
        if status == "401" and (op.open or not secured):
            continue
        responses[status] = {"description": why, "content": {"application/json": {"schema": error_schema}}}
    out["responses"] = responses
    if secured and op.open:
        out["security"] = []
    return out


def document(secured: bool = False) -> dict[str, Any]:
    """The OpenAPI 3.1 document of rsinfer's HTTP API (`secured`: API keys are configured)."""
    comps = _Components()
    paths: dict[str, dict[str, Any]] = {}
    for op in all_ops():
        for path in op.paths:
            paths.setdefault(path, {})[op.method.lower()] = _operation(op, path, comps, secured)
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "rsinfer", "version": "1",   # the API's, never the server's version (no banners)
                 "description": "Embeddings, rerankers, PII redaction, NLI classification and tensors on ONNX "
                                "Runtime, in the shapes of OpenAI, TEI, Cohere, Jina, vLLM, Hugging Face and "
                                "KServe v2."},
        "tags": [{"name": t} for t in ("operations", *(f.kind for f in families.all_families()), "huggingface")],
        "paths": dict(sorted(paths.items())),
        "components": {"schemas": dict(sorted(comps.schemas.items()))},
    }
    if secured:
        doc["components"]["securitySchemes"] = {"bearerAuth": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearerAuth": []}]
    return doc


DOCS_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>rsinfer API</title>
<link rel="stylesheet" href="/docs/assets/swagger-ui.css"></head>
<body><div id="swagger-ui"></div>
<script src="/docs/assets/swagger-ui-bundle.js"></script>
<script>window.ui = SwaggerUIBundle({url: "/openapi.json", dom_id: "#swagger-ui", deepLinking: true});</script>
</body></html>
"""
