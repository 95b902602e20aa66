"""Late interaction (`kind: late_interaction`): ColBERT as PyLate computes it - a vector per token, and MaxSim.

    query      [CLS] [Q] text [SEP], cut to query_length; with query expansion padded with [MASK] to query_length
               (attended to only with attend_to_expansion_tokens) and every position kept
    document   [CLS] [D] text [SEP], cut to document_length; the tokens of skiplist_words (punctuation) dropped
    each kept  token vector → the folder's Dense projection(s) (when the graph lacks them) → L2 normalised
    score      MaxSim: Σ over the query's vectors of the largest dot product with any of the document's

The settings come from config_sentence_transformers.json as PyLate writes them (query_prefix, document_prefix,
query_length, document_length, do_query_expansion, attend_to_expansion_tokens, skiplist_words), under the model
entry's keys of the same names, over PyLate's defaults. The prefixes are single tokens of the tokenizer, inserted
after the first token as PyLate inserts them (a prefix the tokenizer lacks is a load error: PyLate would add it with
an untrained embedding the graph does not have).

The family serves the rerank routes (`serves=("rerank",)`): a ColBERT model is a drop-in reranker whose score is
PyLate's MaxSim sum (`maxsim: mean` divides it by the query's vector count).
"""

from __future__ import annotations

import string
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import opt
from ..engine.model import LoadedModel
from ..engine.session import Session
from ..errors import ModelLoadError
from ..families import Folder
from .base import Array, RowPipeline, Timed, Timing, Work, pick_output
from .rerank import Reranker, ScoreResult
from .stmodules import Prompts, Step, dense, l2_normalize, module_list
from .text import Encoded, TextEncoder, TextPipeline

OUTPUTS = ("token_embeddings", "last_hidden_state", "output0")
MASK_TOKENS = ("[MASK]", "<mask>")

# PyLate's defaults for what config_sentence_transformers.json does not say
PYLATE = {"query_prefix": "[Q] ", "document_prefix": "[D] ", "query_length": 32, "document_length": 180,
          "do_query_expansion": True, "attend_to_expansion_tokens": False,
          "skiplist_words": tuple(string.punctuation)}
# a Stanford ColBERT checkpoint without its artifact.metadata: PyLate's fallbacks
STANFORD_PREFIXES = {"query_prefix": "[unused0]", "document_prefix": "[unused1]"}


@dataclass(frozen=True)
class LateInteractionOptions:
    """The late_interaction family's model keys; each ColBERT setting is config_sentence_transformers.json's
    unless given here (then PyLate's default)."""

    query_prefix: str | None = None         # a token put after [CLS] of each query ("" for none); PyLate: "[Q] "
    document_prefix: str | None = None      # the same for documents; PyLate: "[D] "
    query_length: int | None = opt(None, gt=1)       # tokens of a query, prefix included; PyLate: 32
    document_length: int | None = opt(None, gt=1)    # at most this many tokens of a document; PyLate: 180
    do_query_expansion: bool | None = None  # pad queries with [MASK] to query_length; PyLate: true
    attend_to_expansion_tokens: bool | None = None   # the [MASK] padding is attended to; PyLate: false
    skiplist_words: tuple[str, ...] | None = None    # document tokens left out; PyLate: string.punctuation
    # rerank score: sum (PyLate's MaxSim) or mean (the sum over the query's vector count, in [-1, 1])
    maxsim: str = opt("sum", choices=("sum", "mean"))
    # documents per request on the rerank routes; more → 413
    max_rerank_documents: int = opt(1000, gt=0)
    # prompts by name, over those of config_sentence_transformers.json (a request names one: `prompt_name`)
    prompts: dict[str, str] | None = field(default=None, hash=False)
    # the prompt applied when a request names none (over the folder's default_prompt_name; "" for none)
    default_prompt_name: str | None = None


def recognise(folder: Folder) -> str | None:
    """A PyLate ColBERT folder, or a Stanford ColBERT checkpoint."""
    if folder.st_model_type == "ColBERT":
        return "config_sentence_transformers.json model_type: ColBERT"
    if "HF_ColBERT" in folder.architectures:
        return "config.json architectures: HF_ColBERT"
    return None


@dataclass
class TokenVectors(Timed):
    """Per text: its kept token vectors [n, dim], float32, unit length."""

    vectors: list[Array]
    timing: Timing


def maxsim(query: Array, doc: Array) -> float:
    """Σ over the query's vectors of the largest dot product with the document's (0 for a document with none, as
    PyLate's zero padding gives)."""
    if not len(doc) or not len(query):
        return 0.0
    return float((query.astype(np.float64) @ doc.astype(np.float64).T).max(axis=1).sum())


# one row: (token ids, type ids, how many leading tokens are attended to, is a query)
Row = tuple[Sequence[int], Sequence[int], int, bool]


class TokenVectorizer(RowPipeline):
    """What the token-vector routes (TEI /embed_all, /v1/embeddings/tokens) call: the late_interaction family
    implements it, and so does every family that declares `serves=("late_interaction",)` (an M3 model's ColBERT
    vectors). Each text's vectors [n, dim], unit length, in input order."""

    kind = "late_interaction"    # the kind whose routes call it

    def plan_vectors(self, texts: Sequence[str], *, is_query: bool = False, truncate: bool | None = None,
                     direction: str = "right", param: str = "input", prompt_name: str | None = None,
                     prompt: str | None = None) -> Work[TokenVectors]:
        """Texts → each one's token vectors, as queries or as documents."""
        raise NotImplementedError

    def prompt_text(self, prompt_name: str | None = None, prompt: str | None = None) -> str:
        """The text put before each input (InputError naming an unknown prompt)."""
        raise NotImplementedError


class LateInteractionPipeline(TextPipeline, Reranker, TokenVectorizer):
    kind = "late_interaction"

    def __init__(self, model: LoadedModel) -> None:
        super().__init__(model)
        opts = model.config.own(LateInteractionOptions)
        self.max_documents = opts.max_rerank_documents
        self.maxsim = opts.maxsim
        self.output = pick_output(model, OUTPUTS)
        shape = self.output_shape(self.output)
        if len(shape) != 3:
            raise ModelLoadError(f"model '{model.name}': late-interaction output '{self.output}' has shape "
                                 f"{list(shape)}; expected token vectors [batch, seq, dim]", model=model.name)
        self.settings, self.sources = self._settings(opts)
        tok = self.encoder.tokenizer
        self.prefix_ids = {side: self._prefix(side) for side in ("query", "document")}
        self.expansion_id = self._expansion_token()
        unk = next((i for t in ("[UNK]", "<unk>") if (i := tok.token_to_id(t)) is not None), None)
        # PyLate: convert_tokens_to_ids(word) for each word; a word outside the vocabulary is the unknown token's id
        skip = {tok.token_to_id(w) if tok.token_to_id(w) is not None else unk for w in self.settings["skiplist_words"]}
        self.skip_ids = np.array(sorted(i for i in skip if i is not None), dtype=np.int64)
        self.encoders = {side: self._encoder(side) for side in ("query", "document")}
        self.steps, self.modules_reason = self._steps(shape[-1])
        self.dim = next((s.width for s in reversed(self.steps) if s.width), shape[-1])
        self.prompting = Prompts(model, opts.prompts, opts.default_prompt_name)

    # ------------------------------------------------------------ what the folder says, checked at load

    def _settings(self, opts: LateInteractionOptions) -> tuple[dict[str, Any], dict[str, str]]:
        st = self.model.aux.get("config_sentence_transformers.json", {})
        stanford = "HF_ColBERT" in " ".join(map(str, self.model.hf_config.get("architectures") or []))
        settings: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for key, default in PYLATE.items():
            given = getattr(opts, key)
            if given is not None:
                settings[key], sources[key] = given, "config"
            elif isinstance(st, dict) and st.get(key) is not None:
                settings[key], sources[key] = st[key], "config_sentence_transformers.json"
            elif stanford and key in STANFORD_PREFIXES:
                settings[key], sources[key] = STANFORD_PREFIXES[key], "PyLate's default for a Stanford checkpoint"
            else:
                settings[key], sources[key] = default, "PyLate's default"
        settings["skiplist_words"] = tuple(str(w) for w in settings["skiplist_words"])
        for key in ("query_length", "document_length"):
            if not isinstance(settings[key], int) or settings[key] < 2:
                raise ModelLoadError(f"model '{self.model.name}': {key} must be an integer of at least 2 "
                                     f"({sources[key]}), got {settings[key]!r}", model=self.model.name)
        if not settings["do_query_expansion"]:
            settings["attend_to_expansion_tokens"] = False       # PyLate: no expansion, nothing to attend to
        return settings, sources

    def _prefix(self, side: str) -> int | None:
        prefix = self.settings[f"{side}_prefix"]
        if not prefix:
            return None
        found = self.encoder.tokenizer.token_to_id(prefix)
        if found is None:
            raise ModelLoadError(f"model '{self.model.name}': {side}_prefix {prefix!r} "
                                 f"({self.sources[f'{side}_prefix']}) is not a token of its tokenizer; PyLate adds "
                                 "it as a new token whose embedding this graph does not have", model=self.model.name)
        return int(found)

    def _expansion_token(self) -> int:
        """The token queries are padded with: the tokenizer's mask token (PyLate), else its end-of-text token."""
        tok = self.encoder.tokenizer
        named = self.model.aux.get("tokenizer_config.json", {}).get("mask_token")
        for t in (named if isinstance(named, str) else None, *MASK_TOKENS, "</s>", "<|endoftext|>"):
            if t is not None and (found := tok.token_to_id(t)) is not None:
                return int(found)
        if self.settings["do_query_expansion"]:
            raise ModelLoadError(f"model '{self.model.name}': query expansion needs a mask or end-of-text token; "
                                 "the tokenizer has neither (set do_query_expansion: false)", model=self.model.name)
        return self.encoder.pad_id

    def _encoder(self, side: str) -> TextEncoder:
        """Texts of one side cut to its length, one token left for the prefix (PyLate's max_seq_length)."""
        length = int(self.settings[f"{side}_length"]) - (self.prefix_ids[side] is not None)
        path = self.model.resolved.tokenizer_path
        assert path is not None            # TextPipeline checked it
        return TextEncoder(path, length, truncate=self.model.config.truncate, model=self.model.name)

    def _steps(self, width: int | str | None) -> tuple[list[Step], str]:
        """The folder's Dense projection(s) after the Transformer, unless the graph's output already has their
        width."""
        name = self.model.name
        steps: list[Step] = []
        for i, m in enumerate(module_list(self.model)):
            if i == 0 and m.name.endswith("Transformer"):
                continue
            if m.name != "Dense":
                raise ModelLoadError(f"model '{name}': modules.json module {i} ({m.type}) is not one rsinfer "
                                     "computes for a late-interaction model (a Transformer - the ONNX graph - then "
                                     "Dense projections)", model=name)
            try:
                steps.append(dense(m.config, self.model.resolved.aux, m.path, f"modules.json module {i} ({m.type})",
                                   on="token_embeddings"))
            except ValueError as exc:
                raise ModelLoadError(f"model '{name}': {exc}", model=name) from exc
        if not steps:
            if "HF_ColBERT" in " ".join(map(str, self.model.hf_config.get("architectures") or [])) and \
                    width == self.model.hf_config.get("hidden_size"):
                raise ModelLoadError(f"model '{name}': a Stanford ColBERT graph whose output is the encoder's "
                                     f"{width}-wide hidden state: its linear projection is not in the graph",
                                     model=name)
            return [], f"no Dense module: the graph's '{self.output}' vectors as they are"
        first, final = steps[0].takes, steps[-1].width
        if isinstance(width, int) and width == final and width != first:
            return [], f"the graph's '{self.output}' is {width} wide, the width after the Dense modules"
        if isinstance(width, int) and width != first:
            raise ModelLoadError(f"model '{name}': the graph's '{self.output}' is {width} wide; the folder's Dense "
                                 f"takes {first} and gives {final}", model=name)
        return steps, f"the graph gives the encoder's token vectors: {', '.join(s.label for s in steps)} in rsinfer"

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "output": self.output, "dimensions": self.dim,
                "modules_run": [s.label for s in self.steps], "modules_reason": self.modules_reason,
                **{k: list(v) if isinstance(v, tuple) else v for k, v in self.settings.items()},
                "settings_from": self.sources, "maxsim": self.maxsim,
                "prompts": self.prompting.prompts, "default_prompt_name": self.prompting.default}

    def rule(self, raw: bool = False) -> str:
        return "MaxSim sum" if raw or self.maxsim == "sum" else "MaxSim sum / query vectors"

    # ------------------------------------------------------------ rows

    def encode_side(self, texts: Sequence[str], is_query: bool, *, truncate: bool | None = None,
                    direction: str = "right", param: str = "input") -> tuple[list[Row], Encoded]:
        """Texts → rows as PyLate tokenizes them: cut to the side's length, queries padded with the expansion
        token, the prefix inserted after the first token."""
        side = "query" if is_query else "document"
        enc = self.encoders[side].encode(texts, truncate=truncate, direction=direction, param=param)
        prefix = self.prefix_ids[side]
        length = self.encoders[side].max_len or 0
        expand = is_query and self.settings["do_query_expansion"]
        rows: list[Row] = []
        for ids in enc.ids:
            attended = len(ids)
            if expand and len(ids) < length:
                ids = [*ids, *[self.expansion_id] * (length - len(ids))]
            if prefix is not None:
                ids = [*ids[:1], prefix, *ids[1:]]
                attended += 1
            if expand and self.settings["attend_to_expansion_tokens"]:
                attended = len(ids)
            rows.append((ids, [0] * len(ids), attended, is_query))
        return rows, enc

    def forward(self, session: Session, rows: Sequence[Any]) -> list[Any]:
        """Rows (`Row`s) → each one's kept token vectors, projected and unit length."""
        ids = [r[0] for r in rows]
        feeds = self.feeds.build(ids, [r[1] for r in rows], self.expansion_id)
        if "attention_mask" in feeds:
            for j, row in enumerate(rows):
                feeds["attention_mask"][j, row[2]:] = 0
        hidden = np.asarray(self.model.run(session, feeds, [self.output])[self.output], dtype=np.float32)
        picks = [self._kept(r) for r in rows]
        rows_idx = np.concatenate([np.full(len(p), j) for j, p in enumerate(picks)]).astype(np.int64)
        vectors = hidden[rows_idx, np.concatenate(picks).astype(np.int64)]
        for step in self.steps:
            vectors = step.apply(vectors)
        vectors = l2_normalize(vectors).astype(np.float32, copy=False)
        bounds = np.cumsum([0, *(len(p) for p in picks)])
        return [vectors[bounds[j]:bounds[j + 1]] for j in range(len(rows))]

    def _kept(self, row: Row) -> Array:
        """The positions whose vectors a text keeps: a query with expansion every one; a query without it the
        attended ones; a document its attended tokens outside the skiplist."""
        ids, _, attended, is_query = row
        if is_query:
            return np.arange(len(ids) if self.settings["do_query_expansion"] else attended)
        arr = np.asarray(ids[:attended], dtype=np.int64)
        return np.flatnonzero(~np.isin(arr, self.skip_ids))

    def row_bytes(self, row: Any) -> bytes:
        ids = np.asarray(row[0], dtype="<i4").tobytes()
        return len(ids).to_bytes(4, "little") + ids + int(row[2]).to_bytes(4, "little") + bytes([row[3]])

    def sample_rows(self, batch: int, length: int,
                    shapes: dict[str, list[int]] | None = None) -> tuple[list[Any], list[int]]:
        token = self.encoder.tokenizer.encode("the", add_special_tokens=False).ids[:1] or [1]
        return [(token * length, [0] * length, length, False)] * batch, [length] * batch

    def _rows(self, groups: Sequence[tuple[Sequence[str], bool, str]], truncate: bool | None, direction: str,
              timing: Timing, prompt: str = "") -> tuple[list[Row], list[int]]:
        """Rows of several groups of texts (queries, documents), usage counted in `timing`."""
        rows: list[Row] = []
        t0 = time.perf_counter()
        for texts, is_query, param in groups:
            texts = [prompt + t for t in texts] if prompt else texts
            part, enc = self.encode_side(texts, is_query, truncate=truncate, direction=direction, param=param)
            rows += part
            timing.tokens += enc.num_tokens
            timing.truncated += enc.truncated
        timing.tokenize_s += time.perf_counter() - t0
        return rows, [len(r[0]) for r in rows]

    def plan_vectors(self, texts: Sequence[str], *, is_query: bool = False, truncate: bool | None = None,
                     direction: str = "right", param: str = "input", prompt_name: str | None = None,
                     prompt: str | None = None) -> Work[TokenVectors]:
        """Texts → each one's token vectors, as queries or as documents."""
        timing = Timing()
        prefix = self.prompting.text(prompt_name, prompt)
        rows, costs = self._rows([(texts, is_query, param)], truncate, direction, timing, prefix)
        return Work(rows, costs, lambda outs: TokenVectors(list(outs), timing), timing)

    def plan_rerank(self, query: str, docs: Sequence[str], *, raw: bool = False, truncate: bool | None = None,
                    direction: str = "right", max_tokens_per_doc: int | None = None) -> Work[ScoreResult]:
        if max_tokens_per_doc is not None:
            docs = self.encoders["document"].cut(docs, max_tokens_per_doc)
        return self._scores([query], [0] * len(docs), docs, raw, truncate, direction, "documents")

    def plan_pairs(self, queries: Sequence[str], docs: Sequence[str], *, raw: bool = False,
                   truncate: bool | None = None, direction: str = "right",
                   param: str = "documents") -> Work[ScoreResult]:
        unique = list(dict.fromkeys(queries))          # each query is encoded once
        where = {q: i for i, q in enumerate(unique)}
        return self._scores(unique, [where[q] for q in queries], docs, raw, truncate, direction, param)

    def _scores(self, queries: Sequence[str], pick: Sequence[int], docs: Sequence[str], raw: bool,
                truncate: bool | None, direction: str, param: str) -> Work[ScoreResult]:
        """MaxSim of queries[pick[i]] with docs[i], for each i."""
        timing = Timing()
        rows, costs = self._rows([(queries, True, "query"), (docs, False, param)], truncate, direction, timing,
                                 self.prompting.text())      # the model's default prompt, as PyLate's encode
        n = len(queries)
        mean = self.maxsim == "mean" and not raw

        def finish(outs: list[Any]) -> ScoreResult:
            scores = np.array([maxsim(outs[q], d) / (len(outs[q]) if mean and len(outs[q]) else 1)
                               for q, d in zip(pick, outs[n:], strict=True)], dtype=np.float64)
            return ScoreResult(scores, timing)

        return Work(rows, costs, finish, timing)

    def prompt_text(self, prompt_name: str | None = None, prompt: str | None = None) -> str:
        return self.prompting.text(prompt_name, prompt)

    def vectors(self, texts: Sequence[str], **kw: Any) -> TokenVectors:
        return self.run(self.plan_vectors(texts, **kw))

    def rerank(self, query: str, docs: Sequence[str], **kw: Any) -> ScoreResult:
        return self.run(self.plan_rerank(query, docs, **kw))

