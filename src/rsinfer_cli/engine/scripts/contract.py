"""A script model's folder contract: `model_inference.textproto` (nereid's), parsed by protobuf's text-format parser
against a schema written here: `input_shape`, `output_shape`, `max_batch_size`, `data_type` (FP32 by default;
Triton's `TYPE_FP32` spellings too), or `input {}` / `output {}` blocks (name, data_type, shape or dims). A
single-tensor model's tensors are `INPUT0` and `OUTPUT0`. `-1` is a free dimension; with `max_batch_size > 0` the
batch is a leading dimension on top of the declared shape."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...config import ModelConfig
from ...errors import ModelLoadError
from ..session import TensorInfo

CONTRACT_FILE = "model_inference.textproto"
# the contract's datatypes → numpy dtype names (what ORT and the tensor pipeline use)
DTYPES = {"BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
          "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64", "FP16": "float16",
          "FP32": "float32", "FP64": "float64"}

_SCHEMA: Any = None


def _schema() -> Any:
    """The message class of model_inference.textproto, from a schema built here (no protoc step):

        enum DataType { TYPE_INVALID = 0; BOOL = 1; ...; FP64 = 12; TYPE_BOOL = 1; ... }   // allow_alias
        message Tensor { string name = 1; DataType data_type = 2; repeated int64 shape = 3; repeated int64 dims = 4; }
        message ModelInference { repeated int64 input_shape = 1; repeated int64 output_shape = 2;
            int64 max_batch_size = 3; DataType data_type = 4; repeated Tensor input = 5; repeated Tensor output = 6;
            string name = 7; }
    """
    global _SCHEMA
    if _SCHEMA is not None:
        return _SCHEMA
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    f = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="rsinfer/model_inference.proto", package="rsinfer.nereid",
                                             syntax="proto3")
    enum = fdp.enum_type.add(name="DataType")
    enum.options.allow_alias = True
    enum.value.add(name="TYPE_INVALID", number=0)
    for i, dt in enumerate(DTYPES, start=1):
        enum.value.add(name=dt, number=i)
        enum.value.add(name=f"TYPE_{dt}", number=i)
    tensor = fdp.message_type.add(name="Tensor")
    tensor.field.add(name="name", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    tensor.field.add(name="data_type", number=2, type=f.TYPE_ENUM, type_name=".rsinfer.nereid.DataType",
                     label=f.LABEL_OPTIONAL)
    tensor.field.add(name="shape", number=3, type=f.TYPE_INT64, label=f.LABEL_REPEATED)
    tensor.field.add(name="dims", number=4, type=f.TYPE_INT64, label=f.LABEL_REPEATED)
    model = fdp.message_type.add(name="ModelInference")
    model.field.add(name="input_shape", number=1, type=f.TYPE_INT64, label=f.LABEL_REPEATED)
    model.field.add(name="output_shape", number=2, type=f.TYPE_INT64, label=f.LABEL_REPEATED)
    model.field.add(name="max_batch_size", number=3, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    model.field.add(name="data_type", number=4, type=f.TYPE_ENUM, type_name=".rsinfer.nereid.DataType",
                    label=f.LABEL_OPTIONAL)
    model.field.add(name="input", number=5, type=f.TYPE_MESSAGE, type_name=".rsinfer.nereid.Tensor",
                    label=f.LABEL_REPEATED)
    model.field.add(name="output", number=6, type=f.TYPE_MESSAGE, type_name=".rsinfer.nereid.Tensor",
                    label=f.LABEL_REPEATED)
    model.field.add(name="name", number=7, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    _SCHEMA = message_factory.GetMessageClass(pool.FindMessageTypeByName("rsinfer.nereid.ModelInference"))
    return _SCHEMA


@dataclass(frozen=True)
class Contract:
    inputs: tuple[TensorInfo, ...]      # with the batch dimension when max_batch_size > 0
    outputs: tuple[TensorInfo, ...]
    max_batch_size: int
    file: str


def _dtype(value: int, where: str, default: str = "float32") -> str:
    if value == 0:
        return default
    return list(DTYPES.values())[value - 1]


def read_contract(folder: Path, name: str) -> Contract:
    """model_inference.textproto → the declared tensors; every mistake a ModelLoadError with its key path."""
    from google.protobuf import text_format

    path = folder / CONTRACT_FILE
    where = f"{folder.name}/{CONTRACT_FILE}"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ModelLoadError(f"model '{name}': {where} is missing: a script model declares its tensors there "
                             "(at least output_shape)", model=name) from None
    except OSError as exc:
        raise ModelLoadError(f"model '{name}': cannot read {where}: {exc.strerror}", model=name) from None
    msg = _schema()()
    try:
        text_format.Parse(text, msg)
    except text_format.ParseError as exc:
        said = str(exc).replace('Message type "rsinfer.nereid.ModelInference"', "the top level") \
            .replace('Message type "rsinfer.nereid.Tensor"', "an input/output block") \
            .replace('Enum type "rsinfer.nereid.DataType"', "data_type")
        if "data_type has no value named" in said:
            said += f" (one of {', '.join(DTYPES)}, or Triton's TYPE_FP32, ...)"
        raise ModelLoadError(f"model '{name}': {where}: line {said}", model=name) from None
    errors: list[str] = []
    if msg.max_batch_size < 0:
        errors.append(f"max_batch_size: must be >= 0, got {msg.max_batch_size}")
    default = _dtype(msg.data_type, "data_type")

    def dims(values: Any, key: str) -> tuple[int, ...]:
        for i, d in enumerate(values):
            if d == 0 or d < -1:
                errors.append(f"{key}[{i}]: must be -1 (free) or > 0, got {d}")
        return tuple(values)

    def tensors(blocks: Any, flat: Any, key: str, implicit: str) -> list[tuple[str, str, tuple[int, ...]]]:
        if blocks and flat:
            errors.append(f"{key}: give either {key}_shape or {key} {{}} blocks, not both")
        if not blocks:
            return [(implicit, default, dims(flat, f"{key}_shape"))] if flat else []
        out, seen = [], set()
        for i, b in enumerate(blocks):
            at = f"{key}[{i}]"
            if b.shape and b.dims:
                errors.append(f"{at}: give shape or dims, not both")
            tname = b.name or (implicit if len(blocks) == 1 else "")
            if not tname:
                errors.append(f"{at}.name: required when there are several {key} blocks")
            elif tname in seen:
                errors.append(f"{at}.name: duplicate name '{tname}'")
            seen.add(tname)
            out.append((tname, _dtype(b.data_type, f"{at}.data_type", default), dims(b.shape or b.dims,
                                                                                      f"{at}.shape")))
        return out

    ins = tensors(msg.input, msg.input_shape, "input", "INPUT0")
    outs = tensors(msg.output, msg.output_shape, "output", "OUTPUT0")
    if not outs:
        errors.append("output_shape: required (or output {} blocks): every reply is a declared tensor")
    if errors:
        lines = "\n  ".join(f"{where}: {e}" for e in errors)
        raise ModelLoadError(f"model '{name}': {CONTRACT_FILE} is invalid:\n  {lines}", model=name)
    batch = msg.max_batch_size > 0

    def info(t: tuple[str, str, tuple[int, ...]]) -> TensorInfo:
        shape: tuple[int | str | None, ...] = tuple(d if d > 0 else f"{t[0]}_d{i}" for i, d in enumerate(t[2]))
        return TensorInfo(t[0], t[1], (("batch",) if batch else ()) + shape)

    return Contract(inputs=tuple(info(t) for t in ins), outputs=tuple(info(t) for t in outs),
                    max_batch_size=int(msg.max_batch_size), file=where)


def agree_with_graph(cfg: ModelConfig, folder: Path, graph: Any) -> ModelConfig:
    """An ONNX folder that also carries model_inference.textproto (nereid's folders do): the declaration must
    agree with the graph (tensors by name, or by position for one tensor; dtype, rank, fixed dimensions), and its
    max_batch_size applies unless the config sets one."""
    import dataclasses

    c = read_contract(folder, cfg.name)
    problems = []
    for kind, declared, actual in (("input", c.inputs, graph.inputs), ("output", c.outputs, graph.outputs)):
        if len(declared) != len(actual):
            problems.append(f"it declares {len(declared)} {kind}(s), the graph has {len(actual)}")
            continue
        by_name = {t.name: t for t in actual}
        for i, d in enumerate(declared):
            a = by_name.get(d.name, actual[i] if len(actual) == 1 else None)
            if a is None:
                problems.append(f"{kind} '{d.name}' is not in the graph ({', '.join(t.name for t in actual)})")
                continue
            fixed = [(x, y) for x, y in zip(d.shape, a.shape, strict=False) if isinstance(x, int)
                     and isinstance(y, int) and y >= 0]
            if d.dtype != a.dtype or len(d.shape) != len(a.shape) or any(x != y for x, y in fixed):
                problems.append(f"{kind} '{d.name}' is declared {d.dtype} {list(d.shape)}, the graph's '{a.name}' "
                                f"is {a.dtype} {list(a.shape)}")
    if problems:
        raise ModelLoadError(f"model '{cfg.name}': {c.file} disagrees with the graph: {'; '.join(problems)}",
                             model=cfg.name)
    if not cfg.max_batch_size and c.max_batch_size:
        cfg = dataclasses.replace(cfg, max_batch_size=c.max_batch_size)
    return cfg
