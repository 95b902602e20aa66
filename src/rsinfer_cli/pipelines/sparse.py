"""Learned sparse retrieval (`kind: sparse`): SPLADE as sentence-transformers' `SparseEncoder` computes it.

    graph output [B, S, V]   masked-LM logits (the folder's MLMTransformer) → SpladePooling: log1p(relu(logits))
                             (log1p once more with `log1p_relu`), tokens outside the attention mask as 0, pooled
                             over the text's tokens by `max` (SPLADE v2 and later) or `sum` (the first SPLADE)
    graph output [B, V]      the pooled vocabulary vector itself (a graph that pools)
    then                     the `max_active_dims` largest weights (the model's, or a request's `top_k`)

A text's vector is its non-zero weights by vocabulary id, ascending (SparseEncoder's sparse tensor, TEI's
/embed_sparse). Max pooling is taken over the logits before the activation: log1p and relu are monotone, so
max(log1p(relu(x))) = log1p(relu(max(x))) exactly, and the activation runs on one [V] vector per text, not on
[S, V].

Memory: one forward's logits are rows × padded length × V float32 (a 256-token text over BERT's 30522 ids: 31 MB).
Forwards are planned so that the logits of the model's concurrent forwards (one per lane) together stay within
`max_logits_mb` (a text longer than its share runs alone), which caps the rows of one forward by the vocabulary
size, and the pooled rows are kept sparse. While a forward runs, ONNX Runtime holds its own working copies of the
logits beside the output (benchmarks/RESULTS.md measures the process's peak).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import opt
from ..engine.model import LoadedModel
from ..engine.session import Session
from ..errors import InputError, ModelLoadError
from ..families import Folder
from .base import Array, RowPipeline, Timed, Timing, Work, pick_output
from .stmodules import Prompts, module_list, prompt_length
from .text import TextPipeline, TokenRow

POOLINGS = ("max", "sum")
ACTIVATIONS = ("relu", "log1p_relu")
# the modules a SparseEncoder folder may have for rsinfer to compute it exactly
TRANSFORMERS = ("MLMTransformer", "Transformer")
POOLING_MODULE = "SpladePooling"
OUTPUTS = ("logits", "sparse_embedding", "sentence_embedding", "output", "output0")


@dataclass(frozen=True)
class SparseOptions:
    """The sparse family's model keys."""

    # auto: the folder's SpladePooling (pooling_strategy), else max; sum: the first SPLADE's
    splade_pooling: str = opt("auto", choices=("auto", *POOLINGS))
    # auto: the folder's SpladePooling (activation_function), else relu; log1p_relu: log1p twice (OpenSearch's)
    splade_activation: str = opt("auto", choices=("auto", *ACTIVATIONS))
    # keep the N largest weights of each vector (over config_sentence_transformers.json's max_active_dims); a
    # request's `top_k` keeps fewer
    max_active_dims: int | None = opt(None, gt=0)
    # the masked-LM logits the model's concurrent forwards may hold together, in MiB (rows × padded tokens ×
    # vocabulary × 4 bytes each): caps the tokens of a forward below batching.max_tokens when the vocabulary is large
    max_logits_mb: int = opt(256, gt=0)
    # prompts by name, over those of config_sentence_transformers.json (a request names one: `prompt_name`)
    prompts: dict[str, str] | None = field(default=None, hash=False)
    # the prompt applied when a request names none (over the folder's default_prompt_name; "" for none)
    default_prompt_name: str | None = None


def recognise(folder: Folder) -> str | None:
    """A sentence-transformers SparseEncoder (its model_type, or a SpladePooling module)."""
    if folder.st_model_type == "SparseEncoder":
        return "config_sentence_transformers.json model_type: SparseEncoder"
    if any(t.endswith(f".{POOLING_MODULE}") for t in folder.modules):
        return f"modules.json has a {POOLING_MODULE}"
    return None


@dataclass
class SparseResult(Timed):
    """Per text: the vocabulary ids of its non-zero weights (ascending) and the weights."""

    rows: list[tuple[Array, Array]]
    timing: Timing
    tokens_of: Any = field(default=None, repr=False)    # ids → vocabulary tokens (the model's tokenizer)

    def dense(self, width: int) -> Array:
        """[n, width] float32 with every weight in place (sentence-transformers' dense output)."""
        out = np.zeros((len(self.rows), width), dtype=np.float32)
        for i, (ids, values) in enumerate(self.rows):
            out[i, ids] = values
        return out

    def token_names(self, i: int) -> list[str]:
        """Text i's vocabulary token at each of its ids."""
        return list(self.tokens_of(self.rows[i][0]))

    def top_tokens(self, i: int, k: int | None = None) -> list[tuple[str, float]]:
        """Text i's (token, weight) by weight, highest first (sentence-transformers' `decode`)."""
        ids, values = self.rows[i]
        order = np.argsort(-values, kind="stable")[:k]
        return list(zip(self.tokens_of(ids[order]), values[order].tolist(), strict=True))


class SparseEncoder(RowPipeline):
    """What the sparse routes (TEI /embed_sparse, /v1/embeddings/sparse, the Hugging Face tasks of a sparse model)
    call: the sparse family implements it, and so does every family that declares `serves=("sparse",)` (an M3
    model's lexical weights). Weights by vocabulary id, in input order."""

    kind = "sparse"              # the kind whose routes call it
    vocab_size: int              # the width of a text's whole vector

    def plan_sparse(self, texts: Sequence[str], *, top_k: int | None = None, truncate: bool | None = None,
                    direction: str = "right", param: str = "input", prompt_name: str | None = None,
                    prompt: str | None = None) -> Work[SparseResult]:
        """Texts → each text's non-zero weights (ids ascending), at most `top_k` of them."""
        raise NotImplementedError

    def tokens_of(self, ids: Array) -> list[str]:
        """The vocabulary token of each id."""
        raise NotImplementedError

    def prompt_text(self, prompt_name: str | None = None, prompt: str | None = None) -> str:
        """The text put before each input (InputError naming an unknown prompt)."""
        raise NotImplementedError


class SparsePipeline(TextPipeline, SparseEncoder):
    kind = "sparse"

    def __init__(self, model: LoadedModel) -> None:
        super().__init__(model)
        opts = model.config.own(SparseOptions)
        self.output = pick_output(model, OUTPUTS)
        shape = self.output_shape(self.output)
        if len(shape) not in (2, 3):
            raise ModelLoadError(f"model '{model.name}': sparse output '{self.output}' has shape {list(shape)}; "
                                 "expected masked-LM logits [batch, seq, vocab] or a pooled [batch, vocab]",
                                 model=model.name)
        self.pooled_in_graph = len(shape) == 2
        self.vocab_size = self._vocab(shape[-1])
        self.pooling, self.activation, self.source = self._splade(opts)
        st = model.aux.get("config_sentence_transformers.json", {})
        folder_k = st.get("max_active_dims") if isinstance(st, dict) else None
        self.max_active_dims: int | None = opts.max_active_dims or (
            folder_k if isinstance(folder_k, int) and folder_k > 0 else None)
        self.prompting = Prompts(model, opts.prompts, opts.default_prompt_name)
        # the model's forwards at once (its lanes) share the budget: together they never hold more logits
        lanes = max(1, model.replicas)
        budget = opts.max_logits_mb * (1 << 20) // (4 * self.vocab_size * lanes)
        self.logits_mb = opts.max_logits_mb
        if not self.pooled_in_graph:      # the scheduler plans every forward within it
            self.max_tokens = max(1, min(self.max_tokens, budget))
        self._id_to_token = np.array([self.encoder.tokenizer.id_to_token(i) or "" for i in range(self.vocab_size)],
                                     dtype=object)

    def _vocab(self, width: int | str | None) -> int:
        tok = self.encoder.tokenizer.get_vocab_size(with_added_tokens=True)
        if isinstance(width, int):
            if width < tok:
                raise ModelLoadError(f"model '{self.model.name}': the output is {width} wide but the tokenizer has "
                                     f"{tok} tokens: not a vocabulary vector", model=self.model.name)
            return width
        return tok

    def _splade(self, opts: SparseOptions) -> tuple[str, str, str]:
        """(pooling, activation, where they come from): the model entry's, else the folder's SpladePooling, else
        SPLADE v2's max and relu. A folder with any other module is refused: rsinfer would not compute it."""
        name = self.model.name
        cfg: dict[str, Any] = {}
        where = "no SpladePooling module: SPLADE's max pooling of log1p(relu)"
        for i, m in enumerate(module_list(self.model)):
            if i == 0 and m.name in TRANSFORMERS:
                continue
            if i == 1 and m.name == POOLING_MODULE and not self.pooled_in_graph:
                cfg, where = m.config, f"{m.path}/config.json"
                continue
            raise ModelLoadError(f"model '{name}': modules.json module {i} ({m.type}) is not one rsinfer computes for "
                                 f"a sparse model (it computes an MLMTransformer - the ONNX graph - then a "
                                 f"{POOLING_MODULE})", model=name)
        pooling = opts.splade_pooling if opts.splade_pooling != "auto" else str(cfg.get("pooling_strategy", "max"))
        activation = opts.splade_activation if opts.splade_activation != "auto" else \
            str(cfg.get("activation_function", "relu"))
        if pooling not in POOLINGS or activation not in ACTIVATIONS:
            raise ModelLoadError(f"model '{name}': {where}: pooling_strategy {pooling!r} / activation_function "
                                 f"{activation!r} is not SpladePooling's (pooling {', '.join(POOLINGS)}; activation "
                                 f"{', '.join(ACTIVATIONS)})", model=name)
        dim = cfg.get("embedding_dimension", cfg.get("word_embedding_dimension"))
        if isinstance(dim, int) and dim != self.vocab_size:
            raise ModelLoadError(f"model '{name}': {where} is for {dim} vocabulary ids; the graph gives "
                                 f"{self.vocab_size}", model=name)
        overridden = [k for k in ("splade_pooling", "splade_activation") if getattr(opts, k) != "auto"]
        return pooling, activation, where + (f" ({', '.join(overridden)} in config)" if overridden else "")

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "output": self.output, "pooling": "splade",
                "splade": None if self.pooled_in_graph else {"pooling_strategy": self.pooling,
                                                            "activation_function": self.activation,
                                                            "from": self.source},
                "vocab_size": self.vocab_size, "max_active_dims": self.max_active_dims,
                "max_logits_mb": self.logits_mb, "max_tokens_per_forward": self.max_tokens,
                "prompts": self.prompting.prompts, "default_prompt_name": self.prompting.default}

    # ------------------------------------------------------------ rows

    def forward(self, session: Session, rows: Sequence[TokenRow]) -> list[Any]:
        """One forward → each row's non-zero weights {indices, values}; the logits are pooled row by row, in place."""
        ids = [r[0] for r in rows]
        feeds = self.feeds.build(ids, [r[1] for r in rows], self.encoder.pad_id)
        out = self.model.run(session, feeds, [self.output])[self.output]
        result = []
        for j, row in enumerate(ids):
            vec = np.asarray(out[j], dtype=np.float32) if self.pooled_in_graph else self._pool(out[j, : len(row)])
            nz = np.flatnonzero(vec)
            result.append({"indices": nz.astype(np.int32), "values": vec[nz]})
        return result

    def _pool(self, logits: Array) -> Array:
        """[tokens, V] logits of one text → its [V] weights."""
        if self.pooling == "max":
            vec = np.asarray(logits.max(axis=0), dtype=np.float32)
            np.maximum(vec, 0, out=vec)
            np.log1p(vec, out=vec)
        else:
            x = np.asarray(logits, dtype=np.float32)
            x = np.maximum(x, 0, out=x if x.flags.writeable else None)
            np.log1p(x, out=x)
            if self.activation == "log1p_relu":
                np.log1p(x, out=x)
            return np.asarray(x.sum(axis=0), dtype=np.float32)
        if self.activation == "log1p_relu":
            np.log1p(vec, out=vec)
        return vec

    def tokens_of(self, ids: Array) -> list[str]:
        out: list[str] = self._id_to_token[np.asarray(ids, dtype=np.int64)].tolist()
        return out

    def plan(self, texts: Sequence[str], *, top_k: int | None = None, truncate: bool | None = None,
             direction: str = "right", param: str = "input", prompt_name: str | None = None,
             prompt: str | None = None) -> Work[SparseResult]:
        """Texts (with the prompt: `prompt`, the one `prompt_name` names, else the model's default) → each text's
        non-zero weights, at most `top_k` (and the model's max_active_dims) of them."""
        if top_k is not None and top_k < 1:
            raise InputError(f"`top_k` must be at least 1, got {top_k}", param="top_k")
        timing = Timing()
        t0 = time.perf_counter()
        prefix = self.prompting.text(prompt_name, prompt)
        if prefix:
            texts = [prefix + t for t in texts]
        keep = prompt_length(self.encoder.tokenizer, prefix) if prefix and direction == "left" else 0
        enc = self.encoder.encode(texts, truncate=truncate, direction=direction, param=param, keep=keep)
        timing.tokenize_s = time.perf_counter() - t0
        limit = min(k for k in (top_k, self.max_active_dims, self.vocab_size) if k is not None)

        def finish(rows: list[Any]) -> SparseResult:
            return SparseResult([_top(r["indices"], r["values"], limit) for r in rows], timing, self.tokens_of)

        return self.work(enc, finish, timing)

    plan_sparse = plan

    def prompt_text(self, prompt_name: str | None = None, prompt: str | None = None) -> str:
        return self.prompting.text(prompt_name, prompt)

    def encode(self, texts: Sequence[str], **kw: Any) -> SparseResult:
        return self.run(self.plan(texts, **kw))


def _top(ids: Array, values: Array, k: int) -> tuple[Array, Array]:
    """The k largest weights (ties: the lower id), back in id order."""
    if len(values) <= k:
        return ids, values
    keep = np.sort(np.argsort(-values, kind="stable")[:k])
    return ids[keep], values[keep]
