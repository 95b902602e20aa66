"""A sentence-transformers folder as sentence-transformers computes it, without torch: `modules.json` is a pipeline
Transformer → Pooling → Dense … → LayerNorm → Normalize, and sentence-transformers' ONNX export holds only the
Transformer. This module reads the rest - each module's `config.json`, Dense and LayerNorm weights through
safetensors' numpy API - and the prompts of `config_sentence_transformers.json`, in both the layout most Hub repos
carry (sentence-transformers 2.x-5.x: `sentence_transformers.models.Dense`, `pooling_mode_mean_tokens: true`) and
6.x's (`sentence_transformers.base.modules.dense.Dense`, `pooling_mode: "mean"`).

A module it cannot compute exactly (CNN, LSTM, WordWeights, a custom class, an activation it does not know, weights
only in a torch pickle) is a load error naming it, never skipped. The families that serve such folders (embedding
today) keep their own request logic; this is the folder's arithmetic.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..engine.model import LoadedModel
from ..errors import ModelLoadError
from .base import Array

# the pooling modes sentence-transformers knows, by its names; rsinfer calls `lasttoken` `last`
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "last")
# the legacy `pooling_mode_*` flags in the order sentence-transformers concatenates them
LEGACY_FLAGS = (("pooling_mode_cls_token", "cls"), ("pooling_mode_max_tokens", "max"),
                ("pooling_mode_mean_tokens", "mean"), ("pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len_tokens"),
                ("pooling_mode_weightedmean_tokens", "weightedmean"), ("pooling_mode_lasttoken", "last"))
# the modules computed here; any other type in modules.json is refused at load
KNOWN_MODULES = ("Transformer", "Pooling", "Dense", "LayerNorm", "Dropout", "Normalize")
# sentence-transformers' own prompt names every model has (empty unless the model defines them)
IMPLICIT_PROMPTS = ("query", "document")


# ---------------------------------------------------------------- pooling


def _pool_one(hidden: Array, mask: Array, mode: str) -> Array:
    """One mode of sentence-transformers' Pooling over right-padded [B, T, D] and a [B, T] mask whose prompt tokens
    may be zeroed (`include_prompt: false`)."""
    m = mask.astype(hidden.dtype, copy=False)
    if mode == "cls":        # the first token the mask keeps (the one after the prompt when it is left out)
        out: Array = hidden[np.arange(hidden.shape[0]), np.argmax(mask, axis=1)]
    elif mode == "last":     # the last token the mask keeps; none kept: zeros
        t = mask.shape[1]
        idx = t - 1 - np.argmax(mask[:, ::-1], axis=1)
        rows = np.arange(hidden.shape[0])
        out = hidden[rows, idx] * m[rows, idx][:, None]
    elif mode == "max":
        out = np.where(m[:, :, None] > 0, hidden, -np.inf).max(axis=1)
    elif mode in ("mean", "mean_sqrt_len_tokens"):
        total = np.matmul(m[:, None, :], hidden)[:, 0]          # Σ over kept tokens, as one batched product
        count = np.maximum(m.sum(axis=1, keepdims=True), 1e-9)
        out = total / (count if mode == "mean" else np.sqrt(count))
    elif mode == "weightedmean":  # weights 1..T by position (no left padding here); prompt tokens keep theirs
        w = m * np.arange(1, m.shape[1] + 1, dtype=hidden.dtype)[None, :]
        out = np.matmul(w[:, None, :], hidden)[:, 0] / np.maximum(w.sum(axis=1, keepdims=True), 1e-9)
    else:
        raise ValueError(f"unknown pooling mode {mode!r}")
    return out


def pool_modes(hidden: Array, mask: Array, modes: Sequence[str]) -> Array:
    """[B, T, D] → [B, D · len(modes)]: each mode in order, concatenated (sentence-transformers' Pooling)."""
    if len(modes) == 1:
        return _pool_one(hidden, mask, modes[0])
    return np.concatenate([_pool_one(hidden, mask, mode) for mode in modes], axis=1)


@dataclass(frozen=True)
class Pooling:
    """A Pooling module's settings, from its config in either layout (or rsinfer's default: masked mean)."""

    modes: tuple[str, ...] = ("mean",)
    dimension: int | None = None          # the token vectors' width it was saved for
    include_prompt: bool = True
    source: str = "no pooling config: masked mean"

    @property
    def width(self) -> int | None:
        return self.dimension * len(self.modes) if self.dimension else None

    @property
    def name(self) -> str:
        return "+".join(self.modes)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], where: str) -> Pooling:
        """`pooling_mode: "mean"` (or a list) with `embedding_dimension` (6.x), or `pooling_mode_*_tokens` flags with
        `word_embedding_dimension` (2.x-5.x); both with `include_prompt`."""
        modes, why = _modes(cfg, where) if cfg.get("pooling_mode") is not None else _legacy_modes(cfg, where)
        bad = [m for m in modes if m not in POOLING_MODES]
        if bad:
            raise ValueError(f"{where}: unknown pooling mode {bad[0]!r} (sentence-transformers knows "
                             f"{', '.join(m if m != 'last' else 'lasttoken' for m in POOLING_MODES)})")
        dim = cfg.get("embedding_dimension", cfg.get("word_embedding_dimension"))
        include = cfg.get("include_prompt", True)
        return cls(modes, dim if isinstance(dim, int) and dim > 0 else None, include is not False, why)


def _modes(cfg: Mapping[str, Any], where: str) -> tuple[tuple[str, ...], str]:
    """6.x: `pooling_mode` names a mode or lists several."""
    raw = cfg["pooling_mode"]
    names = [raw] if isinstance(raw, str) else list(raw) if isinstance(raw, list) else []
    if not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{where}: pooling_mode must be a mode or a list of modes, got {raw!r}")
    return tuple("last" if n == "lasttoken" else n for n in names), f"{where} pooling_mode {'+'.join(names)}"


def _legacy_modes(cfg: Mapping[str, Any], where: str) -> tuple[tuple[str, ...], str]:
    """2.x-5.x: one flag per mode, concatenated in sentence-transformers' order; none set means mean."""
    flags = [(flag, mode) for flag, mode in LEGACY_FLAGS if cfg.get(flag)]
    if not flags:
        return ("mean",), f"{where} sets no mode: masked mean"
    return tuple(mode for _, mode in flags), f"{where} {' + '.join(flag for flag, _ in flags)}"


# ---------------------------------------------------------------- the modules after pooling


def _erf(x: Array) -> Array:
    """erf to float32 precision (Abramowitz & Stegun 7.1.26, |error| < 1.5e-7), vectorised: numpy has none."""
    t = 1.0 / (1.0 + 0.3275911 * np.abs(x))
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    out: Array = np.sign(x) * (1.0 - poly * np.exp(-x * x))
    return out


def _sigmoid(x: Array) -> Array:
    out: Array = 0.5 * (1.0 + np.tanh(0.5 * x))   # = 1 / (1 + e^-x), without overflow
    return out


# torch.nn activations by class name, as sentence-transformers' Dense names them (`torch.nn.modules.activation.Tanh`)
ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "Tanh": np.tanh,
    "Identity": lambda x: x,
    "ReLU": lambda x: np.maximum(x, 0),
    "GELU": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),   # torch's default GELU: the exact, erf form
    "Sigmoid": _sigmoid,
    "SiLU": lambda x: x * _sigmoid(x),
}


@dataclass(frozen=True)
class Step:
    """One module after pooling: its name for people, the width it gives, and what it computes on [B, D]."""

    kind: str                    # Dense | LayerNorm | Dropout | Normalize
    path: str                    # its folder in the repo ("" for a module without files)
    label: str                   # e.g. "Dense 32→24 Tanh (2_Dense)"
    width: int | None            # the vectors' width after it (None: unchanged)
    apply: Callable[[Array], Array] = field(compare=False, repr=False)
    weights: bool = False        # whether it has parameters (a graph may already contain it)
    takes: int | None = None     # the width it needs (None: any)


def l2_normalize(v: Array) -> Array:
    norms = np.linalg.norm(v, axis=-1, keepdims=True)
    out: Array = v / np.maximum(norms, 1e-12)        # torch.nn.functional.normalize's eps
    return out


def _weights(files: Mapping[str, Path], folder: str, where: str) -> dict[str, Array]:
    path = files.get(f"{folder}/model.safetensors")
    if path is None:
        raise ValueError(f"{where}: no {folder}/model.safetensors; rsinfer reads module weights from safetensors "
                         "only (a pytorch_model.bin is a torch pickle it does not load); convert it with "
                         "safetensors' torch API: save_file(torch.load(f), 'model.safetensors')")
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        return {k: np.asarray(v, dtype=np.float32) for k, v in load_file(str(path)).items()}
    except (SafetensorError, OSError, TypeError, ValueError) as exc:
        raise ValueError(f"{where}: cannot read {folder}/model.safetensors: {exc}") from exc


def _tensor(weights: Mapping[str, Array], key: str, shape: tuple[int, ...], where: str) -> Array:
    value = weights.get(key)
    if value is None:
        raise ValueError(f"{where}: the weights have no '{key}' (they have {', '.join(sorted(weights)) or 'none'})")
    if value.shape != shape:
        raise ValueError(f"{where}: '{key}' has shape {list(value.shape)}, its config says {list(shape)}")
    return value


def dense(cfg: Mapping[str, Any], files: Mapping[str, Path], folder: str, where: str, *,
          on: str = "sentence_embedding") -> Step:
    """sentence-transformers' Dense: activation(x Wᵀ + b), plus `use_residual`. No `activation_function` in its
    config means Tanh, as in sentence-transformers. `on`: the vectors it is applied to (PyLate's Dense projects
    token_embeddings)."""
    n_in, n_out = cfg.get("in_features"), cfg.get("out_features")
    if not (isinstance(n_in, int) and isinstance(n_out, int) and n_in > 0 and n_out > 0):
        raise ValueError(f"{where}: config.json needs in_features and out_features (integers), got "
                         f"{n_in!r} and {n_out!r}")
    fn = str(cfg.get("activation_function") or "torch.nn.modules.activation.Tanh")
    name = fn.rpartition(".")[2]
    if not fn.startswith("torch.") or name not in ACTIVATIONS:
        raise ValueError(f"{where}: activation_function {fn!r} is not one rsinfer computes "
                         f"(torch.nn {', '.join(ACTIVATIONS)})")
    for key in ("module_input_name", "module_output_name"):
        if cfg.get(key, on) != on:
            raise ValueError(f"{where}: {key} {cfg[key]!r}: rsinfer applies this model's Dense to {on}")
    w = _weights(files, folder, where)
    weight = _tensor(w, "linear.weight", (n_out, n_in), where).T.copy()
    bias = _tensor(w, "linear.bias", (n_out,), where) if cfg.get("bias", True) else None
    residual = None
    if cfg.get("use_residual"):
        residual = np.eye(n_in, dtype=np.float32) if n_in == n_out else \
            _tensor(w, "residual.weight", (n_out, n_in), where).T.copy()
    act = ACTIVATIONS[name]

    def apply(x: Array) -> Array:
        y = x @ weight
        if bias is not None:
            y += bias
        y = act(y)
        return y if residual is None else y + x @ residual

    return Step("Dense", folder, f"Dense {n_in}→{n_out} {name}{' +residual' if residual is not None else ''} "
                                 f"({folder})", n_out, apply, weights=True, takes=n_in)


def layer_norm(cfg: Mapping[str, Any], files: Mapping[str, Path], folder: str, where: str) -> Step:
    """sentence-transformers' LayerNorm: torch.nn.LayerNorm(dimension) with its saved weight and bias, eps 1e-5."""
    dim = cfg.get("dimension")
    if not isinstance(dim, int) or dim <= 0:
        raise ValueError(f"{where}: config.json needs dimension (an integer), got {dim!r}")
    w = _weights(files, folder, where)
    gamma, beta = _tensor(w, "norm.weight", (dim,), where), _tensor(w, "norm.bias", (dim,), where)

    def apply(x: Array) -> Array:
        mu = x.mean(axis=-1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
        out: Array = (x - mu) / np.sqrt(var + 1e-5) * gamma + beta
        return out

    return Step("LayerNorm", folder, f"LayerNorm {dim} ({folder})", dim, apply, weights=True, takes=dim)


# ---------------------------------------------------------------- the folder


def module_kind(type_name: str) -> str | None:
    """The module's class in both namings (`sentence_transformers.models.Dense`,
    `sentence_transformers.base.modules.dense.Dense`); None for anything not sentence-transformers' own."""
    if not type_name.startswith("sentence_transformers."):
        return None
    name = type_name.rpartition(".")[2]
    return name if name in KNOWN_MODULES else None


@dataclass(frozen=True)
class StFolder:
    """What a sentence-transformers folder says beyond its Transformer."""

    pooling: Pooling | None                 # None: modules.json has no Pooling (rsinfer's default applies)
    steps: tuple[Step, ...] = ()            # after pooling, in order (Normalize included)
    modules: tuple[str, ...] = ()           # every module, for `inspect`
    truncate_dim: int | None = None
    do_lower_case: bool = False

    @property
    def ends_normalized(self) -> bool:
        return bool(self.steps) and self.steps[-1].kind == "Normalize"


def _json(path: Path | None, where: str) -> Any:
    if path is None:
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{where}: cannot read {path.name}: {exc}") from exc


@dataclass(frozen=True)
class Module:
    """One entry of modules.json: its class name (the type's last part), the full type, its folder, its config."""

    name: str
    type: str
    path: str
    config: dict[str, Any]


def module_list(model: LoadedModel) -> list[Module]:
    """modules.json in order (empty without one), each module with its folder's config.json; ModelLoadError for a
    file that is not a list of modules. For the families that read other module classes than the embedding
    pipeline's (SparseEncoder's SpladePooling, PyLate's Dense)."""
    try:
        raw = _json(model.resolved.aux.get("modules.json"), "modules.json")
    except ValueError as exc:
        raise ModelLoadError(f"model '{model.name}': {exc}", model=model.name) from exc
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(m, dict) for m in raw):
        raise ModelLoadError(f"model '{model.name}': modules.json must be a list of modules ({{idx, name, path, "
                             "type}})", model=model.name)
    out = []
    for m in raw:
        type_name, path = str(m.get("type", "")), str(m.get("path") or "").strip("/")
        cfg = model.aux.get(f"{path}/config.json", {}) if path else {}
        out.append(Module(type_name.rpartition(".")[2], type_name, path, cfg if isinstance(cfg, dict) else {}))
    return out


def read_folder(model: LoadedModel) -> StFolder | None:
    """The folder's module pipeline; None when it has no modules.json and no
    config_sentence_transformers.json (not a sentence-transformers folder). ModelLoadError naming the module for
    anything that cannot be computed exactly."""
    files = model.resolved.aux
    name = model.name
    try:
        return _read(model, files)
    except ValueError as exc:
        raise ModelLoadError(f"model '{name}': {exc}", model=name) from exc


def _read(model: LoadedModel, files: Mapping[str, Path]) -> StFolder | None:
    raw_modules = _json(files.get("modules.json"), "modules.json")
    st_config = _json(files.get("config_sentence_transformers.json"), "config_sentence_transformers.json")
    if raw_modules is None and st_config is None:
        return None
    chain = _Chain()
    if raw_modules is not None:
        if not isinstance(raw_modules, list) or not all(isinstance(m, dict) for m in raw_modules):
            raise ValueError("modules.json must be a list of modules ({idx, name, path, type})")
        for i, m in enumerate(raw_modules):
            chain.add(i, m, files)
    st = st_config if isinstance(st_config, dict) else {}
    truncate_dim = st.get("truncate_dim")
    return StFolder(pooling=chain.pooling, steps=tuple(chain.steps), modules=tuple(chain.labels),
                    truncate_dim=truncate_dim if isinstance(truncate_dim, int) and truncate_dim > 0 else None,
                    do_lower_case=model.aux.get("sentence_bert_config.json", {}).get("do_lower_case") is True)


@dataclass
class _Chain:
    """modules.json read in order: the Transformer first, one Pooling, then the modules on the sentence vector."""

    pooling: Pooling | None = None
    steps: list[Step] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)

    def add(self, i: int, m: Mapping[str, Any], files: Mapping[str, Path]) -> None:
        type_name, folder = str(m.get("type", "")), str(m.get("path") or "").strip("/")
        where = f"modules.json module {m.get('idx', i)} ({type_name or 'no type'}, path '{folder}')"
        kind = module_kind(type_name)
        if kind is None:
            raise ValueError(f"{where}: rsinfer does not compute this module (it computes sentence-transformers' "
                             f"{', '.join(KNOWN_MODULES)}); serve a graph that contains it, or remove it")
        if (kind == "Transformer") != (i == 0):
            raise ValueError(f"{where}: the Transformer the ONNX graph holds must be the first module, and only it")
        cfg = _json(files.get(f"{folder}/config.json"), where) if folder else None
        cfg = cfg if isinstance(cfg, dict) else {}
        if kind == "Transformer":
            self.labels.append("Transformer (the ONNX graph)")
        elif kind == "Pooling":
            if self.pooling is not None or self.steps:
                raise ValueError(f"{where}: one Pooling, right after the Transformer, is what rsinfer computes")
            self.pooling = Pooling.from_config(cfg, f"{folder}/config.json")
            self.labels.append(f"Pooling {self.pooling.name}"
                               f"{'' if self.pooling.include_prompt else ', prompt excluded'} ({folder})")
        elif self.pooling is None:
            raise ValueError(f"{where}: a {kind} before any Pooling works on token vectors; rsinfer serves "
                             "sentence embeddings")
        else:
            self.steps.append(_step(kind, cfg, files, folder, where))
            self.labels.append(self.steps[-1].label)


def _step(kind: str, cfg: Mapping[str, Any], files: Mapping[str, Path], folder: str, where: str) -> Step:
    """A module after pooling."""
    if kind == "Dense":
        return dense(cfg, files, folder, where)
    if kind == "LayerNorm":
        return layer_norm(cfg, files, folder, where)
    if kind == "Dropout":              # the identity at inference
        return Step("Dropout", folder, f"Dropout (identity at inference, {folder})", None, lambda x: x)
    return Step("Normalize", folder, "Normalize", None, l2_normalize)


class Prompts:
    """A model's prompts as sentence-transformers applies them: the folder's (config_sentence_transformers.json)
    under the model entry's `prompts`, a default one (`default_prompt_name`, else the folder's; "" for none), and
    the `query` and `document` names every model answers (empty unless defined). Checked at load."""

    def __init__(self, model: LoadedModel, own: Mapping[str, str] | None = None, default: str | None = None) -> None:
        st = model.aux.get("config_sentence_transformers.json", {})
        folder = st.get("prompts") if isinstance(st, dict) else None
        if folder is not None and (not isinstance(folder, dict) or not all(isinstance(k, str) for k in folder)):
            raise ModelLoadError(f"model '{model.name}': config_sentence_transformers.json: prompts must map names "
                                 "to texts", model=model.name)
        self.model = model.name
        self.prompts: dict[str, str] = {**{k: "" if v is None else str(v) for k, v in (folder or {}).items()},
                                        **(own or {})}
        where = "default_prompt_name"
        if default is None:
            found = st.get("default_prompt_name") if isinstance(st, dict) else None
            default = found if isinstance(found, str) else None
            where = "config_sentence_transformers.json default_prompt_name"
        if default:
            self.check(default, where)
        self.default: str | None = default or None

    @property
    def names(self) -> list[str]:
        """Every name a request may give: the model's prompts and sentence-transformers' query and document."""
        return sorted({*self.prompts, *IMPLICIT_PROMPTS})

    def check(self, name: str, where: str) -> None:
        """A prompt name the configuration gives must be one of the model's (else the model does not load)."""
        if name not in self.prompts and name not in IMPLICIT_PROMPTS:
            raise ModelLoadError(f"model '{self.model}': {where} '{name}' is not one of its prompts "
                                 f"({', '.join(self.names)})", model=self.model)

    def text(self, prompt_name: str | None = None, prompt: str | None = None) -> str:
        """The text put before each input: `prompt` as given, the prompt `prompt_name` names, else the default
        prompt."""
        from ..errors import InputError

        if prompt is not None and prompt_name is not None:
            raise InputError("give `prompt` or `prompt_name`, not both", param="prompt_name")
        if prompt is not None:
            return prompt
        name = prompt_name if prompt_name is not None else self.default
        if name is None:
            return ""
        if name not in self.prompts and name not in IMPLICIT_PROMPTS:
            raise InputError(f"unknown prompt_name '{name}' for model '{self.model}'; its prompts: "
                             f"{', '.join(self.names)}", param="prompt_name")
        return self.prompts.get(name, "")


def prompt_length(tokenizer: Any, prompt: str) -> int:
    """The tokens of `prompt` at the start of `prompt + text`, as sentence-transformers counts them for
    `include_prompt: false`: the prompt tokenized with special tokens, less a trailing special token."""
    enc = tokenizer.encode(prompt, add_special_tokens=True)
    n = len(enc.ids)
    if n and enc.special_tokens_mask[-1]:
        n -= 1
    return n
