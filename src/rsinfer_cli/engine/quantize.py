"""Smaller and faster graphs from a model's fp32 graph, written beside it under the names the resolver ranks for
`dtype:` (hub.DTYPE_FIRST), never over it - with onnxruntime's own tools, as optimum-cli does:

    int8      onnxruntime.quantization.quantize_dynamic: weights int8 (per output channel with `per_channel`),
              activations quantized at run time; the graph first goes through quant_pre_process (ONNX and
              symbolic shape inference - ONNX's alone where the symbolic one gives up, as on torch dynamo's
              exports), as onnxruntime's quantization guide asks
    fp16      onnxruntime.transformers.float16.convert_float_to_float16 with keep_io_types: the graph's inputs
              and outputs stay float32, so every pipeline feeds and reads it unchanged
    optimize  onnxruntime.transformers.optimizer.optimize_model (BERT-family fusions: attention, LayerNorm,
              GELU, bias adds), before quantizing or alone

A graph over 2 GB (or with external data) is written with its weights as external data beside it. Needs the `onnx`
package (`pip install 'rsinfer[quantize]'`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ModelLoadError

DTYPES = ("int8", "fp16", "fp32")
# the file each result gets beside the source graph; the resolver ranks these names for `dtype:` (hub.DTYPE_FIRST)
OUTPUT_NAMES = {("int8", False): "model_quantized.onnx", ("int8", True): "model_optimized_quantized.onnx",
                ("fp16", False): "model_fp16.onnx", ("fp16", True): "model_optimized_fp16.onnx",
                ("fp32", True): "model_optimized.onnx"}
PROTOBUF_LIMIT = 2 << 30      # a graph past it must keep its weights as external data
# ops of an already quantized graph whose scales must stay float32 under fp16 (opset < 19 allows no float16
# scale); MatMulNBits takes float16 inputs and scales, and converts with the rest
QUANTIZED_OPS = ("DequantizeLinear", "QuantizeLinear", "DynamicQuantizeLinear", "MatMulInteger",
                 "DynamicQuantizeMatMul", "QLinearMatMul")


@dataclass(frozen=True)
class Quantized:
    source: Path
    output: Path
    dtype: str
    per_channel: bool
    optimized: bool
    bytes: int             # the new graph with its external data
    source_bytes: int


def require_onnx() -> None:
    import importlib.util

    missing = [m for m in ("onnx", "sympy") if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"quantizing needs the {' and '.join(missing)} package{'s' if len(missing) > 1 else ''}: "
                          "pip install 'rsinfer[quantize]'")


def output_path(source: Path, dtype: str, optimize: bool, out: Path | None = None) -> Path:
    """Where the result goes: `out`, else beside `source` under the name the resolver ranks for the dtype."""
    if dtype not in DTYPES or (dtype, optimize) not in OUTPUT_NAMES:
        raise ConfigError(f"--dtype must be int8 or fp16 (or fp32 with --optimize), got '{dtype}'")
    path = out if out is not None else source.parent / OUTPUT_NAMES[(dtype, optimize)]
    if path.resolve() == source.resolve():
        raise ConfigError(f"{path} is the source graph; rsinfer quantize never writes over it")
    if path.suffix != ".onnx":
        raise ConfigError(f"--out must end in .onnx, got '{path}'")
    return path


MARK = "rsinfer.quantize"      # a metadata key of every graph rsinfer quantize writes: what it may write over


def _header(path: Path) -> Any:
    """The graph without its weights; ModelLoadError naming the file when it is not a readable ONNX graph."""
    import onnx

    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError, onnx's own, OSError
        raise ModelLoadError(f"{path} is not an ONNX graph onnx can read ({type(exc).__name__}: {exc})") from None


def written_by_us(path: Path) -> bool:
    """Whether `path` is a graph an earlier `rsinfer quantize` wrote (its MARK), not one the folder shipped."""
    try:
        return any(p.key == MARK for p in _header(path).metadata_props)
    except ModelLoadError:
        return False


def graph_bytes(path: Path) -> int:
    """The graph file and the external data files it names."""
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    total = path.stat().st_size
    model = _header(path)
    seen: set[str] = set()
    for t in model.graph.initializer:
        if uses_external_data(t):
            loc = ExternalDataInfo(t).location
            if loc not in seen and (path.parent / loc).exists():
                seen.add(loc)
                total += (path.parent / loc).stat().st_size
    return total


def quantize(source: Path, dtype: str, *, per_channel: bool = False, optimize: bool = False,
             out: Path | None = None, overwrite: bool = False) -> Quantized:
    """Write `source` as `dtype` (optimized first with `optimize`) and return where it went. The work happens in a
    scratch folder beside the output, moved into place at the end: an interrupted run leaves no half graph under a
    name the resolver would pick. A file already at the target that rsinfer quantize did not write (the folder's
    own model_quantized.onnx) is never replaced without `overwrite`."""
    require_onnx()
    source = source.absolute()
    target = output_path(source, dtype, optimize, out).absolute()
    if per_channel and dtype != "int8":
        raise ConfigError("--per-channel applies to --dtype int8")
    if target.exists() and not overwrite and not written_by_us(target):
        raise ConfigError(f"{target} exists and rsinfer quantize did not write it (the folder's own graph?): "
                          "pass --overwrite to replace it, or --out FILE to write elsewhere")
    source_bytes = graph_bytes(source)
    external = source_bytes > PROTOBUF_LIMIT or source_bytes != source.stat().st_size
    scratch = _scratch(target)
    try:
        # the converters print (stdout is the command's), and onnxruntime's symbolic shape inference, when it gives
        # up, leaves its temporary graph and a <uuid>.data copy of the weights in the working directory: they run
        # in the scratch folder, deleted below
        with contextlib.redirect_stdout(sys.stderr), _working_dir(scratch):
            current = _convert(source, scratch, dtype, per_channel, optimize, external)
        _loads(current)
        _move(current, target)
    except (ConfigError, ModelLoadError):
        raise
    except Exception as exc:  # noqa: BLE001 - onnx and onnxruntime raise untyped errors
        raise ModelLoadError(f"cannot {'optimize and ' if optimize else ''}convert {source} to {dtype}: "
                             f"{type(exc).__name__}: {exc}") from exc
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return Quantized(source, target, dtype, per_channel, optimize, graph_bytes(target), source_bytes)


def _scratch(target: Path) -> Path:
    """The scratch folder beside `target` (its folder made); ConfigError naming --out when it cannot be written."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=".rsinfer-quantize-", dir=target.parent))
    except OSError as exc:
        raise ConfigError(f"cannot write {target}: {target.parent}: {exc.strerror or exc}") from None


@contextlib.contextmanager
def _working_dir(folder: Path) -> Iterator[None]:
    """The process's working directory is `folder` for the block (contextlib.chdir, which Python 3.10 lacks)."""
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def _convert(source: Path, scratch: Path, dtype: str, per_channel: bool, optimize: bool, external: bool) -> Path:
    current = source
    if optimize:
        current = _optimize(current, scratch / "optimized.onnx", external)
    if dtype == "int8":
        current = _int8(current, scratch, per_channel, external)
    elif dtype == "fp16":
        current = _fp16(current, scratch / "fp16.onnx", external)
    return current


def _loads(graph: Path) -> None:
    """The converted graph must load in onnxruntime before it takes a name the resolver picks."""
    import onnxruntime as ort

    try:
        ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - ORT raises untyped errors
        raise ModelLoadError(f"the converted graph does not load in onnxruntime, so nothing was written: {exc}") \
            from exc


def _optimize(source: Path, dest: Path, external: bool) -> Path:
    from onnxruntime.transformers.optimizer import optimize_model

    # opt_level 0: the fusions alone (level 1 first runs an ORT session pass, which imports torch)
    model = optimize_model(str(source), model_type="bert", num_heads=0, hidden_size=0, opt_level=0)
    model.save_model_to_file(str(dest), use_external_data_format=external)
    return dest


def _int8(source: Path, scratch: Path, per_channel: bool, external: bool) -> Path:
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    prepared = scratch / "prepared.onnx"
    try:
        quant_pre_process(str(source), str(prepared), auto_merge=True, save_as_external_data=external,
                          all_tensors_to_one_file=True)
    except Exception:  # noqa: BLE001 - symbolic inference gives up on some exporters' graphs (torch dynamo's)
        quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True, save_as_external_data=external,
                          all_tensors_to_one_file=True)
    dest = scratch / "int8.onnx"
    quantize_dynamic(str(prepared), str(dest), per_channel=per_channel, weight_type=QuantType.QInt8,
                     use_external_data_format=external)
    return dest


def _fp16(source: Path, dest: Path, external: bool) -> Path:
    import onnx
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    model = onnx.load(str(source))
    # a graph that is already quantized keeps its (de)quantization in float32: their scales must match their ops
    converted = convert_float_to_float16(model, keep_io_types=True, disable_shape_infer=external,
                                         op_block_list=[*DEFAULT_OP_BLOCK_LIST, *QUANTIZED_OPS])
    onnx.save(converted, str(dest), save_as_external_data=external, all_tensors_to_one_file=True,
              location=f"{dest.name}_data" if external else None)
    return dest


def _move(graph: Path, target: Path) -> None:
    """The graph (and its external data, renamed after the target, the reference inside rewritten) into place."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    model = onnx.load(str(graph), load_external_data=False)
    tmp = target.with_name(f".{target.name}.partial")
    if not any(uses_external_data(t) for t in model.graph.initializer):
        onnx.helper.set_model_props(model, {**{p.key: p.value for p in model.metadata_props}, MARK: "1"})
        onnx.save(model, str(tmp))
        os.replace(tmp, target)
        return
    full = onnx.load(str(graph))            # weights in memory, written again under the target's own name
    onnx.helper.set_model_props(full, {**{p.key: p.value for p in full.metadata_props}, MARK: "1"})
    onnx.save(full, str(tmp), save_as_external_data=True, all_tensors_to_one_file=True,
              location=f"{target.name}_data")      # relative to the graph: beside the target
    os.replace(tmp, target)
