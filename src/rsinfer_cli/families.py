"""The model families rsinfer serves: one typed declaration each, one registry.

A family is what a `kind:` in the config names. Its code lives in files named after the kind in each layer
(`pipelines/<kind>.py`, `server/routes/<kind>.py`, `cli/<kind>.py`); this registry says where, so `serve`,
`download`, `inspect`, `bench` and the pipelines factory never list kinds themselves. Declarations refer to
those modules by "module:attribute" strings, imported on first use: `rsinfer --help` imports no numpy,
onnxruntime or aiohttp, and the engine never imports a front end. A test (or a plug-in) may pass the objects
themselves instead of strings.

Adding a family = its files plus one `register(Family(...))` line below.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar, cast

if TYPE_CHECKING:    # aiohttp's type only (importing it would import aiohttp); nothing of rsinfer's upper floors
    from aiohttp.web import RouteTableDef

T = TypeVar("T")
# A part of a family: "module:attribute", imported on first use (`rsinfer --help` imports no numpy, onnxruntime or
# aiohttp), or the object itself. mypy checks an object against its part's type; a test resolves every built-in
# family's strings and checks what they name.
Part: TypeAlias = str | T


@dataclass(frozen=True)
class Folder:
    """What a model folder says about its family, for `guess_kind`: config.json, whether it has tokenizer.json, and
    what a sentence-transformers folder adds (config_sentence_transformers.json's `model_type`: SentenceTransformer,
    SparseEncoder, ColBERT; the classes modules.json names)."""

    config: Mapping[str, Any]
    has_tokenizer: bool = True
    st_model_type: str | None = None
    modules: tuple[str, ...] = ()
    files: frozenset[str] = frozenset()    # the aux files the folder has (families' aux_files that it holds)

    @property
    def architectures(self) -> str:
        return " ".join(str(a) for a in (self.config.get("architectures") or []))

    @classmethod
    def read(cls, aux: Mapping[str, Path], has_tokenizer: bool) -> Folder:
        """From a resolved model's aux files (name → local path); an unreadable file counts as absent."""
        import json

        def read(name: str) -> Any:
            path = aux.get(name)
            try:
                return json.loads(path.read_text(encoding="utf-8")) if path is not None else None
            except (OSError, ValueError):
                return None

        config, st, modules = read("config.json"), read("config_sentence_transformers.json"), read("modules.json")
        st_type = st.get("model_type") if isinstance(st, dict) else None
        types = tuple(str(m.get("type", "")) for m in modules if isinstance(m, dict)) \
            if isinstance(modules, list) else ()
        return cls(config if isinstance(config, dict) else {}, has_tokenizer,
                   st_type if isinstance(st_type, str) else None, types, frozenset(aux))


class PipelinePart(Protocol):
    """What the registry knows of a family's pipeline (pipelines/base.RowPipeline is one; the pipelines' floor checks
    that a factory made one)."""

    kind: str

    def describe(self) -> dict[str, Any]: ...


class OpPart(Protocol):
    """A family's route-table entry as the registry carries it (server/schemas.Op is one; the server checks it)."""

    @property
    def paths(self) -> tuple[str, ...]: ...
    @property
    def errors(self) -> str: ...


# a folder's facts → why it is of the family (None: it is not); see `guess_kind`
Recognise = Callable[[Folder], "str | None"]
# the pipeline's class (or any factory): built once per loaded model (the engine's LoadedModel)
PipelineFactory = Callable[[Any], PipelinePart]
# feeds for the trial forward at load where the graph's signature alone cannot make valid ones (a GLiNER graph's
# spans): (GraphInfo, the folder's aux files) → feeds, or None for the signature's (engine/session.sample_feeds)
TrialFeeds = Callable[[Any, Mapping[str, Any]], "dict[str, Any] | None"]
# a Typer command function
Command = Callable[..., None]
# the quality gate: (pipeline over graph a, pipeline over graph b, corpus) → metrics (pipelines/quality.py)
Quality = Callable[[Any, Any, Sequence[str]], Mapping[str, float]]
# `rsinfer bench --url`: route → function(texts) → request body
BenchBodies = Mapping[str, Callable[[list[str]], Mapping[str, object]]]
# its Hugging Face task on POST /models/{name}: (the route's Call, inputs, parameters) → the aiohttp response
HfTask = Callable[[Any, Any, dict[str, Any]], Awaitable[Any]]


@dataclass(frozen=True)
class InputKind:
    """What a family's requests carry, item by item, and how an item is measured against its limits: the routes
    enforce it in one place (server/routes/common.check_inputs) for the model's family, whichever kind's route it
    came by. Text (the default): characters, at most the model's `max_text_chars` (else the server's). Another kind
    decodes each JSON item into its row (`decode(item, where)`, an InputError naming `where` when it cannot) and
    measures it (`size(row)`, in `unit`, at most `max_size`). Every kind: at most `server.max_texts` items."""

    name: str = "text"
    unit: str = "characters"
    decode: Part[Callable[[Any, str], Any]] | None = None    # None: the item as JSON gave it (a string)
    size: Part[Callable[[Any], int]] | None = None            # None: len()
    max_size: int | None = None                               # None: max_text_chars

    def decoder(self) -> Callable[[Any, str], Any]:
        return (lambda item, where: item) if self.decode is None else load(self.decode)

    def sizer(self) -> Callable[[Any], int]:
        return len if self.size is None else load(self.size)


TEXT = InputKind()
# the files a model's folder may hold that rsinfer reads besides its graph (`hub` fetches them, `download` keeps
# them): config.json for every model; a text family's (needs_tokenizer) the tokenizer's and a sentence-transformers
# folder's; and what a family declares of its own (Family.aux_files: a processor's config, ...)
BASE_AUX = ("config.json",)
TEXT_AUX = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "sentence_bert_config.json",
            "1_Pooling/config.json", "modules.json", "config_sentence_transformers.json")


@dataclass(frozen=True)
class Family:
    kind: str
    summary: str
    pipeline: Part[PipelineFactory] | None = None   # Pipeline(model, server), built once per model
    routes: Part[RouteTableDef] | None = None       # its aiohttp routes; None = `serve` refuses the kind
    commands: tuple[tuple[str, Part[Command]], ...] = ()   # (CLI name, the Typer function)
    bench: Part[BenchBodies] | None = None
    needs_tokenizer: bool = True      # the folder must provide tokenizer.json
    options: Part[type[object]] | None = None   # a dataclass of the family's own model keys (flat in the model
                                                # entry, validated with key paths, read as `model.config.options`)
    ops: Part[Sequence[OpPart]] | None = None       # its routes' Ops (request/response Structs) for /openapi.json
    config_fields: tuple[str, ...] = ()  # engine keys of ModelConfig only this family may set (others are refused)
    recognise: Part[Recognise] | None = None   # how `download`/`inspect`/`bench` tell the folder's family
    priority: int = 50                # recognisers run in this order, lowest first
    hf_task: Part[HfTask] | None = None   # None: the HF routes refuse the kind
    info_type: str | None = None      # TEI /info's model_type key (embedding, reranker, classifier)
    serves: tuple[str, ...] = ()      # other kinds whose routes its models answer too (their pipeline implements
                                      # that kind's protocol, e.g. late_interaction's MaxSim serves rerank)
    quality: Part[Quality] | None = None   # the quality gate's measure of a second graph against a first
                                           # (pipelines/quality.py); None: `quantize` and `bench --compare` refuse
    inputs: InputKind = TEXT          # what its requests carry per item, and their limits
    trial_feeds: Part[TrialFeeds] | None = None   # the load's trial forward, where the signature's zeros cannot run
    aux_files: tuple[str, ...] = ()   # files of its models' folders it reads besides the graph, config.json and (with
                                      # needs_tokenizer) the tokenizer's: `hub` fetches them, `download` keeps them
    graphs: tuple[str, ...] = ()      # a model of several graphs (CLIP's vision and text towers): the first is the
                                      # main graph the queue runs (preferred over model.onnx), the others towers the
                                      # engine loads beside it with the same lanes (LoadedModel.tower)
    constant_graphs: tuple[str, ...] = ()   # graphs of its repos it reads small constants of, first found wins
                                      # (CLIP's combined graph: zero-shot's logit_scale): from a Hub repo read by
                                      # byte ranges, never downloaded, kept as aux `<name>.constants.json`

    # ------------------------------------------------------------ the parts, imported now and typed

    def pipeline_factory(self) -> PipelineFactory:
        if self.pipeline is None:
            raise LookupError(f"model family '{self.kind}' declares no pipeline")
        return load(self.pipeline)

    def route_table(self) -> RouteTableDef | None:
        return None if self.routes is None else load(self.routes)

    def command_functions(self) -> list[tuple[str, Command]]:
        return [(name, load(ref)) for name, ref in self.commands]

    def bench_bodies(self) -> BenchBodies:
        return {} if self.bench is None else load(self.bench)

    def options_type(self) -> type[object] | None:
        return None if self.options is None else load(self.options)

    def route_ops(self) -> Sequence[OpPart]:
        return () if self.ops is None else load(self.ops)

    def recogniser(self) -> Recognise | None:
        return None if self.recognise is None else load(self.recognise)

    def hf_handler(self) -> HfTask | None:
        return None if self.hf_task is None else load(self.hf_task)

    def trial(self, graph: Any, aux: Mapping[str, Any]) -> dict[str, Any] | None:
        return None if self.trial_feeds is None else load(self.trial_feeds)(graph, aux)

    def quality_check(self) -> Quality | None:
        return None if self.quality is None else load(self.quality)


def load(part: Part[T]) -> T:
    """A part declared as "module:attribute", imported now; a part given as the object, as it is."""
    if isinstance(part, str):
        return cast(T, resolve_ref(part))
    return part


def resolve_ref(ref: str) -> Any:
    """The object "module:attribute" names (a plug-in's entry point too)."""
    module, sep, attr = ref.partition(":")
    if not sep:
        raise ValueError(f"{ref!r} is not 'module:attribute'")
    return getattr(importlib.import_module(module), attr)


_FAMILIES: dict[str, Family] = {}

# the keys every text family reads; a model without a tokenizer refuses them
TEXT_FIELDS = ("tokenizer_hf", "max_len", "truncate", "max_text_chars")


def register(family: Family) -> Family:
    """Add (or replace) a family; later `kinds()`, config validation and the fronts see it."""
    _FAMILIES[family.kind] = family
    return family


def unregister(kind: str) -> None:
    _FAMILIES.pop(kind, None)


def kinds() -> tuple[str, ...]:
    return tuple(_FAMILIES)


def get(kind: str) -> Family:
    try:
        return _FAMILIES[kind]
    except KeyError:
        raise KeyError(f"no model family '{kind}' (known: {', '.join(_FAMILIES)})") from None


def all_families() -> tuple[Family, ...]:
    return tuple(_FAMILIES.values())


def served_kinds() -> tuple[str, ...]:
    """Kinds `rsinfer serve` answers: those with routes of their own, and those that serve another kind's."""
    return tuple(f.kind for f in _FAMILIES.values() if f.routes is not None or f.serves)


def aux_files(kind: str | None = None) -> tuple[str, ...]:
    """The files besides the graph that a model of `kind` reads (None: a folder of any family, as `download` and
    `inspect` fetch before they know it)."""
    fams = [_FAMILIES[kind]] if kind in _FAMILIES else list(_FAMILIES.values()) if kind is None else []
    names = [*BASE_AUX]
    for f in fams:
        names += [*(TEXT_AUX if f.needs_tokenizer else ()), *f.aux_files, *f.graphs[1:]]
    return tuple(dict.fromkeys(names))


def specific_fields() -> dict[str, tuple[str, ...]]:
    """Model key → the families that read it: engine keys of ModelConfig and each family's own options (a key such
    as `prompts` may be several families' own)."""
    owners: dict[str, list[str]] = {}
    for f in _FAMILIES.values():
        for key in (*f.config_fields, *option_fields(f.kind)):
            if f.kind not in owners.setdefault(key, []):
                owners[key].append(f.kind)
    return {key: tuple(kinds) for key, kinds in owners.items()}


def answers(model_kind: str, route_kind: str) -> bool:
    """Whether a model of `model_kind` answers the routes of `route_kind`: its own, or a kind its family serves."""
    fam = _FAMILIES.get(model_kind)
    return model_kind == route_kind or (fam is not None and route_kind in fam.serves)


def options_class(kind: str) -> type[Any] | None:
    """The dataclass of a kind's own model keys (None: the family has none); unknown kinds have none."""
    fam = _FAMILIES.get(kind)
    return None if fam is None else fam.options_type()


def option_fields(kind: str) -> tuple[str, ...]:
    import dataclasses

    cls = options_class(kind)
    return tuple(f.name for f in dataclasses.fields(cls)) if cls is not None else ()


def all_ops() -> tuple[OpPart, ...]:
    """Every family's route-table entries (`server/schemas.Op`), in registry order."""
    return tuple(op for f in _FAMILIES.values() for op in f.route_ops())


def guess_kind(folder: Folder) -> tuple[str, str]:
    """(kind, why) of a model folder from what its files say."""
    for fam in sorted(_FAMILIES.values(), key=lambda f: f.priority):
        recognise = fam.recogniser()
        why = recognise(folder) if recognise is not None else None
        if why is not None:
            return fam.kind, why
    return "embedding", "no family recognised the folder"


# ---------------------------------------------------------------- the built-in families


def _labels(hf_config: Mapping[str, Any]) -> str:
    id2label = hf_config.get("id2label") or {}
    return " ".join(str(v).lower() for v in id2label.values()) if isinstance(id2label, dict) else ""


def _is_tensor(folder: Folder) -> str | None:
    return None if folder.has_tokenizer else "no tokenizer.json: a graph served as raw tensors"


def _is_pii(folder: Folder) -> str | None:
    arch = folder.architectures
    if folder.config.get("model_type") == "gliner":      # a GLiNER span model: open-label PII (pii_gliner.py)
        return "config.json model_type: gliner"
    return f"config.json architectures: {arch}" if "ForTokenClassification" in arch else None


def _is_zeroshot(folder: Folder) -> str | None:
    arch = folder.architectures
    if "ForSequenceClassification" in arch and "entail" in _labels(folder.config):
        return f"config.json architectures: {arch}; id2label has entailment"
    return None


def _is_rerank(folder: Folder) -> str | None:
    arch = folder.architectures
    return f"config.json architectures: {arch}" if "ForSequenceClassification" in arch else None


def _is_embedding(folder: Folder) -> str:
    return f"config.json architectures: {folder.architectures or 'none'}"


def _builtin(kind: str, summary: str, pipeline: str, commands: Sequence[str], options: str,
             recognise: Recognise | str, priority: int, info_type: str, serves: tuple[str, ...] = (),
             quality: bool = True) -> Family:
    return Family(
        kind=kind, summary=summary, hf_task=f"rsinfer_cli.server.routes.{kind}:hf_task", info_type=info_type,
        pipeline=f"rsinfer_cli.pipelines.{kind}:{pipeline}",
        routes=f"rsinfer_cli.server.routes.{kind}:routes",
        commands=tuple((name, f"rsinfer_cli.cli.{kind}:{name}_cmd") for name in commands),
        bench=f"rsinfer_cli.server.routes.{kind}:BENCH", ops=f"rsinfer_cli.server.routes.{kind}:OPS",
        options=f"rsinfer_cli.pipelines.{kind}:{options}", recognise=recognise, priority=priority, serves=serves,
        quality=f"rsinfer_cli.pipelines.{kind}:quality" if quality else None)


register(_builtin("embedding", "text embeddings (OpenAI, TEI)", "EmbeddingPipeline", ["embed"],
                  "EmbeddingOptions", _is_embedding, 90, "embedding"))
register(_builtin("rerank", "cross-encoder reranking and scoring (Cohere, Jina, TEI, vLLM)", "RerankPipeline",
                  ["rerank"],
                  "RerankOptions", _is_rerank, 30, "reranker"))
register(_builtin("zeroshot", "zero-shot and true/false classification over NLI", "ZeroShotPipeline",
                  ["classify"],
                  "ZeroShotOptions", _is_zeroshot, 20, "classifier"))
register(_builtin("classifier", "text classification: sentiment, intent, toxicity (TEI, infinity)",
                  "ClassifierPipeline", ["predict"], "ClassifierOptions",
                  "rsinfer_cli.pipelines.classifier:recognise", 25, "classifier"))
register(replace(
    _builtin("pii", "PII detection and redaction (token classifiers, and GLiNER for any label)", "PiiPipeline",
             ["redact", "detect"], "PiiOptions", _is_pii, 10, "classifier"),
    pipeline="rsinfer_cli.pipelines.pii_gliner:pipeline_for", aux_files=("gliner_config.json",),
    trial_feeds="rsinfer_cli.pipelines.pii_gliner:trial_feeds"))
register(_builtin("sparse", "learned sparse vectors, SPLADE (TEI /embed_sparse)", "SparsePipeline", ["sparse"],
                  "SparseOptions", "rsinfer_cli.pipelines.sparse:recognise", 15, "embedding", quality=False))
register(_builtin("late_interaction", "multi-vector late interaction, ColBERT: token vectors, MaxSim reranking",
                  "LateInteractionPipeline", ["colbert"], "LateInteractionOptions",
                  "rsinfer_cli.pipelines.late_interaction:recognise", 15, "embedding", serves=("rerank",),
                  quality=False))
register(Family(kind="m3", summary="BGE-M3: dense, sparse and ColBERT vectors from one forward, and their hybrid score",
                pipeline="rsinfer_cli.pipelines.m3:M3Pipeline", routes="rsinfer_cli.server.routes.m3:routes",
                commands=(("m3", "rsinfer_cli.cli.m3:m3_cmd"),),
                bench="rsinfer_cli.server.routes.m3:BENCH", ops="rsinfer_cli.server.routes.m3:OPS",
                options="rsinfer_cli.pipelines.m3:M3Options", recognise="rsinfer_cli.pipelines.m3:recognise",
                priority=12, hf_task="rsinfer_cli.server.routes.m3:hf_task", info_type="embedding",
                serves=("embedding", "sparse", "late_interaction", "rerank"),
                aux_files=("colbert_linear.safetensors", "sparse_linear.safetensors", "colbert_linear.pt",
                           "sparse_linear.pt")))
register(Family(kind="image_text", summary="CLIP and SigLIP: image and text vectors in one space, zero-shot image "
                "classification", pipeline="rsinfer_cli.pipelines.image_text:ImageTextPipeline",
                routes="rsinfer_cli.server.routes.image_text:routes",
                commands=(("embed-images", "rsinfer_cli.cli.image_text:embed_images_cmd"),
                          ("classify-image", "rsinfer_cli.cli.image_text:classify_image_cmd")),
                bench="rsinfer_cli.server.routes.image_text:BENCH", ops="rsinfer_cli.server.routes.image_text:OPS",
                options="rsinfer_cli.pipelines.image_text:ImageTextOptions",
                recognise="rsinfer_cli.pipelines.image_text:recognise", priority=11,
                hf_task="rsinfer_cli.server.routes.image_text:hf_task", info_type="embedding", serves=("embedding",),
                graphs=("vision_model.onnx", "text_model.onnx"), aux_files=("preprocessor_config.json",),
                constant_graphs=("model.onnx", "model_quantized.onnx", "model_int8.onnx", "model_uint8.onnx",
                                 "model_q4.onnx", "model_bnb4.onnx", "model_q4f16.onnx", "model_fp16.onnx"),
                trial_feeds="rsinfer_cli.pipelines.image_text:trial_feeds"))
register(Family(kind="tensor", summary="any ONNX graph as named tensors (KServe v2 REST and gRPC, /infer, /batch)",
                pipeline="rsinfer_cli.pipelines.tensor:TensorPipeline",
                routes="rsinfer_cli.server.routes.tensor:routes", bench="rsinfer_cli.server.routes.tensor:BENCH",
                ops="rsinfer_cli.server.routes.tensor:OPS", options="rsinfer_cli.pipelines.tensor:TensorOptions",
                needs_tokenizer=False, config_fields=("max_batch_size", "backend"), recognise=_is_tensor,
                priority=0, quality="rsinfer_cli.pipelines.tensor:quality"))


# ---------------------------------------------------------------- families from other packages
#
# A separately installed package adds a kind through the entry-point group `rsinfer.families`: the entry point names
# a Family, a list of them, or a function returning either, e.g. in its pyproject.toml
#     [project.entry-points."rsinfer.families"]
#     logits = "rsinfer_logits:FAMILY"
# Finding entry points imports importlib.metadata and reads every installed distribution (30-60 ms here: a fifth of
# what `rsinfer --help` may take), so what each folder of sys.path holds is kept in the user's cache with the
# folder's modification time - installing or removing a distribution changes it - and read back in well under a
# millisecond. A plug-in that fails to load is remembered by name: config errors about its kind say why.

GROUP = "rsinfer.families"
FAILED: dict[str, str] = {}           # entry point name → why it did not load


def _cache_file() -> str:
    import os
    import sys
    import zlib

    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    tag = f"{zlib.crc32(sys.executable.encode()):08x}"   # one file per interpreter (hashlib: +3 ms per start)
    return os.path.join(base, "rsinfer", f"plugins-{tag}.json")


def _entry_points() -> list[tuple[str, str]]:
    """(name, "module:attr") of every installed `rsinfer.families` entry point, in sys.path order. Each folder on
    sys.path is read once and remembered with its modification time (installing or removing a distribution changes
    it); only a folder that changed is read again, so `python -c` and the `rsinfer` script, whose first sys.path
    entries differ, share the cache."""
    import json
    import os
    import sys

    path = _cache_file()
    try:
        with open(path, encoding="utf-8") as f:
            cached: dict[str, Any] = json.load(f)
        if not isinstance(cached, dict):
            cached = {}
    except (OSError, ValueError):
        cached = {}
    changed = False
    found: dict[str, str] = {}
    for entry in sys.path:
        try:
            mtime = os.stat(entry or ".").st_mtime_ns
        except OSError:
            continue
        known = cached.get(entry)
        if not (isinstance(known, dict) and known.get("mtime") == mtime and isinstance(known.get("eps"), list)):
            from importlib.metadata import distributions

            eps = sorted({(ep.name, ep.value) for dist in distributions(path=[entry or "."])
                          for ep in dist.entry_points if ep.group == GROUP})
            known = cached[entry] = {"mtime": mtime, "eps": [list(ep) for ep in eps]}
            changed = True
        for name, value in known["eps"]:
            found.setdefault(str(name), str(value))        # the first on sys.path wins, as for imports
    if changed:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{os.getpid()}"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(cached, f)
            os.replace(tmp, path)
        except OSError:
            pass      # a read-only home: read again next time
    return sorted(found.items())


def load_plugins() -> list[str]:
    """Register the families of installed plug-ins (at import of this module; again after sys.path changed). Returns
    the kinds added; a plug-in that fails is kept in FAILED (name → why) and skipped."""
    added: list[str] = []
    for name, value in _entry_points():
        try:
            obj = resolve_ref(value)
            found = obj() if callable(obj) and not isinstance(obj, Family) else obj
            fams = [found] if isinstance(found, Family) else list(found)
            if not fams or not all(isinstance(f, Family) for f in fams):
                raise TypeError(f"{value} is not a Family, a list of them, or a function returning either")
            for fam in fams:
                if fam.kind in _FAMILIES and fam.kind not in added:
                    raise ValueError(f"kind '{fam.kind}' is already served by rsinfer or another plug-in")
                register(fam)
                added.append(fam.kind)
            FAILED.pop(name, None)
        except Exception as exc:  # noqa: BLE001 - a broken plug-in must not stop rsinfer; its kind's errors say why
            FAILED[name] = f"plug-in '{name}' ({GROUP}: {value}) failed to load: {type(exc).__name__}: {exc}"
    return added


load_plugins()
