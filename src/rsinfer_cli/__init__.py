"""rsinfer: embeddings, rerankers, PII redaction and NLI classification on ONNX Runtime."""

__version__ = "0.1.0"
