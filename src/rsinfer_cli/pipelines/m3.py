"""BGE-M3 style models: one forward, three representations, exactly as FlagEmbedding's `BGEM3FlagModel` computes
them - a dense vector, lexical (sparse) weights and ColBERT vectors - and its scores.

The folder holds a transformer graph and the two heads beside it (`colbert_linear` and `sparse_linear`, as
safetensors or as BAAI's `.pt`, read by pipelines/tensorfile.py with no pickle code run), or a graph with the heads
baked in (outputs `dense_vecs`, `sparse_vecs`, `colbert_vecs`, as the community single-graph exports name them).
Every size is read from the folder: the hidden width from the graph or the heads, the ColBERT width from
`colbert_linear.weight` ([dim, hidden]).

- Tokens: `<s>` + text + `</s>`, cut at max_len including both (texts are not stripped), padded with `<pad>`.
- Dense: `h[:, 0]` (CLS), L2-normalised.
- Lexical weights: `relu(h · sparse.weight + sparse.bias)` per token; by token id the largest over its occurrences,
  skipping the ids of the tokenizer's `<s>`, `</s>`, `<pad>` and `<unk>` (not `<mask>`) and every weight <= 0.
- ColBERT: `colbert_linear(h[:, 1:])` over the tokens after `<s>` (`</s>` kept), L2-normalised (eps 1e-12).
- Scores: dense = dot product; sparse = Σ over shared ids of w_q·w_p; colbert = mean over query vectors of the best
  dot product with the passage's; `sparse+dense` and `colbert+sparse+dense` = the weighted means with
  `m3_weights` [dense, sparse, colbert].

An M3 model answers the embedding routes (dense), the sparse routes (lexical weights), the token-vector routes
(ColBERT) and the rerank routes (`m3_score`), and `/v1/embeddings/m3` gives any subset from one forward: a row's
output holds all three, so the row cache holds a row once with everything it has."""

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
from .base import Array, Timed, Timing, Work
from .embedding import Embedder, EmbedResult, calibration
from .late_interaction import TokenVectorizer, TokenVectors
from .rerank import Reranker, ScoreResult
from .sparse import SparseEncoder, SparseResult
from .tensorfile import TensorFileError, read_tensors
from .text import TextPipeline, TokenRow

HEADS = ("colbert_linear", "sparse_linear")
HEAD_FILES = tuple(f"{h}.{ext}" for h in HEADS for ext in ("safetensors", "pt"))
GRAPH_OUTPUTS = ("dense_vecs", "sparse_vecs", "colbert_vecs")
SCORES = ("dense", "sparse", "colbert", "sparse+dense", "colbert+sparse+dense")
UNUSED_TOKENS = ("<s>", "</s>", "<pad>", "<unk>")     # FlagEmbedding's unused_tokens: cls, eos, pad, unk


@dataclass(frozen=True)
class M3Options:
    """The m3 family's model keys."""

    # FlagEmbedding's weights_for_different_modes: [dense, sparse, colbert] in the weighted scores
    m3_weights: tuple[float, ...] = (1.0, 1.0, 1.0)
    # the score the rerank routes return: dense | sparse | colbert | sparse+dense | colbert+sparse+dense
    m3_score: str = opt("colbert+sparse+dense", choices=SCORES)
    # documents per request on the rerank routes; more → 413
    max_rerank_documents: int = opt(1000, gt=0)
    # int8 / uint8 ranges of the dense vectors: a .npy of them (as for an embedding model); null: [-1, 1]
    quantization_calibration: str | None = None

    def check(self) -> list[tuple[str, str]]:
        w = self.m3_weights
        if len(w) != 3 or any(x < 0 for x in w) or not sum(w):
            return [("m3_weights", "three weights [dense, sparse, colbert], none negative, not all 0")]
        return []


def recognise(folder: Folder) -> str | None:
    """BGE-M3's layout: both heads beside the transformer."""
    found = [h for h in HEADS if any(f"{h}.{ext}" in folder.files for ext in ("safetensors", "pt"))]
    return "colbert_linear and sparse_linear heads beside the graph (BGE-M3)" if len(found) == 2 else None


@dataclass
class M3Result(Timed):
    """Per text, what was asked of dense vectors [d], lexical weights (ids in FlagEmbedding's order, weights) and
    ColBERT vectors [n - 1, dim]."""

    dense: Array | None
    lexical: list[tuple[Array, Array]] | None
    colbert: list[Array] | None
    timing: Timing


@dataclass(frozen=True)
class Heads:
    """The heads applied in numpy to the graph's token states (None where the graph computes them)."""

    colbert_w: Array       # [dim, hidden]
    colbert_b: Array       # [dim]
    sparse_w: Array        # [hidden]
    sparse_b: float
    source: str = field(default="", compare=False)


def lexical(ids: Sequence[int], weights: Array, unused: frozenset[int]) -> tuple[Array, Array]:
    """FlagEmbedding's lexical weights of one text: by id, the largest weight over its occurrences, skipping the
    unused ids and weights <= 0; ids in the order FlagEmbedding's dict holds them (where each first counted)."""
    best: dict[int, float] = {}
    for i, w in zip(ids, weights.tolist(), strict=True):
        if i in unused or w <= 0:
            continue
        if w > best.get(i, 0.0):
            best[i] = w
    return np.array(list(best), dtype=np.int32), np.array(list(best.values()), dtype=np.float32)


def unit(x: Array) -> Array:
    """Rows L2-normalised as torch.nn.functional.normalize (eps 1e-12)."""
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    out: Array = x / np.maximum(norm, 1e-12)
    return out


def lexical_score(q: tuple[Array, Array], p: tuple[Array, Array]) -> float:
    """Σ over the ids both have of w_q · w_p."""
    shared, qi, pi = np.intersect1d(q[0], p[0], assume_unique=True, return_indices=True)
    return float(np.dot(q[1][qi].astype(np.float64), p[1][pi].astype(np.float64))) if len(shared) else 0.0


def colbert_score(q: Array, p: Array) -> float:
    """Σ over the query's vectors of the best dot product with the passage's, over the query's count."""
    if not len(q) or not len(p):
        return 0.0
    return float((q.astype(np.float64) @ p.astype(np.float64).T).max(axis=1).sum() / len(q))


def scores(q: dict[str, Any], p: dict[str, Any], weights: Sequence[float]) -> dict[str, float]:
    """FlagEmbedding's compute_score of one pair from the two rows' outputs."""
    dense = float(np.dot(q["dense"].astype(np.float64), p["dense"].astype(np.float64)))
    sparse = lexical_score(q["lexical"], p["lexical"])
    colbert = colbert_score(q["colbert"], p["colbert"])
    w0, w1, w2 = weights
    return {"dense": dense, "sparse": sparse, "colbert": colbert,
            "sparse+dense": (w1 * sparse + w0 * dense) / (w1 + w0) if w1 + w0 else 0.0,
            "colbert+sparse+dense": (w2 * colbert + w1 * sparse + w0 * dense) / (w0 + w1 + w2)}


class M3Pipeline(TextPipeline, Embedder, SparseEncoder, TokenVectorizer, Reranker):
    kind = "m3"

    def __init__(self, model: LoadedModel) -> None:
        super().__init__(model)
        opts = model.config.own(M3Options)
        self.weights = tuple(float(w) for w in opts.m3_weights)
        self.score_mode = opts.m3_score
        self.max_documents: int = opts.max_rerank_documents
        names = model.output_names
        self.in_graph = all(n in names for n in GRAPH_OUTPUTS)
        self.heads: Heads | None = None
        if self.in_graph:
            self.output = "colbert_vecs"
            self.hidden = self._width("dense_vecs", -1)
            self.colbert_dim = self._width("colbert_vecs", -1)
        else:
            self.output = "last_hidden_state" if "last_hidden_state" in names else names[0]
            self.hidden = self._width(self.output, -1)
            self.heads = self._heads(self.hidden)
            self.colbert_dim = int(self.heads.colbert_w.shape[0])
        self.dim = self.hidden
        self.ranges = calibration(model, opts.quantization_calibration, self.hidden)
        tok = self.encoder.tokenizer
        self.unused = frozenset(i for t in UNUSED_TOKENS if (i := tok.token_to_id(t)) is not None)
        self.vocab_size: int = tok.get_vocab_size(with_added_tokens=True)
        self._id_to_token = np.array([tok.id_to_token(i) or "" for i in range(self.vocab_size)], dtype=object)

    # ------------------------------------------------------------ the folder, checked at load

    def _width(self, output: str, axis: int) -> int:
        shape = self.output_shape(output)
        width = shape[axis] if shape else None
        if not isinstance(width, int):
            raise ModelLoadError(f"model '{self.model.name}': output '{output}' has no fixed width ({list(shape)})",
                                 model=self.model.name)
        return width

    def _heads(self, hidden: int) -> Heads:
        """colbert_linear and sparse_linear from the folder (safetensors where both are there), checked against the
        graph's hidden width."""
        name = self.model.name
        files = self.model.resolved.aux
        got: dict[str, dict[str, Array]] = {}
        sources = []
        for head in HEADS:
            path = files.get(f"{head}.safetensors") or files.get(f"{head}.pt")
            if path is None:
                raise ModelLoadError(
                    f"model '{name}': an M3 model needs {head}.safetensors (or .pt) beside a graph that gives token "
                    f"states ('{self.output}'), or a graph with the outputs {', '.join(GRAPH_OUTPUTS)}", model=name)
            try:
                got[head] = read_tensors(path)
            except TensorFileError as exc:
                raise ModelLoadError(f"model '{name}': {exc}", model=name) from None
            sources.append(path.name)
        cw, cb = self._pair(got["colbert_linear"], "colbert_linear", hidden, None)
        sw, sb = self._pair(got["sparse_linear"], "sparse_linear", hidden, 1)
        return Heads(cw, cb, sw[0], float(sb[0]), ", ".join(sources))

    def _pair(self, tensors: dict[str, Array], head: str, hidden: int, rows: int | None) -> tuple[Array, Array]:
        w, b = tensors.get("weight"), tensors.get("bias")
        name = self.model.name
        if w is None or b is None or w.ndim != 2 or b.ndim != 1:
            raise ModelLoadError(f"model '{name}': {head} must hold weight [out, {hidden}] and bias [out] (it holds "
                                 f"{ {k: list(v.shape) for k, v in tensors.items()} })", model=name)
        if w.shape[1] != hidden or b.shape[0] != w.shape[0] or (rows is not None and w.shape[0] != rows):
            want = f"[{rows if rows is not None else 'dim'}, {hidden}]"
            raise ModelLoadError(f"model '{name}': {head}.weight is {list(w.shape)} and bias {list(b.shape)}; the "
                                 f"graph's token states are {hidden} wide, so weight must be {want} with a bias "
                                 "of its rows", model=name)
        return w.astype(np.float32), b.astype(np.float32)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "heads": "in the graph" if self.heads is None else self.heads.source,
                "output": self.output, "dense_dim": self.hidden, "colbert_dim": self.colbert_dim,
                "vocab_size": self.vocab_size, "m3_weights": list(self.weights), "m3_score": self.score_mode}

    # ------------------------------------------------------------ rows

    def forward(self, session: Session, rows: Sequence[TokenRow]) -> list[Any]:
        """One forward → each row's {dense, weights (every token's), colbert (tokens after <s>)}."""
        ids = [r[0] for r in rows]
        feeds = self.feeds.build(ids, [r[1] for r in rows], self.encoder.pad_id)
        lengths = [len(r) for r in ids]
        if self.heads is None:
            out = self.model.run(session, feeds, list(GRAPH_OUTPUTS))
            dense, weights, colbert = (out[n] for n in GRAPH_OUTPUTS)
            return [{"dense": np.asarray(dense[j], dtype=np.float32),
                     "weights": np.asarray(weights[j, :n, 0], dtype=np.float32),
                     "colbert": np.asarray(colbert[j, :n - 1], dtype=np.float32)} for j, n in enumerate(lengths)]
        states = self.model.run(session, feeds, [self.output])[self.output]
        h = self.heads
        result = []
        for j, n in enumerate(lengths):
            tokens = np.asarray(states[j, :n], dtype=np.float32)
            weights = np.maximum(tokens @ h.sparse_w + h.sparse_b, 0)
            colbert = unit(tokens[1:] @ h.colbert_w.T + h.colbert_b)
            result.append({"dense": unit(tokens[0]), "weights": weights.astype(np.float32),
                           "colbert": colbert.astype(np.float32)})
        return result

    def prompt_text(self, prompt_name: str | None = None, prompt: str | None = None) -> str:
        """A request's own `prompt`, put before each text; an M3 model has no named prompts."""
        if prompt_name is not None:
            raise InputError(f"`prompt_name` {prompt_name!r}: an M3 model has no named prompts", param="prompt_name")
        return prompt or ""

    def check_dimensions(self, dimensions: int | None) -> None:
        if dimensions is not None and dimensions != self.hidden:
            raise InputError(f"`dimensions`: an M3 model's dense vectors are {self.hidden} wide (no Matryoshka "
                             "truncation)", param="dimensions")

    def _encode(self, texts: Sequence[str], truncate: bool | None, direction: str, param: str,
                prompt: str | None, timing: Timing) -> Any:
        if prompt:
            texts = [prompt + t for t in texts]
        t0 = time.perf_counter()
        enc = self.encoder.encode(texts, truncate=truncate, direction=direction, param=param)
        timing.tokenize_s += time.perf_counter() - t0
        return enc

    def plan_m3(self, texts: Sequence[str], *, dense: bool = True, sparse: bool = False, colbert: bool = False,
                truncate: bool | None = None, direction: str = "right", param: str = "input") -> Work[M3Result]:
        """Any subset of the three outputs from one forward per text."""
        timing = Timing()
        enc = self._encode(texts, truncate, direction, param, None, timing)

        def finish(rows: list[Any]) -> M3Result:
            return M3Result(np.stack([r["dense"] for r in rows]) if dense and rows else
                            (np.zeros((0, self.hidden), np.float32) if dense else None),
                            [self._lexical(ids, r) for ids, r in zip(enc.ids, rows, strict=True)] if sparse else None,
                            [r["colbert"] for r in rows] if colbert else None, timing)

        return self.work(enc, finish, timing)

    def _lexical(self, ids: Sequence[int], row: dict[str, Any]) -> tuple[Array, Array]:
        return lexical(ids, row["weights"], self.unused)

    def convert_id_to_token(self, ids: Array, weights: Array) -> dict[str, float]:
        """FlagEmbedding's convert_id_to_token: each id re-keyed by the tokenizer's decoding of it alone (ids
        that decode alike collapse, the later one kept)."""
        tok = self.encoder.tokenizer
        return {tok.decode([int(i)]): float(w) for i, w in zip(ids.tolist(), weights.tolist(), strict=True)}

    # ------------------------------------------------------------ the embedding routes: dense vectors

    def plan(self, texts: Sequence[Any] | None = None, ids: Sequence[Sequence[int]] | None = None, *,
             dimensions: int | None = None, normalize: bool | None = None, truncate: bool | None = None,
             direction: str = "right", param: str = "input", prompt_name: str | None = None,
             prompt: str | None = None) -> Work[EmbedResult]:
        if ids is not None:
            raise InputError("an M3 model embeds texts, not token ids", param=param)
        self.check_dimensions(dimensions)
        if normalize is False:
            raise InputError("`normalize`: an M3 model's dense vectors are normalised, as FlagEmbedding gives them",
                             param="normalize")
        prompt = self.prompt_text(prompt_name, prompt)
        timing = Timing()
        enc = self._encode(list(texts or ()), truncate, direction, param, prompt, timing)

        def finish(rows: list[Any]) -> EmbedResult:
            return EmbedResult(np.stack([r["dense"] for r in rows]) if rows else
                               np.zeros((0, self.hidden), np.float32), timing)

        return self.work(enc, finish, timing)

    # ------------------------------------------------------------ the sparse routes: lexical weights

    def plan_sparse(self, texts: Sequence[str], *, top_k: int | None = None, truncate: bool | None = None,
                    direction: str = "right", param: str = "input", prompt_name: str | None = None,
                    prompt: str | None = None) -> Work[SparseResult]:
        if top_k is not None and top_k < 1:
            raise InputError(f"`top_k` must be at least 1, got {top_k}", param="top_k")
        prompt = self.prompt_text(prompt_name, prompt)
        timing = Timing()
        enc = self._encode(texts, truncate, direction, param, prompt, timing)

        def finish(rows: list[Any]) -> SparseResult:
            out = []
            for ids, r in zip(enc.ids, rows, strict=True):
                keys, values = self._lexical(ids, r)
                order = np.argsort(keys, kind="stable")          # the sparse routes' rows: ids ascending
                keys, values = keys[order], values[order]
                if top_k is not None and len(keys) > top_k:
                    keep = np.sort(np.argsort(-values, kind="stable")[:top_k])
                    keys, values = keys[keep], values[keep]
                out.append((keys, values))
            return SparseResult(out, timing, self.tokens_of)

        return self.work(enc, finish, timing)

    def tokens_of(self, ids: Array) -> list[str]:
        out: list[str] = self._id_to_token[np.asarray(ids, dtype=np.int64)].tolist()
        return out

    # ------------------------------------------------------------ the token-vector routes: ColBERT vectors

    def plan_vectors(self, texts: Sequence[str], *, is_query: bool = False, truncate: bool | None = None,
                     direction: str = "right", param: str = "input", prompt_name: str | None = None,
                     prompt: str | None = None) -> Work[TokenVectors]:
        prompt = self.prompt_text(prompt_name, prompt)
        timing = Timing()
        enc = self._encode(texts, truncate, direction, param, prompt, timing)
        return self.work(enc, lambda rows: TokenVectors([r["colbert"] for r in rows], timing), timing)

    # ------------------------------------------------------------ the rerank routes: compute_score

    def rule(self, raw: bool = False) -> str:
        return f"FlagEmbedding compute_score '{self.score_mode}' (weights {list(self.weights)})"

    def plan_rerank(self, query: str, docs: Sequence[str], *, raw: bool = False, truncate: bool | None = None,
                    direction: str = "right", max_tokens_per_doc: int | None = None) -> Work[ScoreResult]:
        if max_tokens_per_doc is not None:
            docs = self.encoder.cut(docs, max_tokens_per_doc)
        return self._ranked(self._pair_scores([query] * len(docs), docs, self.weights, truncate, direction,
                                              "documents"))

    def plan_pairs(self, queries: Sequence[str], docs: Sequence[str], *, raw: bool = False,
                   truncate: bool | None = None, direction: str = "right",
                   param: str = "documents") -> Work[ScoreResult]:
        return self._ranked(self._pair_scores(queries, docs, self.weights, truncate, direction, param))

    def plan_scores(self, queries: Sequence[str], docs: Sequence[str], *, weights: Sequence[float] | None = None,
                    truncate: bool | None = None, param: str = "pairs") -> Work[M3Scores]:
        """Every score of compute_score for queries[i] against docs[i] (`weights`: the request's, else the model's
        m3_weights)."""
        w = check_weights(weights) if weights is not None else self.weights
        work = self._pair_scores(queries, docs, w, truncate, "right", param)
        inner = work.finish

        def finish(rows: list[Any]) -> M3Scores:
            got = inner(rows)
            return M3Scores({m: [g[m] for g in got] for m in SCORES}, work.timing)

        return Work(work.rows, work.costs, finish, work.timing)

    def _ranked(self, work: Work[list[dict[str, float]]]) -> Work[ScoreResult]:
        """The rerank routes' score: the model's m3_score of each pair."""
        inner = work.finish
        return Work(work.rows, work.costs, lambda rows: ScoreResult(
            np.array([g[self.score_mode] for g in inner(rows)], dtype=np.float64), work.timing), work.timing)

    def _scored(self, ids: Sequence[int], row: dict[str, Any]) -> dict[str, Any]:
        return {"dense": row["dense"], "lexical": self._lexical(ids, row), "colbert": row["colbert"]}

    def _pair_scores(self, queries: Sequence[str], docs: Sequence[str], weights: Sequence[float],
                     truncate: bool | None, direction: str, param: str) -> Work[list[dict[str, float]]]:
        """compute_score's dict for each (queries[i], docs[i]), each distinct query encoded once."""
        unique = list(dict.fromkeys(queries))
        where = {q: i for i, q in enumerate(unique)}
        timing = Timing()
        enc = self._encode([*unique, *docs], truncate, direction, param, None, timing)
        n = len(unique)

        def finish(rows: list[Any]) -> list[dict[str, float]]:
            outs = [self._scored(ids, r) for ids, r in zip(enc.ids, rows, strict=True)]
            return [scores(outs[where[q]], d, weights) for q, d in zip(queries, outs[n:], strict=True)]

        return self.work(enc, finish, timing)


@dataclass
class M3Scores(Timed):
    """compute_score's dict: each mode's scores, one per pair."""

    scores: dict[str, list[float]]
    timing: Timing


def check_weights(weights: Sequence[float]) -> tuple[float, float, float]:
    w = tuple(float(x) for x in weights)
    if len(w) != 3 or any(x < 0 for x in w) or not sum(w):
        raise InputError("`weights`: three weights [dense, sparse, colbert], none negative, not all 0",
                         param="weights")
    return w[0], w[1], w[2]

