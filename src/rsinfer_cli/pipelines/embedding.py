"""Embedding: forward → pooling → the module pipeline's Dense / LayerNorm → model `dimensions` → L2 normalise →
request `dimensions`, with the model's prompts - a sentence-transformers folder computed as sentence-transformers
computes it (pipelines/stmodules.py), any other graph with rsinfer's defaults (masked mean, unit length)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import opt
from ..engine.model import LoadedModel
from ..errors import InputError, ModelLoadError
from .base import Array, RowPipeline, Timed, Timing, Work, stack
from .outtypes import Ranges
from .stmodules import (
    POOLING_MODES,
    Pooling,
    Prompts,
    Step,
    StFolder,
    l2_normalize,
    pool_modes,
    prompt_length,
    read_folder,
)
from .text import Encoded, TextPipeline

OUTPUT_ORDER = ("sentence_embedding", "_pooler_output", "pooler_output", "last_hidden_state",
                "token_embeddings", "output0")
# a sentence-transformers folder pools the Transformer's token vectors itself: BERT's pooler is not its embedding
ST_OUTPUT_ORDER = ("sentence_embedding", "last_hidden_state", "token_embeddings", "output0")
TOKEN_OUTPUTS = ("last_hidden_state", "token_embeddings")
COHERE_INPUT_TYPES = ("search_query", "search_document", "classification", "clustering")
# the prompt a Cohere `input_type` picks, first defined first: sentence-transformers' encode_query / encode_document
# (query; document, passage, corpus), and a prompt named after the type itself
INPUT_TYPE_PROMPTS = {"search_query": ("query",), "search_document": ("document", "passage", "corpus"),
                      "classification": ("classification",), "clustering": ("clustering",)}


def pool(hidden: Array, mask: Array, mode: str) -> Array:
    """[B,T,D] → [B,D] by one of sentence-transformers' pooling modes (cls, mean, max, last, ...)."""
    return pool_modes(hidden, mask, (mode,))


@dataclass
class EmbedResult(Timed):
    vectors: Array           # [n, d] float32, in input order
    timing: Timing           # tokens (usage), truncated rows, stage times


@dataclass(frozen=True)
class EmbeddingOptions:
    """The embedding family's model keys."""

    # auto: from the folder (modules.json's Pooling, else 1_Pooling/config.json, else mean); or one of
    # sentence-transformers' modes (last = lasttoken)
    pooling: str = opt("auto", choices=("auto", *POOLING_MODES))
    # unit-length vectors (a request's `normalize` overrides); null: as the folder says - a sentence-transformers
    # folder normalises when its modules.json ends in Normalize, any other folder does
    normalize: bool | None = None
    # keep the first N dimensions (Matryoshka), then normalize; a request's `dimensions` overrides
    dimensions: int | None = opt(None, gt=0)
    # the sizes a request's `dimensions` may ask for (besides the full width); others are refused with the list
    matryoshka_dimensions: tuple[int, ...] = opt((), gt=0)
    # whether the graph pools is seen from its output ([B, D] is pooled); when given, it is checked against that and
    # a model whose output says otherwise fails to load
    pooling_in_graph: bool | None = None
    # whether a pooled graph output already went through the folder's Dense / LayerNorm modules; null: decided from
    # the output's width (and, where widths cannot tell, by comparing the graph's token and pooled outputs at load)
    dense_in_graph: bool | None = None
    # prompts by name, over those of config_sentence_transformers.json; e5's: {query: "query: ", passage: "passage: "}
    # (a request names one: `prompt_name`, Cohere's `input_type`)
    prompts: dict[str, str] | None = field(default=None, hash=False)
    # the prompt applied when a request names none (over the folder's default_prompt_name; "" for none)
    default_prompt_name: str | None = None
    # int8 / uint8 output ranges: a .npy of this model's float vectors, whose per-dimension minimum and maximum are
    # the ranges (sentence-transformers' calibration_embeddings); null: [-1, 1] on every dimension
    quantization_calibration: str | None = None
    # Cohere embed's `input_type` → a prompt name (default: search_query → query, search_document → document or
    # passage or corpus, classification and clustering → a prompt of that name)
    input_type_prompts: dict[str, str] | None = field(default=None, hash=False)

    def check(self) -> list[tuple[str, str]]:
        return [(f"input_type_prompts.{key}", f"not a Cohere input_type (one of {', '.join(COHERE_INPUT_TYPES)})")
                for key in (self.input_type_prompts or {}) if key not in COHERE_INPUT_TYPES]


class Embedder(RowPipeline):
    """What the embedding routes call (OpenAI /v1/embeddings, TEI /embed and /similarity, Cohere /v1 and /v2/embed,
    the Hugging Face feature-extraction task), as the rerank routes call `Reranker`: the embedding family implements
    it, and so does every family that declares `serves=("embedding",)`. `texts` are its family's rows (texts here;
    each family's `InputKind` decodes and bounds them: server/routes/common.check_inputs); `ids` are token ids, for
    the families that have a tokenizer. Vectors come back in input order."""

    kind = "embedding"           # the kind whose routes and commands call it

    def plan(self, texts: Sequence[Any] | None = None, ids: Sequence[Sequence[int]] | None = None, *,
             dimensions: int | None = None, normalize: bool | None = None, truncate: bool | None = None,
             direction: str = "right", param: str = "input", prompt_name: str | None = None,
             prompt: str | None = None) -> Work[EmbedResult]:
        """The family's rows (`texts`: its InputKind's, texts for this family) → Work whose answer is their vectors."""
        raise NotImplementedError

    dim: int | None              # the served width
    ranges: Ranges | None = None # int8 / uint8 output ranges (None: [-1, 1]; pipelines/outtypes.py)

    def prompt_for_input_type(self, input_type: str | None) -> str | None:
        """The prompt name Cohere's `input_type` picks (None: no prompt)."""
        return None

    def check_dimensions(self, dimensions: int | None) -> None:
        """A request's `dimensions` (InputError when the model cannot give that width)."""
        raise NotImplementedError

    def prompt_text(self, prompt_name: str | None = None, prompt: str | None = None) -> str:
        """The text put before each input (InputError naming an unknown prompt)."""
        raise NotImplementedError

    def plan_items(self, items: Sequence[tuple[str, Any]], *, normalize: bool | None = None,
                   param: str = "input") -> Work[EmbedResult]:
        """Texts and images in one list, ("text", str) or ("image", bytes), → vectors in that order (a text-only
        model takes texts alone)."""
        if any(kind != "text" for kind, _ in items):
            return self.plan_images([v for _, v in items], normalize=normalize, param=param)
        return self.plan([v for _, v in items], normalize=normalize, param=param)

    def plan_images(self, images: Sequence[bytes | str], *, normalize: bool | None = None, route: str = "processor",
                    param: str = "input") -> Work[EmbedResult]:
        """Encoded images → vectors in the model's space (a text-only model refuses: InputError)."""
        raise InputError(f"model '{self.model.name}' embeds text only; images need an image_text model (CLIP, "
                         "SigLIP)", param=param)


class EmbeddingPipeline(TextPipeline, Embedder):
    kind = "embedding"

    def __init__(self, model: LoadedModel) -> None:
        super().__init__(model)
        opts = model.config.own(EmbeddingOptions)
        self.st: StFolder | None = read_folder(model)
        st_pooling = self.st.pooling if self.st is not None else None
        width = self._output(opts, st_pooling)
        self.pooler: Pooling = self._pooling(opts, st_pooling)
        self.pooling = self.pooler.name
        self.pooling_reason = f"output '{self.output}' is already pooled" if self.pooled_in_graph \
            else self.pooler.source
        steps, self.modules_reason = self._steps(opts, width)
        self.steps = steps
        self.native_dim = self._check_widths(width)
        while self.steps and self.steps[-1].kind == "Normalize":
            self.steps = self.steps[:-1]   # a final Normalize is the default of `normalize` (a request may turn it off)
        # a sentence-transformers pipeline normalises when it ends in Normalize; any other folder does by default
        folder_normalizes = self.st.ends_normalized if self.st is not None and self.st.modules else True
        self.normalize = opts.normalize if opts.normalize is not None else folder_normalizes
        self.dim: int | None = self._served_width(opts)
        self.matryoshka = tuple(sorted(set(opts.matryoshka_dimensions)))
        too_wide = [d for d in self.matryoshka if self.dim and d > self.dim]
        if too_wide:
            raise ModelLoadError(f"model '{model.name}': matryoshka_dimensions {too_wide[0]} is wider than the "
                                 f"model's {self.dim}-dimensional output", model=model.name)
        self.prompting = Prompts(model, opts.prompts, opts.default_prompt_name)
        self.prompts, self.default_prompt_name = self.prompting.prompts, self.prompting.default
        self.input_type_prompts = dict(opts.input_type_prompts or {})
        for input_type, name in self.input_type_prompts.items():
            self.prompting.check(name, f"input_type_prompts.{input_type}")
        self._prompt_lengths: dict[str, int] = {}
        self.vocab_size: int = self.encoder.tokenizer.get_vocab_size(with_added_tokens=True)
        self.ranges = calibration(model, opts.quantization_calibration, self.native_dim)

    # ------------------------------------------------------------ what the folder says, checked at load

    def _output(self, opts: EmbeddingOptions, st_pooling: Pooling | None) -> int | None:
        """The graph output the vectors come from (a sentence-transformers folder's own pooling wins over BERT's
        pooler), whether it is pooled, checked against `pooling_in_graph`; its width when fixed."""
        name = self.model.name
        names = self.model.output_names
        order = ST_OUTPUT_ORDER if st_pooling is not None else OUTPUT_ORDER
        self.output = next((n for n in order if n in names), names[0])
        info = self.model.graph.output(self.output)
        assert info is not None
        if len(info.shape) not in (2, 3):
            raise ModelLoadError(f"model '{name}': embedding output '{self.output}' has shape "
                                 f"{list(info.shape)}; expected [batch, dim] or [batch, seq, dim]", model=name)
        self.pooled_in_graph = len(info.shape) == 2
        if opts.pooling_in_graph is not None and opts.pooling_in_graph != self.pooled_in_graph:
            raise ModelLoadError(
                f"model '{name}': pooling_in_graph is {str(opts.pooling_in_graph).lower()} but the graph's output "
                f"'{self.output}' has shape {list(info.shape)}, "
                f"{'[batch, dim]: already pooled' if self.pooled_in_graph else '[batch, seq, dim]: not pooled'}; "
                "remove the key (rsinfer sees from the output whether the graph pools) or fix the model", model=name)
        return info.shape[-1] if isinstance(info.shape[-1], int) else None

    def _served_width(self, opts: EmbeddingOptions) -> int | None:
        """The width served: the model's `dimensions`, else the folder's truncate_dim, at most the native width."""
        served = opts.dimensions or (self.st.truncate_dim if self.st is not None else None)
        if served and self.native_dim:
            return min(served, self.native_dim)
        return served or self.native_dim

    def _pooling(self, opts: EmbeddingOptions, st_pooling: Pooling | None) -> Pooling:
        if opts.pooling != "auto":
            base = st_pooling or Pooling()
            return Pooling((opts.pooling,), base.dimension, base.include_prompt, "pooling in config")
        if st_pooling is not None:
            return st_pooling
        legacy = self.model.aux.get("1_Pooling/config.json", {})
        if not legacy:
            return Pooling()
        try:
            return Pooling.from_config(legacy, "1_Pooling/config.json")
        except ValueError as exc:
            raise ModelLoadError(f"model '{self.model.name}': {exc}", model=self.model.name) from exc

    def _steps(self, opts: EmbeddingOptions, width: int | None) -> tuple[list[Step], str]:
        """The modules after pooling that rsinfer runs, and why: all of them on token vectors; on a pooled output,
        none with weights when the graph already holds them (its width says, or a trial forward)."""
        steps = list(self.st.steps) if self.st is not None else []
        weighted = [s for s in steps if s.weights]
        if not weighted:
            return steps, "no Dense or LayerNorm modules"
        if not self.pooled_in_graph:
            if opts.dense_in_graph:
                raise ModelLoadError(f"model '{self.model.name}': dense_in_graph is true but the graph's output "
                                     f"'{self.output}' is token vectors, before pooling", model=self.model.name)
            return steps, f"the graph gives token vectors ('{self.output}'): pooling and modules run in rsinfer"
        baked, why = self._in_graph(opts, steps, width)
        if not baked:
            return steps, f"{why}: the modules run in rsinfer"
        last = max(i for i, s in enumerate(steps) if s.weights)
        return steps[last + 1:], f"{why}: the graph holds them, rsinfer does not run them again"

    def _in_graph(self, opts: EmbeddingOptions, steps: list[Step], width: int | None) -> tuple[bool, str]:
        """Whether a pooled output already went through the modules, and why: `dense_in_graph` (checked against the
        width), else the width, else a trial forward."""
        name = self.model.name
        after_pool = self.pooler.width
        final = next((s.width for s in reversed(steps) if s.width), after_pool)
        if width is not None and after_pool is not None and width not in (after_pool, final):
            raise ModelLoadError(f"model '{name}': the graph's pooled output '{self.output}' is {width} wide; the "
                                 f"folder's pooling gives {after_pool} and its modules {final}", model=name)
        tells = width is not None and after_pool is not None and after_pool != final
        by_width = width == final if tells else None
        if opts.dense_in_graph is not None:
            if by_width is not None and by_width != opts.dense_in_graph:
                raise ModelLoadError(f"model '{name}': dense_in_graph is {str(opts.dense_in_graph).lower()} but the "
                                     f"graph's '{self.output}' is {width} wide, the width "
                                     f"{'after' if by_width else 'before'} the Dense modules", model=name)
            return opts.dense_in_graph, "dense_in_graph in config"
        if by_width is not None:
            return by_width, f"the graph's '{self.output}' is {width} wide, the width " \
                             f"{'after' if by_width else 'before'} the modules"
        return self._compare_outputs(steps), "a trial forward compared the graph's outputs"

    def _compare_outputs(self, steps: list[Step]) -> bool:
        """Whether the graph's pooled output is its token vectors pooled and run through the modules (True) or only
        pooled (False), from one forward on a sample text; remembered with the model (front ends hold no
        session)."""
        name = self.model.name
        known = self.model.stats.get("dense_in_graph")
        if isinstance(known, bool):
            return known
        token = next((n for n in TOKEN_OUTPUTS if n in self.model.output_names), None)
        if token is None or not self.model.sessions:
            raise ModelLoadError(f"model '{name}': its pooled output '{self.output}' is as wide before the Dense "
                                 "modules as after them, and the graph has no token output to tell them apart; "
                                 "set dense_in_graph: true or false", model=name)
        enc = self.encoder.encode(["rsinfer compares the outputs of this graph"])
        feeds = self.feeds.build(enc.ids, enc.type_ids, self.encoder.pad_id)
        out = self.model.run(self.model.sessions[0], feeds, [self.output, token])
        mask = np.ones(feeds["input_ids"].shape, dtype=np.int64)
        pooled = pool_modes(np.asarray(out[token], dtype=np.float32), mask, self.pooler.modes)
        through = pooled
        for s in steps:
            through = s.apply(through)
        graph = l2_normalize(np.asarray(out[self.output], dtype=np.float32))
        if np.abs(l2_normalize(through) - graph).max() < 1e-3:
            baked = True
        elif np.abs(l2_normalize(pooled) - graph).max() < 1e-3:
            baked = False
        else:
            raise ModelLoadError(f"model '{name}': its pooled output '{self.output}' is neither its token vectors "
                                 "pooled nor those through the folder's modules; set dense_in_graph", model=name)
        self.model.stats["dense_in_graph"] = baked
        return baked

    def _check_widths(self, width: int | None) -> int | None:
        """The vectors' width after the modules rsinfer runs, each module checked against the width it gets."""
        name = self.model.name
        if width is None:
            return None
        if not self.pooled_in_graph:
            dim = self.pooler.dimension
            if dim is not None and dim != width:
                raise ModelLoadError(f"model '{name}': the folder's Pooling is for {dim}-wide token vectors; the "
                                     f"graph's '{self.output}' gives {width}", model=name)
            width *= len(self.pooler.modes)
        for s in self.steps:
            if s.takes is not None and s.takes != width:
                raise ModelLoadError(f"model '{name}': {s.label} takes {s.takes}-wide vectors; it gets {width}",
                                     model=name)
            width = s.width or width
        return width

    @property
    def prompt_names(self) -> list[str]:
        """Every name a request may give: the model's prompts and sentence-transformers' query and document."""
        return self.prompting.names

    def describe(self) -> dict[str, Any]:
        return {"kind": "embedding", "output": self.output,
                "pooling": None if self.pooled_in_graph else self.pooling, "pooling_reason": self.pooling_reason,
                **({"modules": list(self.st.modules), "modules_run": [s.label for s in self.steps],
                    "modules_reason": self.modules_reason} if self.st is not None and self.st.modules else {}),
                "dimensions": self.dim, "normalize": self.normalize,
                **({"matryoshka_dimensions": list(self.matryoshka)} if self.matryoshka else {}),
                "prompts": self.prompts, "default_prompt_name": self.default_prompt_name,
                **({"input_type_prompts": self.input_type_prompts} if self.input_type_prompts else {})}

    # ------------------------------------------------------------ prompts

    def prompt_text(self, prompt_name: str | None = None, prompt: str | None = None) -> str:
        """The text put before each input: `prompt` as given, the prompt `prompt_name` names, else the default
        prompt (sentence-transformers' rules; query and document exist for every model, empty unless defined)."""
        return self.prompting.text(prompt_name, prompt)

    def prompt_for_input_type(self, input_type: str | None) -> str | None:
        """The prompt name a Cohere `input_type` picks (None: the model's default prompt)."""
        if input_type is None:
            return None
        mapped = self.input_type_prompts.get(input_type)
        if mapped is not None:
            return mapped
        found = next((n for n in INPUT_TYPE_PROMPTS.get(input_type, ()) if n in self.prompts), None)
        if found is not None:
            return found
        # sentence-transformers' encode_query / encode_document: the (empty) query or document prompt
        return {"search_query": "query", "search_document": "document"}.get(input_type)

    def _prompt_tokens(self, prefix: str) -> int:
        """The prompt's tokens at the start of each row (sentence-transformers' count): worked out once for each of
        the model's own prompts, and each time for a `prompt` a request made up (never kept: clients could grow
        the server's memory with them)."""
        if not prefix:
            return 0
        n = self._prompt_lengths.get(prefix)
        if n is None:
            n = prompt_length(self.encoder.tokenizer, prefix)
            if prefix in self.prompts.values():
                self._prompt_lengths[prefix] = n
        return n

    # ------------------------------------------------------------ rows

    def encode(self, texts: Sequence[str], truncate: bool | None = None, direction: str = "right",
               param: str = "input", keep: int = 0) -> Encoded:
        """`keep`: leading tokens (the prompt) that left truncation keeps."""
        return self.encoder.encode(texts, truncate=truncate, direction=direction, param=param, keep=keep)

    def encode_ids(self, rows: Sequence[Sequence[int]], truncate: bool | None = None,
                   param: str = "input") -> Encoded:
        """Token-id input: ids used verbatim, checked against the vocabulary, held to max_len."""
        max_len = self.model.max_len
        allow_cut = self.model.config.truncate if truncate is None else truncate
        out: list[list[int]] = []
        cut = 0
        for i, row in enumerate(rows):
            bad = next((t for t in row if not 0 <= t < self.vocab_size), None)
            if bad is not None:
                raise InputError(f"{param}[{i}] has token id {bad} outside the vocabulary (0..{self.vocab_size - 1})",
                                 param=f"{param}[{i}]")
            if not row:
                raise InputError(f"{param}[{i}] is an empty token list", param=f"{param}[{i}]")
            if max_len and len(row) > max_len:
                if not allow_cut:
                    raise InputError(f"{param}[{i}] has {len(row)} tokens but max_len is {max_len}; shorten it "
                                     "or allow truncation", param=f"{param}[{i}]")
                row, cut = row[:max_len], cut + 1
            out.append(list(row))
        return Encoded(ids=out, type_ids=[[0] * len(r) for r in out], truncated=cut)

    def pool_mask(self, rows: Sequence[Any], lengths: Array, width: int) -> Array:
        """The real tokens, less each row's prompt where pooling leaves the prompt out."""
        mask = super().pool_mask(rows, lengths, width)
        for j, row in enumerate(rows):
            if len(row) > 2:
                mask[j, : row[2]] = 0
        return mask

    def row_bytes(self, row: Any) -> bytes:
        base = super().row_bytes(row)
        return base + b"\xffskip" + int(row[2]).to_bytes(4, "little") if len(row) > 2 else base

    def reduce(self, out: Array, mask: Array) -> Array:
        """One forward's output → [n, D] float32 after pooling and the modules rsinfer runs (before the final
        normalisation)."""
        vectors = np.asarray(out, dtype=np.float32)
        if not self.pooled_in_graph:
            vectors = pool_modes(vectors, mask, self.pooler.modes)
        for step in self.steps:
            vectors = step.apply(vectors)
        return vectors

    def check_dimensions(self, dimensions: int | None) -> None:
        """A request's `dimensions` must be 1..the model's output size, and one of its Matryoshka sizes when it has
        them: the one check of the option, the first thing `plan` does (the CLI calls it before reading input)."""
        if dimensions is None:
            return
        if not 0 < dimensions <= (self.dim or 1 << 30):
            raise InputError(f"`dimensions` must be between 1 and {self.dim} for model '{self.model.name}', "
                             f"got {dimensions}", param="dimensions")
        allowed = sorted({*self.matryoshka, *([self.dim] if self.dim else [])})
        if self.matryoshka and dimensions not in allowed:
            raise InputError(f"`dimensions` {dimensions} is not a size model '{self.model.name}' was trained for; "
                             f"its sizes: {', '.join(map(str, allowed))}", param="dimensions")

    def postprocess(self, vectors: Array, dimensions: int | None = None, normalize: bool | None = None) -> Array:
        """The served width (model `dimensions`, or the folder's truncate_dim) → L2 normalise (model setting unless
        the request says) → request `dimensions`, normalised again when normalising."""
        if self.dim and self.dim < vectors.shape[1]:
            vectors = vectors[:, : self.dim]
        unit = self.normalize if normalize is None else normalize
        if unit:
            vectors = l2_normalize(vectors)
        if dimensions is not None:
            if dimensions > vectors.shape[1]:     # plan checked it against the width known at load; this one was not
                raise InputError(f"`dimensions` must be between 1 and {vectors.shape[1]} for model "
                                 f"'{self.model.name}', got {dimensions}", param="dimensions")
            if dimensions < vectors.shape[1]:
                vectors = vectors[:, :dimensions]
                if unit:
                    vectors = l2_normalize(vectors)
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def plan(self, texts: Sequence[Any] | None = None, ids: Sequence[Sequence[int]] | None = None, *,
             dimensions: int | None = None, normalize: bool | None = None, truncate: bool | None = None,
             direction: str = "right", param: str = "input", prompt_name: str | None = None,
             prompt: str | None = None) -> Work[EmbedResult]:
        """Texts (or token-id rows) → rows, and how pooled rows become vectors in input order. Texts get the prompt
        (`prompt`, the one `prompt_name` names, else the model's default); token ids are embedded as given."""
        self.check_dimensions(dimensions)
        timing = Timing()
        t0 = time.perf_counter()
        skip = 0
        if texts is not None:
            prefix = self.prompt_text(prompt_name, prompt)
            if prefix:
                texts = [prefix + t for t in texts]
            # the prompt's length matters to pooling without it (`include_prompt: false`) and to left truncation
            needed = not self.pooler.include_prompt or direction == "left"
            tokens = self._prompt_tokens(prefix) if needed else 0
            skip = 0 if self.pooler.include_prompt else tokens
            enc = self.encode(texts, truncate=truncate, direction=direction, param=param, keep=tokens)
        else:
            if prompt_name is not None or prompt is not None:
                raise InputError("a prompt applies to texts; token ids are embedded as given",
                                 param="prompt_name" if prompt is None else "prompt")
            enc = self.encode_ids(ids or [], truncate=truncate, param=param)
        timing.tokenize_s = time.perf_counter() - t0
        width = self.native_dim or 0

        def finish(pooled: list[Any]) -> EmbedResult:
            return EmbedResult(self.postprocess(stack(pooled, width).astype(np.float32), dimensions, normalize),
                               timing)

        work = self.work(enc, finish, timing)
        if skip:
            for i, row in enumerate(enc.ids):
                if len(row) <= skip:
                    raise InputError(f"{param}[{i}]: the prompt takes {skip} of its {len(row)} tokens (max_len "
                                     f"{self.model.max_len}) and the model pools without it: nothing is left to "
                                     "embed", param=f"{param}[{i}]")
            work.rows = [(r[0], r[1], skip) for r in work.rows]
        return work

    def embed(self, texts: Sequence[str] | None = None, ids: Sequence[Sequence[int]] | None = None, *,
              dimensions: int | None = None, normalize: bool | None = None, truncate: bool | None = None,
              direction: str = "right", param: str = "input", prompt_name: str | None = None,
              prompt: str | None = None) -> EmbedResult:
        """Texts (or token-id rows) → vectors in input order, with usage and timing."""
        return self.run(self.plan(texts, ids, dimensions=dimensions, normalize=normalize, truncate=truncate,
                                  direction=direction, param=param, prompt_name=prompt_name, prompt=prompt))


def calibration(model: LoadedModel, path: str | None, dim: int | None) -> Ranges | None:
    """The model's int8 / uint8 ranges from its `quantization_calibration` file (None: [-1, 1])."""
    if path is None:
        return None
    from pathlib import Path

    try:
        return Ranges.load(Path(path), dim)
    except ValueError as exc:
        raise ModelLoadError(f"model '{model.name}': quantization_calibration: {exc}", model=model.name) from None


def quality(a: EmbeddingPipeline, b: EmbeddingPipeline, texts: Sequence[str]) -> dict[str, float]:
    """What b's vectors lose against a's (the quality gate): each text's cosine (mean, min) and the overlap of
    every text's 10 nearest neighbours in the corpus."""
    from .quality import cosines, neighbour_recall

    va, vb = a.embed(texts).vectors, b.embed(texts).vectors
    cos = cosines(va, vb)
    return {"mean_cosine": float(cos.mean()), "min_cosine": float(cos.min()),
            "top10_recall": neighbour_recall(va, vb)}
