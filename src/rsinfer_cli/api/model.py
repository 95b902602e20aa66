"""`Model`: one loaded model and the methods named after the CLI's commands. Every method runs its texts through the
same inference core as `rsinfer serve` and the one-shot commands (length-sorted forwards, the config's cache), in
chunks of `chunk_rows` texts so that memory stays bounded whatever the list's length."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from ..errors import ConfigError, InputError

if TYPE_CHECKING:
    import numpy as np

    from ..pipelines.base import RowPipeline
    from ..pipelines.pii import Entity, PiiPipeline, Redacted
    from ..pipelines.pii_rules import Rules
    from ..pipelines.records import Planned, Policy
    from ..pipelines.zeroshot import TrueFalse, ZeroShot
    from ..runtime import Runtime

P = TypeVar("P", bound="RowPipeline")


class SparseVector(NamedTuple):
    """A text's non-zero weights: vocabulary ids (ascending, int64) and their weights (float32)."""

    indices: np.ndarray
    values: np.ndarray


@dataclass(frozen=True)
class Ranked:
    """A document's place in a ranking: its index in the documents given, and its score."""

    index: int
    score: float


class Label(NamedTuple):
    label: str
    score: float


class RedactedRecord(NamedTuple):
    """A redacted record and, per changed path, where each span was and what stands there now."""

    record: dict[str, Any]
    spans: dict[str, list[Redacted]]


class RedactedText(NamedTuple):
    """A redacted text and where each span was and what stands there now (never the value it removed)."""

    text: str
    spans: list[Redacted]


def check_texts(texts: Any, param: str = "texts") -> list[str]:
    """A list of strings, or InputError naming the first item that is not one (a lone str is the usual slip)."""
    if isinstance(texts, (str, bytes)):
        raise InputError(f"`{param}` must be a list of strings, got one {type(texts).__name__} (wrap it: [text])",
                         param=param)
    try:
        out = list(texts)
    except TypeError:
        raise InputError(f"`{param}` must be a list of strings, got {type(texts).__name__}", param=param) from None
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise InputError(f"`{param}[{i}]` is {type(t).__name__}, not a string", param=param)
    return out


def pii_rules(patterns: Sequence[Mapping[str, Any]] | None = None, allow: Sequence[str] | None = None,
              deny: Mapping[str, Sequence[str]] | None = None, where: str = "patterns") -> Rules | None:
    """A run's own PII rules beside the model entry's: pattern recognizers (as `pii_patterns` entries), values
    never redacted (any case) and values always redacted by type; None without any. InputError naming the entry."""
    if not patterns and not allow and not deny:
        return None
    from ..pipelines.pii_rules import Pattern, Rules, spec_of

    compiled = [Pattern(spec_of(raw, f"{where}[{i}]"), f"{where}[{i}]") for i, raw in enumerate(patterns or ())]
    return Rules.of(compiled, list(allow or ()), deny=deny)


class Model:
    """A model loaded by `rsinfer_cli.load`, on one replica of its own. Its methods are those of the CLI's
    commands; a method of another family raises ConfigError naming the model's kind. Thread-safe: ONNX Runtime
    sessions are, and each call's work is its own. Use it as a context manager, or call `close()`."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._loaded = next(iter(runtime.registry.models.values()))
        self.pipeline: RowPipeline = runtime.pipelines[self._loaded.key]

    # ------------------------------------------------------------------ what it is

    @property
    def name(self) -> str:
        """Its name: the config entry's, or the folder's or repo's last part."""
        return self._loaded.name

    @property
    def kind(self) -> str:
        """Its family: embedding, sparse, late_interaction, rerank, classifier, zeroshot or pii."""
        return str(self._loaded.config.kind)

    @property
    def chunk_rows(self) -> int:
        """Texts run together in one call of the core: four forwards' worth (at least 64)."""
        return max(self.pipeline.max_rows * 4, 64)

    def __repr__(self) -> str:
        return f"<rsinfer Model '{self.name}' ({self.kind})>"

    def _as(self, pipeline: type[P], method: str) -> P:
        from .. import families

        pipe = self.pipeline
        if not families.answers(self.kind, pipeline.kind) or not isinstance(pipe, pipeline):
            raise ConfigError(f"model '{self.name}' is of kind {self.kind}; {method}() needs a model of kind "
                              f"{pipeline.kind}")
        return pipe

    def _run(self, plan: Any, *args: Any, **kwargs: Any) -> Any:
        from ..runtime.record import RequestRecord  # (the runtime floor: loaded with the model)

        return self._runtime.core.run(RequestRecord(), self._loaded, plan, *args, **kwargs)

    def _chunks(self, texts: Any, param: str = "texts") -> Iterator[list[str]]:
        items = check_texts(texts, param)
        size = self.chunk_rows
        for start in range(0, len(items), size):
            yield items[start:start + size]

    # ------------------------------------------------------------------ the families' methods

    def embed(self, texts: Sequence[str], *, dimensions: int | None = None, normalize: bool | None = None,
              truncate: bool | None = None, prompt_name: str | None = None, prompt: str | None = None,
              precision: str = "float32") -> np.ndarray:
        """Dense vectors, float32 [len(texts), dim], in input order (as sentence-transformers' `encode`).

        dimensions: keep the first N (Matryoshka), re-normalised when the model normalises.
        normalize: L2-normalise (default: as the model's modules say).
        truncate: cut texts over max_len (default: the model's `truncate`; else a text too long is an error).
        prompt_name / prompt: a prompt of the model, or a text of your own, put before each text.
        precision: float32, or int8, uint8, binary, ubinary as sentence-transformers' `encode(precision=...)` gives
        them, with the model's ranges ([-1, 1], or its quantization_calibration) rather than the batch's."""
        import numpy as np

        from ..pipelines.embedding import Embedder
        from ..pipelines.outtypes import TYPES, quantize

        pipe = self._as(Embedder, "embed")
        dtype = "float" if precision == "float32" else precision
        if dtype not in TYPES:
            raise InputError(f"`precision` must be float32, int8, uint8, binary or ubinary, got {precision!r}",
                             param="precision")
        pipe.check_dimensions(dimensions)
        parts = [self._run(pipe.plan, chunk, dimensions=dimensions, normalize=normalize, truncate=truncate,
                           prompt_name=prompt_name, prompt=prompt).vectors for chunk in self._chunks(texts)]
        width = dimensions or (pipe.dim if isinstance(pipe.dim, int) else 0)
        vectors = (np.concatenate(parts) if len(parts) > 1 else parts[0]) if parts else \
            np.zeros((0, width), dtype=np.float32)
        return quantize(vectors, dtype, pipe.ranges)

    def sparse(self, texts: Sequence[str], *, top_k: int | None = None, truncate: bool | None = None,
               prompt_name: str | None = None) -> list[SparseVector]:
        """Sparse (SPLADE) vectors: per text its non-zero weights, at most `top_k` of them (as
        sentence-transformers' SparseEncoder)."""
        from ..pipelines.sparse import SparseEncoder

        pipe = self._as(SparseEncoder, "sparse")
        out: list[SparseVector] = []
        for chunk in self._chunks(texts):
            res = self._run(pipe.plan_sparse, chunk, top_k=top_k, truncate=truncate, prompt_name=prompt_name)
            out += [SparseVector(ids, values) for ids, values in res.rows]
        return out

    def tokens(self, indices: Sequence[int] | np.ndarray) -> list[str]:
        """The vocabulary tokens of a sparse vector's indices."""
        import numpy as np

        from ..pipelines.sparse import SparseEncoder

        return self._as(SparseEncoder, "tokens").tokens_of(np.asarray(indices))

    def colbert(self, texts: Sequence[str], *, is_query: bool = False, truncate: bool | None = None,
                prompt_name: str | None = None) -> list[np.ndarray]:
        """Token vectors, float32 [tokens, dim] per text, as queries ([Q], [MASK] expansion) or documents (as
        PyLate's `encode`)."""
        from ..pipelines.late_interaction import TokenVectorizer

        pipe = self._as(TokenVectorizer, "colbert")
        out: list[np.ndarray] = []
        for chunk in self._chunks(texts):
            out += self._run(pipe.plan_vectors, chunk, is_query=is_query, truncate=truncate,
                             prompt_name=prompt_name).vectors
        return out

    def rerank(self, query: str, documents: Sequence[str], *, top_n: int | None = None, raw: bool = False,
               truncate: bool | None = None) -> list[Ranked]:
        """The documents by relevance to `query`, best first (ties in input order), at most `top_n`; `raw`: the
        model's score before its activation."""
        from ..pipelines.rerank import Reranker, ranked

        pipe = self._as(Reranker, "rerank")
        if not isinstance(query, str):
            raise InputError(f"`query` must be a string, got {type(query).__name__}", param="query")
        if top_n is not None and top_n < 0:
            raise InputError(f"`top_n` must be >= 0, got {top_n}", param="top_n")
        docs = check_texts(documents, "documents")
        scores = self._run(pipe.plan_rerank, query, docs, raw=raw, truncate=truncate).scores
        return [Ranked(i, float(scores[i])) for i in ranked(scores, top_n)]

    def score(self, queries: Sequence[str], documents: Sequence[str], *, raw: bool = False,
              truncate: bool | None = None) -> np.ndarray:
        """queries[i] against documents[i]: float64 scores in input order (a table of pairs, as in bulk jobs)."""
        import numpy as np

        from ..pipelines.rerank import Reranker

        pipe = self._as(Reranker, "score")
        qs, docs = check_texts(queries, "queries"), check_texts(documents, "documents")
        if len(qs) != len(docs):
            raise InputError(f"{len(qs)} queries and {len(docs)} documents: give one query per document",
                             param="queries")
        size = self.chunk_rows
        parts = [self._run(pipe.plan_pairs, qs[i:i + size], docs[i:i + size], raw=raw, truncate=truncate).scores
                 for i in range(0, len(qs), size)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float64)

    def embed_images(self, images: Sequence[bytes | str | os.PathLike[str]], *,
                     normalize: bool | None = None) -> np.ndarray:
        """An image_text model's (CLIP, SigLIP) image vectors, float32 [n, dim], in input order: each image as its
        bytes or a file path, preprocessed as the model's transformers processor does. Unit length unless
        `normalize=False` (then `get_image_features` as it is)."""
        import numpy as np

        from ..pipelines.image_text import ImageTextPipeline

        pipe = self._as(ImageTextPipeline, "embed_images")
        data = [_image_data(x, i) for i, x in enumerate(images)]
        parts = [self._run(pipe.plan_images, data[i:i + pipe.max_images], normalize=normalize, param="images").vectors
                 for i in range(0, len(data), pipe.max_images)]
        return np.concatenate(parts) if parts else np.zeros((0, pipe.dim or 0), dtype=np.float32)

    def classify_image(self, images: Sequence[bytes | str | os.PathLike[str]], labels: Sequence[str], *,
                       template: str | None = None) -> list[list[Label]]:
        """Zero-shot image classification as transformers' pipeline scores it (CLIP: softmax over the labels,
        SigLIP: a sigmoid each): per image its labels, best first."""
        from ..pipelines.image_text import ImageTextPipeline

        pipe = self._as(ImageTextPipeline, "classify_image")
        data = [_image_data(x, i) for i, x in enumerate(images)]
        out: list[list[Label]] = []
        for i in range(0, len(data), pipe.max_images):
            res = self._run(pipe.plan_zero_shot, data[i:i + pipe.max_images], list(labels), template=template)
            out += [[Label(label, score) for label, score in ranked] for ranked in res.labels]
        return out

    def m3(self, texts: Sequence[str], *, dense: bool = True, sparse: bool = False, colbert: bool = False,
           truncate: bool | None = None) -> dict[str, Any]:
        """An M3 model's outputs from one forward per text, as FlagEmbedding's `BGEM3FlagModel.encode` returns them:
        `dense_vecs` (float32 [n, d]), `lexical_weights` ({str(token id): weight} per text) and `colbert_vecs`
        (float32 [tokens - 1, dim] per text), each when asked for."""
        import numpy as np

        from ..pipelines.m3 import M3Pipeline

        pipe = self._as(M3Pipeline, "m3")
        if not (dense or sparse or colbert):
            raise InputError("ask for at least one of dense, sparse, colbert", param="dense")
        out: dict[str, Any] = {}
        for chunk in self._chunks(texts):
            res = self._run(pipe.plan_m3, chunk, dense=dense, sparse=sparse, colbert=colbert, truncate=truncate)
            if res.dense is not None:
                out.setdefault("dense_vecs", []).append(res.dense)
            if res.lexical is not None:
                out.setdefault("lexical_weights", []).extend(
                    dict(zip(map(str, ids.tolist()), weights.tolist(), strict=True)) for ids, weights in res.lexical)
            if res.colbert is not None:
                out.setdefault("colbert_vecs", []).extend(res.colbert)
        if dense:
            parts = out.get("dense_vecs", [])
            out["dense_vecs"] = np.concatenate(parts) if parts else np.zeros((0, pipe.hidden), np.float32)
        for key, asked in (("lexical_weights", sparse), ("colbert_vecs", colbert)):
            if asked:
                out.setdefault(key, [])
        return out

    def m3_score(self, queries: Sequence[str], passages: Sequence[str], *,
                 weights: Sequence[float] | None = None, truncate: bool | None = None) -> dict[str, list[float]]:
        """FlagEmbedding's `compute_score` of queries[i] against passages[i]: `dense`, `sparse`, `colbert`,
        `sparse+dense` and `colbert+sparse+dense`, each a list in pair order (`weights`: [dense, sparse, colbert],
        default the model's m3_weights)."""
        from ..pipelines.m3 import M3Pipeline

        pipe = self._as(M3Pipeline, "m3_score")
        qs, ps = check_texts(queries, "queries"), check_texts(passages, "passages")
        if len(qs) != len(ps):
            raise InputError(f"{len(qs)} queries and {len(ps)} passages: give one query per passage",
                             param="queries")
        out: dict[str, list[float]] = {}
        size = self.chunk_rows
        for i in range(0, len(qs), size):
            got = self._run(pipe.plan_scores, qs[i:i + size], ps[i:i + size], weights=weights,
                            truncate=truncate).scores
            for mode, values in got.items():
                out.setdefault(mode, []).extend(values)
        return out

    def predict(self, texts: Sequence[str], *, top_k: int | None = None, raw: bool = False,
                function: str | None = None, truncate: bool | None = None) -> list[list[Label]]:
        """Per text its labels, best first (every label, or the `top_k` best), as the transformers
        text-classification pipeline scores them; `function`: sigmoid, softmax or none over the model's own."""
        from ..pipelines.classifier import ClassifierPipeline, check_function

        pipe = self._as(ClassifierPipeline, "predict")
        if top_k is not None and top_k < 1:
            raise InputError(f"`top_k` must be >= 1, got {top_k}", param="top_k")
        chosen = check_function(function, "function")
        out: list[list[Label]] = []
        for chunk in self._chunks(texts):
            res = self._run(pipe.plan_classify, chunk, raw=raw, function=chosen, top_k=top_k, truncate=truncate)
            out += [[Label(label, score) for label, score in r] for r in res.results]
        return out

    def classify(self, texts: Sequence[str], labels: Sequence[str] | None = None, *, multi_label: bool = False,
                 template: str | None = None, question: str | None = None, assertion: str | None = None,
                 threshold: float = 0.5) -> list[ZeroShot] | list[TrueFalse]:
        """Zero-shot with an NLI model: with `labels`, each text's labels by score (the transformers
        zero-shot-classification pipeline); with `question` or `assertion`, whether each text entails it."""
        from ..pipelines.zeroshot import ZeroShotPipeline, assertion_for

        pipe = self._as(ZeroShotPipeline, "classify")
        if (labels is not None) == (question is not None or assertion is not None):
            raise InputError("give either labels (zero-shot) or question / assertion (true/false)", param="labels")
        if not 0.0 <= threshold <= 1.0:
            raise InputError(f"`threshold` must be between 0 and 1, got {threshold}", param="threshold")
        per_chunk = max(256 // max(len(labels or ()), 1), 8)
        items = check_texts(texts)
        out: list[Any] = []
        judged = None if labels is not None else assertion_for(question, assertion)
        chosen = None if labels is None else check_texts(labels, "labels")
        for start in range(0, len(items), per_chunk):
            chunk = items[start:start + per_chunk]
            if chosen is not None:
                out += self._run(pipe.plan_classify, chunk, chosen, multi_label, template).results
            else:
                out += self._run(pipe.plan_true_false, chunk, judged, threshold).results
        return out

    def detect(self, texts: Sequence[str], *, threshold: float | None = None, types: Sequence[str] | None = None,
               patterns: Sequence[Mapping[str, Any]] | None = None, allow: Sequence[str] | None = None,
               deny: Mapping[str, Sequence[str]] | None = None, rules: Rules | None = None,
               labels: Sequence[str] | Mapping[str, str] | None = None) -> list[list[Entity]]:
        """PII found in each text: type, value, score and code-point offsets (Presidio's analyzer results).
        patterns / allow / deny: this run's own recognizers and lists, beside the model entry's (or `rules`, made
        once by `pii_rules` for many calls). labels: what an open-label (GLiNER) model is asked for instead of its
        pii_labels (label texts, or label text → entity type)."""
        from ..pipelines.pii import PiiPipeline

        pipe = self._as(PiiPipeline, "detect")
        rules = rules if rules is not None else pii_rules(patterns, allow, deny)
        out: list[list[Entity]] = []
        for chunk in self._chunks(texts):
            out += self._run(pipe.plan_detect, chunk, threshold, _types(types), rules, None, labels).entities
        return out

    def redact(self, texts: Sequence[str], *, mode: str = "mask", mask_char: str = "*",
               replacement: str | None = None, threshold: float | None = None, types: Sequence[str] | None = None,
               salt: bytes | str | None = None, patterns: Sequence[Mapping[str, Any]] | None = None,
               allow: Sequence[str] | None = None, deny: Mapping[str, Sequence[str]] | None = None,
               rules: Rules | None = None, key: bytes | None = None,
               labels: Sequence[str] | Mapping[str, str] | None = None) -> list[RedactedText]:
        """Each text with its PII replaced: mode mask (`mask_char` per character), remove, replace (`replacement`,
        default '<{type}>'), hash (salted sha256; `salt`, default the model's), pseudonym (keyed HMAC, the same
        token for the same value everywhere; `key`, default the model entry's pii_pseudonym_key_file or
        $RSINFER_PSEUDONYM_KEY) or numbered (`<PERSON_1>`, in order of first appearance in each text). A redaction
        that cannot cover its text raises; it never returns a text with a found value left in it. labels: as
        detect's."""
        from ..pipelines.pii import PiiPipeline

        pipe = self._as(PiiPipeline, "redact")
        rules = rules if rules is not None else pii_rules(patterns, allow, deny)
        salt_bytes = _salt(salt)
        out: list[RedactedText] = []
        for chunk in self._chunks(texts):
            res = self._run(pipe.plan_redact, chunk, mode=mode, mask_char=mask_char, replacement=replacement,
                            threshold=threshold, types=_types(types), salt=salt_bytes, rules=rules, key=key,
                            labels=labels)
            out += [RedactedText(t, spans) for t, spans in zip(res.texts, res.spans, strict=True)]
        return out

    def redact_records(self, records: Sequence[Any], policy: Policy | Mapping[str, Any] | str | Path, *,
                       mode: str = "mask", mask_char: str = "*", replacement: str | None = None,
                       salt: bytes | str | None = None, key: bytes | None = None,
                       rules: Rules | None = None) -> list[RedactedRecord]:
        """Each JSON record (a dict) redacted by a record policy (pipelines/records.py: a Policy, its mapping or a
        YAML file): fields kept, scanned, redacted whole or dropped as declared, every other byte as it was. The
        records given are not changed; numbered mode counts afresh in each record."""
        import copy

        return self._redact_own(copy.deepcopy(list(records)), policy, (mode, mask_char, replacement, _salt(salt), key),
                                rules)

    def _redact_own(self, records: list[Any], policy: Policy | Mapping[str, Any] | str | Path, how: tuple[Any, ...],
                    rules: Rules | None) -> list[RedactedRecord]:
        """Records this call owns (changed in place) redacted; `how`: the replacer's mode, mask_char, replacement,
        salt and key."""
        from ..pipelines.pii import PiiPipeline

        pipe = self._as(PiiPipeline, "redact_records")
        replacer = pipe.replacer(*how)
        planned = self._planned(pipe, records, policy, rules)
        found = self.found_in(planned, rules)
        return [RedactedRecord(r, spans) for r, spans in planned.redact(found, replacer)]

    def redact_json(self, texts: Sequence[str], policy: Policy | Mapping[str, Any] | str | Path, *,
                    mode: str = "mask", mask_char: str = "*", replacement: str | None = None,
                    salt: bytes | str | None = None, key: bytes | None = None, rules: Rules | None = None) -> list[str]:
        """Each text a JSON record, redacted by `policy` as `redact_records` does, back as compact JSON (numbers as
        written): the column function of Ray and Spark over a column of JSON records. A text that is not a JSON
        object is an InputError naming it (`input[3]`)."""
        from ..jsonio import dumps_line, loads_record

        records = [loads_record(text, f"input[{i}]") for i, text in enumerate(check_texts(texts))]
        done = self._redact_own(records, policy, (mode, mask_char, replacement, _salt(salt), key), rules)
        return [dumps_line(r.record)[:-1] for r in done]

    def detect_records(self, records: Sequence[Any], policy: Policy | Mapping[str, Any] | str | Path, *,
                       rules: Rules | None = None) -> list[dict[str, list[Entity]]]:
        """What a record policy finds in each record: path → entities (a value declared whole: itself, whole)."""
        from ..pipelines.pii import PiiPipeline

        planned = self._planned(self._as(PiiPipeline, "detect_records"), records, policy, rules)
        return [spans for _, spans in planned.detect(self.found_in(planned, rules))]

    def _planned(self, pipe: PiiPipeline, records: Sequence[Any], policy: Policy | Mapping[str, Any] | str | Path,
                 rules: Rules | None) -> Planned:
        from ..pipelines.records import Policy

        if not isinstance(policy, Policy):
            policy = Policy.load(policy) if isinstance(policy, (str, Path)) else Policy.of(policy)
        policy.check_types([*pipe.types, *(rules.types if rules is not None else ())])
        for i, record in enumerate(records):
            if not isinstance(record, dict):
                raise InputError(f"`records[{i}]` is {type(record).__name__}, not an object", param="records")
        return policy.plan(records, lambda i: f"records[{i}]")

    def found_in(self, planned: Planned, rules: Rules | None) -> dict[tuple[Any, ...], list[list[Entity]]]:
        """The entities of each group of texts a plan asks to scan."""
        return {group: self.detect(texts, threshold=group[1], types=group[0], rules=rules)
                for group, texts in planned.texts.items()}

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Its threads joined and its cache closed; the model is not usable after."""
        import asyncio
        import threading

        done = threading.Thread(target=asyncio.run, args=(self._runtime.close(),), name="rsinfer-close")
        done.start()
        done.join()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _salt(salt: bytes | str | None) -> bytes | None:
    return salt.encode("utf-8") if isinstance(salt, str) else salt


def _types(types: Sequence[str] | str | None) -> tuple[str, ...] | None:
    if types is None:
        return None
    if isinstance(types, str):
        types = types.split(",")
    return tuple(t.strip() for t in types if t.strip()) or None


def _image_data(item: bytes | str | os.PathLike[str], i: int) -> bytes:
    """An image as bytes: given as bytes, or read from a path (InputError naming the item)."""
    if isinstance(item, (bytes, bytearray)):
        return bytes(item)
    from pathlib import Path

    try:
        return Path(item).read_bytes()
    except OSError as exc:
        raise InputError(f"images[{i}]: cannot read {item}: {exc.strerror}", param=f"images[{i}]") from None
