"""CLIP and SigLIP besides their pixels (pipelines/imageprep.py): the text side's tokens as transformers' processors
make them, the towers' outputs, and zero-shot image classification as transformers' pipeline scores it.

- CLIP: `<|startoftext|>` text `<|endoftext|>`, cut at the text tower's positions keeping the final end token,
  padded with the end token (the graph pools the first one; causal attention makes padding inert). Vectors:
  `text_embeds` / `image_embeds`. Zero-shot: `exp(logit_scale) * cos`, softmax over the labels.
- SigLIP: text `</s>`, cut at the positions, then ALWAYS padded to them with the pad token: the graph reads the last
  position and attends to the padding, so another length is another vector. Vectors: `pooler_output`. Zero-shot:
  `exp(logit_scale) * cos + logit_bias`, sigmoid per label.
- `logit_scale` / `logit_bias` are weights of the full model, read tensor by tensor from `model.safetensors` (never
  `config.json`'s `logit_scale_init_value`, which is the untrained value), or read off the combined graph a Xenova
  repo ships (the constants its logits are scaled and shifted by), or given in the model entry.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelLoadError
from ..onnxfile import Graph, Node, OnnxFileError, read_graph

KINDS = {"clip": "clip", "siglip": "siglip", "siglip2": "siglip"}
OUTPUTS = {"clip": ("text_embeds", "image_embeds"), "siglip": ("pooler_output", "pooler_output")}


@dataclass(frozen=True)
class TextSpec:
    """How a text becomes the text tower's row."""

    kind: str              # clip | siglip
    max_len: int           # the text tower's positions
    pad_id: int
    pad_to_max: bool       # SigLIP: every row is max_len long

    @classmethod
    def of(cls, config: Mapping[str, Any], tokenizer: Any, where: str = "config.json") -> TextSpec:
        model_type = str(config.get("model_type", ""))
        kind = KINDS.get(model_type)
        if kind is None:
            raise ModelLoadError(f"{where}: model_type {model_type!r} is not CLIP or SigLIP ({', '.join(KINDS)})")
        text = config.get("text_config") or {}
        max_len = int(text.get("max_position_embeddings", 77 if kind == "clip" else 64))
        if kind == "clip":
            pad = tokenizer.token_to_id("<|endoftext|>")
            if pad is None:
                raise ModelLoadError(f"{where}: a CLIP tokenizer without <|endoftext|>")
        else:
            pad = int(text.get("pad_token_id", 1))
        return cls(kind, max_len, int(pad), kind == "siglip")


def token_rows(tokenizer: Any, spec: TextSpec, texts: Sequence[str]) -> list[list[int]]:
    """Each text's ids, truncated keeping the final special token; SigLIP's already padded to max_len."""
    tokenizer.enable_truncation(spec.max_len)
    tokenizer.no_padding()
    rows = [e.ids for e in tokenizer.encode_batch(list(texts))]
    if spec.pad_to_max:
        rows = [r + [spec.pad_id] * (spec.max_len - len(r)) for r in rows]
    return rows


def text_rows(tokenizer: Any, spec: TextSpec, texts: Sequence[str]) -> np.ndarray:
    """The texts as the text tower's input_ids [n, length] int64: truncated keeping the final special token, padded
    (to the longest row, or always to max_len for SigLIP)."""
    rows = token_rows(tokenizer, spec, texts)
    width = spec.max_len if spec.pad_to_max else max((len(r) for r in rows), default=1)
    out = np.full((len(rows), width), spec.pad_id, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


_PASS = ("Transpose", "Identity", "Cast")                  # ops between the scaled logits and the outputs
_VALUE_OPS = ("Identity", "Cast", "Reshape", "Squeeze", "Unsqueeze")


def logit_params(folder: Path, kind: str, given: Mapping[str, float | None],
                 extra: Mapping[str, Path] | None = None) -> tuple[float, float]:
    """(logit_scale, logit_bias): the model entry's, else the weights' (model.safetensors, read tensor by tensor),
    else the repo's combined graph's (onnx/model.onnx in Xenova's layout, or what the Hub's copy of it was read as:
    `extra`'s `<name>.constants.json`). CLIP has no bias (0)."""
    scale, bias, _ = find_logit_params(folder, kind, given, extra)
    return scale, bias


def find_logit_params(folder: Path, kind: str, given: Mapping[str, float | None],
                      extra: Mapping[str, Path] | None = None) -> tuple[float, float, str]:
    """logit_params and where they came from ("the model entry", "model.safetensors" or the graph's file); a
    ModelLoadError naming every place looked in where none has them."""
    scale, bias = given.get("logit_scale"), given.get("logit_bias")
    need = [n for n, v in (("logit_scale", scale), ("logit_bias", bias if kind == "siglip" else 0.0)) if v is None]
    source = "the model entry"
    if need:
        found, source = _weights_scalars(folder, need)
        if found is None:
            why = source
            found, source = _graph_scalars(folder, extra or {})
            why = f"{why}; {source}"
        if found is None:
            raise ModelLoadError(f"zero-shot needs {' and '.join(need)}: {why}; set them in the model entry")
        scale = found["logit_scale"] if scale is None else scale
        bias = found.get("logit_bias", 0.0) if bias is None else bias
    return (float(scale if scale is not None else 0.0),
            float(bias if bias is not None and kind == "siglip" else 0.0), source)


def _weights_scalars(folder: Path, need: list[str]) -> tuple[dict[str, float] | None, str]:
    path = folder / "model.safetensors"
    if not path.is_file():
        return None, "the folder has no model.safetensors"
    from safetensors import safe_open

    with safe_open(str(path), "numpy") as f:
        missing = [n for n in need if n not in set(f.keys())]
        if missing:
            return None, f"model.safetensors has no {', '.join(missing)}"
        return {n: float(np.asarray(f.get_tensor(n)).reshape(-1)[0]) for n in need}, "model.safetensors"


def combined_graphs() -> tuple[str, ...]:
    """The combined graphs a repo may carry, full precision first (the image_text family's constant_graphs)."""
    from .. import families

    return families.get("image_text").constant_graphs


def _graph_scalars(folder: Path, extra: Mapping[str, Path]) -> tuple[dict[str, float] | None, str]:
    """Both scalars from the first combined graph in the folder (root or onnx/), or its constants as read off the
    Hub: the `Mul` (and SigLIP's `Add`) by a constant between its cosine MatMul and `logits_per_image`."""
    names = combined_graphs()
    found = [(p, p.relative_to(folder).as_posix(), False) for name in names
             for p in (folder / name, folder / "onnx" / name) if p.is_file()]
    found += [(p, p.relative_to(folder).as_posix(), True) for name in names
              for p in (folder / f"{name}.constants.json", folder / "onnx" / f"{name}.constants.json") if p.is_file()]
    found += [(extra[k], k, True) for name in names if (k := f"{name}.constants.json") in extra]
    if not found:
        return None, f"no combined graph ({', '.join(names[:2])}, ...) in the folder or its onnx/"
    path, rel, is_json = found[0]
    try:
        graph = Graph.from_json(json.loads(path.read_text(encoding="utf-8"))) if is_json else read_graph(path)
    except (OnnxFileError, OSError, ValueError) as exc:
        return None, f"{rel}: {exc}"
    got = graph_logit_params(graph)
    if isinstance(got, str):
        return None, f"{rel}: {got}"
    return {"logit_scale": got[0], "logit_bias": got[1]}, rel


def graph_logit_params(graph: Graph) -> tuple[float, float] | str:
    """(logit_scale, logit_bias) of a combined graph whose `logits_per_image` (or `logits_per_text`) is
    `cos * exp(logit_scale) (+ logit_bias)`, as transformers' CLIPModel and SiglipModel export (the scale as an
    initializer already raised, or `Exp` of one, through `Cast`s); else the reason."""
    producer = graph.producer()
    outputs = [o for o in ("logits_per_image", "logits_per_text") if o in producer]
    if not outputs:
        return "it has no logits_per_image output"
    name: str = outputs[0]
    bias = 0.0
    for _ in range(16):
        node = producer.get(name)
        if node is None:
            break
        if node.op in _PASS and node.inputs:
            name = node.inputs[0]
            continue
        if node.op not in ("Add", "Mul") or len(node.inputs) != 2:
            break
        values = [_constant(graph, producer, i) for i in node.inputs]
        k = next((i for i, v in enumerate(values) if v is not None and v.size == 1), None)
        if k is None:
            break
        c, name = float(np.asarray(values[k]).reshape(-1)[0]), node.inputs[1 - k]
        if node.op == "Add":
            bias += c
            continue
        return (math.log(c), bias) if c > 0 else "its logit scale is not positive"
    return "its logits are not cos * exp(logit_scale) (+ logit_bias) by constants"


def _constant(graph: Graph, producer: Mapping[str, Node], name: str, depth: int = 0) -> np.ndarray | None:
    """The value of `name` where it is a constant: an initializer, a Constant node, or Exp / Cast / Reshape of one
    (float64, so that log(exp(x)) gives x back)."""
    if name in graph.constants:
        return graph.constants[name].astype(np.float64)
    node = producer.get(name)
    if node is None or depth > 8:
        return None
    if node.op == "Constant":
        return None if node.value is None else node.value.astype(np.float64)
    if node.op in _VALUE_OPS + ("Exp",) and node.inputs:
        value = _constant(graph, producer, node.inputs[0], depth + 1)
        return np.exp(value) if value is not None and node.op == "Exp" else value
    return None


def unit(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = x / np.linalg.norm(x, axis=-1, keepdims=True)
    return out


def zero_shot(image: np.ndarray, texts: np.ndarray, kind: str, scale: float, bias: float
              ) -> tuple[np.ndarray, np.ndarray]:
    """(logits, probabilities) of one image's vector against each label's text vector, as transformers'
    zero-shot-image-classification pipeline computes them: softmax over the labels (CLIP), or a sigmoid per label
    (SigLIP)."""
    cos = unit(texts.astype(np.float32)) @ unit(image.astype(np.float32))
    logits = np.exp(np.float32(scale)) * cos + np.float32(bias)
    if kind == "clip":
        e = np.exp(logits - logits.max())
        return logits, e / e.sum()
    return logits, 1 / (1 + np.exp(-logits))
