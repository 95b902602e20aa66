"""The engine: ORT sessions, session pools, graph feeds and the model registry (no transports)."""
