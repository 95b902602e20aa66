"""CLIP and SigLIP besides their pixels (pipelines/imageprep.py): the text side's tokens as transformers' processors
make them, the towers' outputs, and zero-shot image classification as transformers' pipeline scores it.

- CLIP: `<|startoftext|>` text `<|endoftext|>`, cut at the text tower's positions keeping the final end token,
  padded with the end token (the graph pools the first one; causal attention makes padding inert). Vectors:
  `text_embeds` / `image_embeds`. Zero-shot: `exp(logit_scale) * cos`, softmax over the labels.
- SigLIP: text `</s>`, cut at the positions, then ALWAYS padded to them with the pad token: the graph reads the last
  position and attends to the padding, so another length is another vector. Vectors: `pooler_output`. Zero-shot:
  `exp(logit_scale) * cos + logit_bias`, sigmoid per label.
- `logit_scale` / `logit_bias` are weights of the full model, read tensor by tensor from `model.safetensors` (never
  `config.json`'s `logit_scale_init_value`, which is the untrained value), or given in the model entry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelLoadError

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


def logit_params(folder: Path, kind: str, given: Mapping[str, float | None]) -> tuple[float, float]:
    """(logit_scale, logit_bias): the model entry's, else the weights' (model.safetensors, read tensor by tensor).
    CLIP has no bias (0)."""
    scale, bias = given.get("logit_scale"), given.get("logit_bias")
    need = [n for n, v in (("logit_scale", scale), ("logit_bias", bias if kind == "siglip" else 0.0)) if v is None]
    if need:
        path = folder / "model.safetensors"
        if not path.is_file():
            raise ModelLoadError(f"zero-shot needs {' and '.join(need)}: the folder has no model.safetensors to read "
                                 "them from; set them in the model entry")
        from safetensors import safe_open

        with safe_open(str(path), "numpy") as f:
            names = set(f.keys())
            missing = [n for n in need if n not in names]
            if missing:
                raise ModelLoadError(f"model.safetensors has no {', '.join(missing)}; set it in the model entry")
            found = {n: float(np.asarray(f.get_tensor(n)).reshape(-1)[0]) for n in need}
        scale = found.get("logit_scale", scale)
        bias = found.get("logit_bias", bias)
    return float(scale if scale is not None else 0.0), float(bias if bias is not None and kind == "siglip" else 0.0)


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
