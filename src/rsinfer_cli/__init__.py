"""rsinfer: embeddings, rerankers, PII redaction and NLI classification on ONNX Runtime.

As a library: `rsinfer_cli.load(path=...)` returns a `Model` whose methods are the CLI's commands (`embed`,
`sparse`, `colbert`, `rerank`, `predict`, `classify`, `detect`, `redact`); see `rsinfer_cli.api`. Ray Data and
Spark adapters: `rsinfer_cli.ray`, `rsinfer_cli.spark`.
"""

__version__ = "0.1.0"

from .api import Label, Model, Ranked, RedactedText, SparseVector, load  # noqa: E402

__all__ = ["Label", "Model", "Ranked", "RedactedText", "SparseVector", "__version__", "load"]
