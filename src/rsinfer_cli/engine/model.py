"""One loaded model: resolved files + `replicas` ORT sessions + the graph signature, and how it was built.

Tensor-generic: the engine knows sessions, input/output names, dtypes and shapes, and runs
`feeds: dict[str, ndarray] → dict[str, ndarray]`. Text (tokenizers, feed building) belongs to the text families.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..config import ACCELERATOR_MAX_TOKENS, CPU_MAX_PADDING, CPU_MAX_TOKENS, ModelConfig, ServerConfig
from ..errors import InferenceError, ModelLoadError
from ..hub import ModelSource, Progress, ResolvedModel, paired_graph, resolve
from .session import (
    EpPlan,
    Feeds,
    GraphInfo,
    Session,
    actual_providers,
    build_session,
    graph_info,
    plan_eps,
    sample_feeds,
)
from .threads import ModelThreads, plan_models

log = logging.getLogger("rsinfer.engine")

Outputs = dict[str, np.ndarray]

# position-embedding offsets of families whose max_position_embeddings counts padding slots
_POSITION_OFFSET = {"roberta": 2, "xlm-roberta": 2, "camembert": 2, "bart": 2, "longformer": 2}


def rss_bytes() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _read_json(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc
    return data if isinstance(data, dict) else {}


def effective_max_len(cfg_max_len: int | None, aux: dict[str, dict[str, Any]]) -> tuple[int | None, str]:
    """`max_len`, else the sentence-transformers limit, the tokenizer's, the position table's — the smallest
    known limit, so that an over-length row never reaches the graph."""
    if cfg_max_len:
        return cfg_max_len, "max_len in config"
    found: list[tuple[int, str]] = []
    st = aux.get("sentence_bert_config.json", {}).get("max_seq_length")
    if isinstance(st, int) and st > 0:
        return st, "sentence_bert_config.json max_seq_length"
    tk = aux.get("tokenizer_config.json", {}).get("model_max_length")
    if isinstance(tk, (int, float)) and 0 < tk < 1_000_000:
        found.append((int(tk), "tokenizer_config.json model_max_length"))
    hf = aux.get("config.json", {})
    pos = hf.get("max_position_embeddings")
    if isinstance(pos, int) and pos > 0:
        found.append((pos - _POSITION_OFFSET.get(hf.get("model_type", ""), 0),
                      "config.json max_position_embeddings"))
    if not found:
        return None, "no limit known"
    return min(found)


@dataclass
class Tower:
    """A second graph of a model (CLIP's text tower beside its vision tower): a session per lane of the main
    graph's, and the wide lane's."""

    file: str
    sessions: list[Session]
    wide: Session | None
    graph: GraphInfo


def _tower(cfg: ModelConfig, resolved: ResolvedModel, name: str, plan: EpPlan, threads: ModelThreads) -> Tower:
    """Tower `name` (a file beside the main graph, fetched as its family's aux file), built as the main graph's
    sessions are and trial-run."""
    path = resolved.aux.get(name)
    if path is None:
        raise ModelLoadError(f"model '{cfg.name}': its family needs {name} beside {resolved.graph_file}; the folder "
                             "has none", model=cfg.name)
    built = [build_session(path, cfg, plan, threads.threads) for _ in range(threads.sessions)]
    sessions = built * threads.lanes if len(built) == 1 else built
    wide = build_session(path, cfg, plan, threads.wide, spinning=True) if threads.wide else None
    graph = graph_info(sessions[0])
    _trial_forward(cfg.name, sessions + ([wide] if wide is not None else []), graph)
    return Tower(name, sessions, wide, graph)


@dataclass
class LoadedModel:
    config: ModelConfig
    resolved: ResolvedModel
    sessions: list[Session]            # one per lane (the same session for every lane when they share it)
    graph: GraphInfo
    eps: EpPlan
    providers: list[str]
    max_len: int | None
    max_len_source: str
    aux: dict[str, dict[str, Any]] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    threads: ModelThreads = field(default_factory=lambda: ModelThreads(lanes=1, threads=1, sessions=1))
    wide: Session | None = None        # the latency lane: every CPU on one forward that runs alone
    backend: str = "onnx"              # onnx, or a script model's python | exec (engine/scripts/)
    program: str | None = None         # a script model: what runs (venv, compiled executable)
    # requests the runtime's core holds for this version (what a reload waits for before it frees it)
    in_flight: int = field(default=0, compare=False)
    # the other graphs of a several-graph family (Family.graphs), by file name, with the main graph's lanes
    towers: dict[str, Tower] = field(default_factory=dict)

    def tower(self, name: str, session: Session) -> Session:
        """The session of tower `name` in the lane `session` (one of the main graph's, or the wide one) is."""
        tower = self.towers[name]
        if session is self.wide and tower.wide is not None:
            return tower.wide
        for i, s in enumerate(self.sessions):
            if s is session:
                return tower.sessions[i]
        raise KeyError(f"model '{self.name}': the session is none of its lanes")

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def kind(self) -> str:
        return self.config.kind

    @property
    def version(self) -> str | None:
        return self.config.version

    @functools.cached_property
    def key(self) -> str:
        """Unique among the loaded models: the name, with `:version` for a version of a versioned model (worked out
        once: every request looks its model's pipeline and queue up by it)."""
        return self.config.key

    @property
    def replicas(self) -> int:
        """Forwards it runs at once (its lanes); in a front-end process (which holds no session) too."""
        return len(self.sessions) or self.threads.lanes

    @property
    def hf_config(self) -> dict[str, Any]:
        return self.aux.get("config.json", {})

    @property
    def on_cpu(self) -> bool:
        return self.providers[0] == "cpu"

    @property
    def max_tokens(self) -> int:
        """Padded tokens per forward: `batching.max_tokens`, else a default for where the model runs (on CPU,
        padding and long batches cost more than the per-forward overhead they save)."""
        configured = self.config.batching.max_tokens
        if configured:
            return configured
        return CPU_MAX_TOKENS if self.on_cpu else ACCELERATOR_MAX_TOKENS

    @property
    def max_padding(self) -> int | None:
        """Padding a row may add to a batch (CPU only: accelerators pay little for padding)."""
        return CPU_MAX_PADDING if self.on_cpu else None

    def run(self, session: Session, feeds: Feeds, outputs: list[str] | None = None) -> Outputs:
        """One forward on `session` (one of this model's replicas) → the requested outputs by name."""
        names = outputs or self.output_names
        try:
            values = session.run(names, feeds)
        except Exception as exc:  # noqa: BLE001 - ORT raises untyped errors
            raise InferenceError(f"inference failed for model '{self.name}': {exc}", model=self.name) from exc
        return dict(zip(names, map(np.asarray, values), strict=True))   # (no comprehension: a call less a forward)

    @functools.cached_property
    def output_names(self) -> list[str]:
        return [o.name for o in self.graph.outputs]

    def card(self) -> dict[str, Any]:
        """What the model is and how it runs, for /v1/models, `inspect` and logs."""
        return {
            "name": self.name, "kind": self.kind, "source": self.resolved.source,
            "provenance": self.resolved.provenance(), "graph_file": self.resolved.graph_file,
            "graph_reason": self.resolved.graph_reason, "dtype": self.config.dtype,
            "execution_providers": self.providers, "eps_requested": list(self.eps.requested),
            "eps_skipped": [{"ep": ep, "reason": why} for ep, why in self.eps.skipped],
            "replicas": self.replicas, "threads": self.threads.to_json(), "max_len": self.max_len,
            "max_len_source": self.max_len_source,
            "default": self.config.default, "version": self.version, "backend": self.backend,
            "warmup": self.stats.get("warmup"),
            **({"program": self.program} if self.program else {}),
        }


def _trial_forward(name: str, sessions: list[Session], graph: GraphInfo, feeds: Feeds | None = None) -> None:
    """One tiny forward per replica on feeds built from the signature (or the family's, `feeds`): a graph that
    cannot run fails at start-up, and the first request does not pay ORT's lazy initialisation."""
    feeds = sample_feeds(graph) if feeds is None else feeds
    first_output = [graph.outputs[0].name]
    for session in {id(s): s for s in sessions}.values():
        try:
            session.run(first_output, feeds)
        except Exception as exc:  # noqa: BLE001 - ORT raises untyped errors
            raise ModelLoadError(f"model '{name}' fails a trial forward: {exc}", model=name) from exc


def with_options(cfg: ModelConfig) -> ModelConfig:
    """The entry with its family's options dataclass in `options` (its defaults when the entry set none): a loaded
    model's pipeline (and a plug-in's) reads `model.config.options`; building a ModelConfig resolved no family code,
    loading one does."""
    from .. import families

    cls = families.options_class(cfg.kind)
    if cls is None or isinstance(cfg.options, cls):
        return cfg
    return dataclasses.replace(cfg, options=cls())


def load_model(cfg: ModelConfig, server: ServerConfig | None = None, cache_dir: Path | None = None,
               progress: Progress | None = None, threads: ModelThreads | None = None) -> LoadedModel:
    """Resolve (the tokenizer only where the family needs one), build its sessions as `threads` says (else as the
    thread plan of this model alone says: engine/threads.py), trial-run them."""
    from .. import families
    from .scripts import CONTRACT_FILE, agree_with_graph, script_backend

    cfg = with_options(cfg)
    server = server or ServerConfig()
    backend = script_backend(cfg)
    if backend is not None:
        return finish_load(load_script(cfg, server, backend, threads))
    t0 = time.perf_counter()
    family = families.get(cfg.kind)
    resolved = resolve(ModelSource.of(cfg, family.needs_tokenizer, families.aux_files(cfg.kind),
                                      family.graphs[0] if family.graphs else None), cache_dir, progress)
    t_resolve = time.perf_counter() - t0
    aux = {name: _read_json(path) for name, path in resolved.aux.items() if name.endswith(".json")
           and name != "tokenizer.json"}
    max_len, max_len_source = effective_max_len(cfg.max_len, aux)
    plan = plan_eps(cfg)
    for ep, why in plan.skipped:
        log.warning("model %s: execution provider %s skipped: %s", cfg.name, ep, why)
    if threads is None:
        threads = plan_models([cfg], server).models[cfg.key]
    rss0 = rss_bytes()
    t1 = time.perf_counter()
    built = [build_session(resolved.graph_path, cfg, plan, threads.threads) for _ in range(threads.sessions)]
    sessions = built * threads.lanes if len(built) == 1 else built
    wide = build_session(resolved.graph_path, cfg, plan, threads.wide, spinning=True) if threads.wide else None
    t_build = time.perf_counter() - t1
    rss_delta = rss_bytes() - rss0
    graph = graph_info(sessions[0])
    if cfg.kind == "tensor" and cfg.path and (Path(cfg.path).expanduser() / CONTRACT_FILE).is_file():
        cfg = agree_with_graph(cfg, Path(cfg.path).expanduser(), graph)
    _trial_forward(cfg.name, sessions + ([wide] if wide is not None else []), graph, family.trial(graph, aux))
    towers = {name: _tower(cfg, resolved, paired_graph(resolved.graph_file, family.graphs[0], name), plan, threads)
              for name in family.graphs[1:]}
    size = resolved.graph_path.stat().st_size + sum(
        (resolved.graph_path.parent / Path(rel).name).stat().st_size for rel in resolved.external_data)
    stats = {"file_bytes": size, "resolve_s": round(t_resolve, 3), "build_s": round(t_build, 3),
             "rss_delta_bytes": rss_delta}
    model = LoadedModel(config=cfg, resolved=resolved, sessions=sessions, graph=graph, eps=plan,
                        providers=actual_providers(sessions[0]), max_len=max_len, max_len_source=max_len_source,
                        aux=aux, stats=stats, threads=threads, wide=wide, towers=towers)
    log.info("model %s loaded: %s (%s), %.1f MiB, %s built in %.2fs, RSS +%.1f MiB, EPs %s",
             cfg.name, resolved.graph_file, resolved.source, size / 2**20, threads.describe(), t_build,
             rss_delta / 2**20, ",".join(model.providers))
    return finish_load(model)


_LOADS = itertools.count(1)


def finish_load(model: LoadedModel) -> LoadedModel:
    """The model after its entry's `warmup:` ran (engine/warmup.py; what ran in its stats and card), numbered: its
    load serial tells this load from another of the same entry (a front-end process learns of a reload by it)."""
    model.stats["serial"] = next(_LOADS)
    cfg = model.config.warmup
    if cfg is not None:
        from .warmup import warm

        model.stats["warmup"] = ran = warm(model, cfg)
        log.info("model %s: warm-up: %d forwards (%s) in %.2fs", model.name, ran["forwards"],
                 ", ".join(ran["shapes"]), ran["seconds"])
    return model


def load_script(cfg: ModelConfig, server: ServerConfig, backend: str, threads: ModelThreads | None = None
                ) -> LoadedModel:
    """A script model (engine/scripts/): its folder's contract, its program built (venv, compiler), and one
    process-per-forward session shared by its lanes. No trial forward: a model's code may not take zeros."""
    import dataclasses

    from .scripts import CONTRACT_FILE as CONTRACT
    from .scripts import backend as script_impl
    from .scripts import read_contract

    assert cfg.path is not None
    folder = Path(cfg.path).expanduser()
    t0 = time.perf_counter()
    contract = read_contract(folder, cfg.name)
    impl = script_impl(backend)
    argv, program = impl.program(folder, cfg.name)
    if threads is None:
        threads = plan_models([cfg], server).models[cfg.key]
    sessions, how = impl.sessions(cfg.name, folder, argv, contract, server.request_timeout_ms / 1000, threads.lanes)
    program += how
    if len({id(s) for s in sessions}) > 1:      # a session of its own per lane (a long-lived process each)
        threads = dataclasses.replace(threads, sessions=threads.lanes)
    if not cfg.max_batch_size and contract.max_batch_size:   # the folder's own limit, unless the config sets one
        cfg = dataclasses.replace(cfg, max_batch_size=contract.max_batch_size)
    main_file = impl.main_file
    graph_path = folder / main_file
    resolved = ResolvedModel(source=cfg.source, graph_file=main_file, graph_path=graph_path,
                             graph_reason=f"backend {backend}" + (" (from `backend:`)" if cfg.backend != "auto"
                                                                  else " (detected from the folder)"),
                             candidates=(), external_data=(), tokenizer_path=None,
                             aux={CONTRACT: folder / CONTRACT}, aux_origin={CONTRACT: f"{cfg.source}:{CONTRACT}"})
    graph = GraphInfo(contract.inputs, contract.outputs)
    stats = {"file_bytes": graph_path.stat().st_size if graph_path.exists() else 0,
             "resolve_s": 0.0, "build_s": round(time.perf_counter() - t0, 3), "rss_delta_bytes": 0}
    eps = EpPlan(requested=tuple(cfg.eps), resolved=("cpu",), options=({},))
    log.info("model %s: %s backend, %s, %s; %s", cfg.name, backend, program, contract.file, threads.describe())
    return LoadedModel(config=cfg, resolved=resolved, sessions=sessions, graph=graph, eps=eps,
                       providers=["cpu"], max_len=None, max_len_source="a script model", stats=stats,
                       threads=threads, backend=backend, program=program)
