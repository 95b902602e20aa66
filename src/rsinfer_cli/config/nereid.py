"""nereid-server's `nereid.yaml`, translated into rsinfer's keys: `server.bind_addr` is the KServe gRPC listener,
each model a `kind: tensor` folder under `ml_backends_path`, `device` its EPs, `queue_capacity` its queue."""

from __future__ import annotations

import os
from typing import Any

from .report import Errors, type_name

NEREID_SERVER = ("bind_addr", "ml_backends_path")
NEREID_MODEL = ("name", "device", "queue_capacity", "backend")
NEREID_BACKENDS = {"python": "python", "cpp": "exec", "onnx": "onnx"}
NEREID_UNSERVED = {"rust": "TorchScript .pt", "torch": "TorchScript .pt", "tensorflow": "TensorFlow SavedModel",
                   "cxx": "C++ linked into nereid"}


def is_nereid(data: Any) -> bool:
    """A nereid-server config: its `server` has `bind_addr` or `ml_backends_path`."""
    server = data.get("server") if isinstance(data, dict) else None
    return isinstance(server, dict) and any(k in server for k in NEREID_SERVER)


def from_nereid(data: dict[str, Any], errs: Errors) -> dict[str, Any]:
    """nereid.yaml → the same config in rsinfer's keys."""
    server = data["server"]
    for key in server:
        if key not in NEREID_SERVER:
            errs.add(f"server.{key}", f"unknown key in a nereid config (allowed: {', '.join(NEREID_SERVER)})")
    for key in data:
        if key not in ("server", "models"):
            errs.add(str(key), "unknown key in a nereid config (allowed: server, models)")
    for key in NEREID_SERVER:
        if not isinstance(server.get(key), str) or not server.get(key):
            errs.add(f"server.{key}", "required: a string")
    root = str(server.get("ml_backends_path") or "")
    raw_list = data.get("models")
    models = []
    for i, m in enumerate(raw_list if isinstance(raw_list, list) else []):
        if not isinstance(m, dict):
            errs.add(f"models[{i}]", f"expected a mapping, got {type_name(m)}")
            continue
        models.append(_model(m, root, f"models[{i}]", errs))
    bind = server.get("bind_addr")
    return {"server": {"grpc_bind": bind} if isinstance(bind, str) and bind else {}, "models": models}


def _model(m: dict[str, Any], root: str, where: str, errs: Errors) -> dict[str, Any]:
    for key in m:
        if key not in NEREID_MODEL:
            errs.add(f"{where}.{key}", f"unknown key in a nereid config (allowed: {', '.join(NEREID_MODEL)})")
    out: dict[str, Any] = {"name": m.get("name"), "kind": "tensor", "path": os.path.join(root, str(m.get("name", "")))}
    out.update(_device(m.get("device", "cpu"), where, errs))
    if "queue_capacity" in m:
        qc = m["queue_capacity"]
        if not isinstance(qc, int) or isinstance(qc, bool) or qc <= 0:
            errs.add(f"{where}.queue_capacity", f"must be > 0, got {qc!r}")
        else:
            out["max_queue"] = qc
    backend = m.get("backend")
    if backend is None:
        return out
    if backend in NEREID_UNSERVED:
        errs.add(f"{where}.backend", f"'{backend}' ({NEREID_UNSERVED[backend]}) is not served by rsinfer; "
                                     "export the model to ONNX, or wrap it in a python main.py")
    elif backend not in NEREID_BACKENDS:
        errs.add(f"{where}.backend", f"must be one of {', '.join(NEREID_BACKENDS)}, got {backend!r}")
    else:
        out["backend"] = NEREID_BACKENDS[backend]
    return out


def _device(device: Any, where: str, errs: Errors) -> dict[str, Any]:
    """nereid's `device` (cpu, cuda, cuda:<index>) → `eps` and `device_id`."""
    if device == "cpu":
        return {"eps": ["cpu"]}
    if isinstance(device, str) and (device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit())):
        return {"eps": ["cuda", "cpu"], "device_id": int(device[5:]) if ":" in device else 0}
    errs.add(f"{where}.device", f"must be cpu, cuda or cuda:<index>, got {device!r}")
    return {}
