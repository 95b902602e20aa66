"""`hf:` / `path:` sources → ResolvedModel (local files + provenance); `download` materialises a folder.

All Hub traffic goes through huggingface_hub. The environment (HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE,
HF_HOME) is read when a model is resolved, never at import time.
"""

from __future__ import annotations

import filecmp
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from . import families
from .config import hub_cache_dir, normalize_dtype
from .errors import ConfigError, HubError, RepoAccessError

log = logging.getLogger("rsinfer.hub")

DEFAULT_GRAPHS = (
    "model.onnx", "model_fp16.onnx", "model_quantized.onnx", "model_q4f16.onnx", "model_q4.onnx",
    "model_int8.onnx", "model_uint8.onnx", "model_bnb4.onnx",
)
DTYPE_FIRST = {
    "auto": (),
    "fp32": ("model.onnx",),
    "fp16": ("model_fp16.onnx", "model.onnx"),
    "int8": ("model_int8.onnx", "model_int8_static.onnx", "model_quantized.onnx", "model.onnx"),
}
PROVENANCE_FILE = "rsinfer-source.json"


@dataclass(frozen=True)
class ModelSource:
    """What to resolve: the source keys of a model entry (or of `download` / `inspect` options)."""

    hf: str | None = None
    path: str | None = None
    revision: str = "main"
    subfolder: str | None = None
    file: str | None = None
    tokenizer_hf: str | None = None
    dtype: str = "auto"
    needs_tokenizer: bool = True     # text families need tokenizer.json; a tensor model is a graph alone
    # the files besides the graph its family reads (families.aux_files); None: any family's
    aux_files: tuple[str, ...] | None = None
    # the graph its family prefers over model.onnx (Family.graphs' first)
    prefer: str | None = None

    @classmethod
    def of(cls, model: Any, needs_tokenizer: bool = True, aux_files: tuple[str, ...] | None = None,
           prefer: str | None = None) -> ModelSource:
        return cls(hf=model.hf, path=model.path, revision=model.revision, subfolder=model.subfolder,
                   file=model.file, tokenizer_hf=model.tokenizer_hf, dtype=model.dtype,
                   needs_tokenizer=needs_tokenizer, aux_files=aux_files, prefer=prefer)


@dataclass(frozen=True)
class ResolvedModel:
    """Local files of one model plus where they came from."""

    source: str                      # hf:<repo>@<rev>[+aux:<repo>] | path:<dir>
    graph_file: str                  # repo-relative path of the chosen graph
    graph_path: Path                 # local path ORT loads (external data beside it)
    graph_reason: str                # why this graph was chosen
    candidates: tuple[str, ...]      # the preference order that was applied
    external_data: tuple[str, ...]   # repo-relative sibling weight files
    tokenizer_path: Path | None      # None: the folder has no tokenizer.json (a tensor model)
    aux: dict[str, Path] = field(default_factory=dict)        # aux name → local path
    aux_origin: dict[str, str] = field(default_factory=dict)  # aux name → "<source>:<rel>"
    repo: str | None = None
    revision: str | None = None
    commit: str | None = None
    origin: dict[str, Any] | None = None  # provenance recorded by `rsinfer download`

    def provenance(self) -> dict[str, Any]:
        out: dict[str, Any] = {"source": self.source, "repo": self.repo, "revision": self.revision,
                               "commit": self.commit, "file": self.graph_file, "local_path": str(self.graph_path),
                               "reason": self.graph_reason}
        if self.origin:
            out["downloaded_from"] = self.origin
        return out


class Progress(Protocol):
    def start(self, name: str, total: int | None) -> None: ...
    def advance(self, name: str, n: int) -> None: ...
    def done(self, name: str) -> None: ...


# ---------------------------------------------------------------- sources


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _safe_rel(rel: str) -> str:
    """A repo-relative file name that stays inside its folder, else HubError."""
    p = PurePosixPath(rel.replace("\\", "/"))
    if not rel or p.is_absolute() or ".." in p.parts or any(":" in part for part in p.parts[:1]):
        raise HubError(f"refusing file name {rel!r}: it would escape the target folder")
    return p.as_posix()


class _Files:
    """A listing of one source's files and a way to get each one locally."""

    label: str
    files: frozenset[str]

    def fetch(self, rel: str) -> Path:
        raise NotImplementedError


class _LocalFiles(_Files):
    def __init__(self, root: Path, label: str) -> None:
        self.root = root
        self.label = label
        self.files = frozenset(p.relative_to(root).as_posix() for p in root.rglob("*")
                               if p.is_file() and ".cache" not in p.relative_to(root).parts)

    def fetch(self, rel: str) -> Path:
        return self.root / rel


class _HubFiles(_Files):
    def __init__(self, repo: str, revision: str, cache_dir: Path, progress: Progress | None = None) -> None:
        import huggingface_hub as hh

        self.repo, self.revision, self.cache_dir, self.progress = repo, revision, cache_dir, progress
        self.endpoint = os.environ.get("HF_ENDPOINT") or None
        self.token = os.environ.get("HF_TOKEN") or None
        self.label = repo
        self.snapshot: Path | None = None
        if _offline():
            self._from_cache("HF_HUB_OFFLINE is set")
            return
        try:
            info = hh.HfApi(endpoint=self.endpoint, token=self.token).model_info(repo, revision=revision)
        except Exception as exc:  # noqa: BLE001 - mapped to typed errors below
            self._raise_or_fallback(exc)
            return
        self.commit = info.sha or revision
        self.files = frozenset(s.rfilename for s in (info.siblings or []))
        self._remember_ref()

    def _remember_ref(self) -> None:
        """Record revision → commit in the cache (files are fetched by commit), so an offline boot finds them."""
        from huggingface_hub.file_download import repo_folder_name

        if not self.commit or self.commit == self.revision:
            return
        ref = self.cache_dir / repo_folder_name(repo_id=self.repo, repo_type="model") / "refs" / self.revision
        try:
            if not ref.is_file() or ref.read_text() != self.commit:
                ref.parent.mkdir(parents=True, exist_ok=True)
                ref.write_text(self.commit)
        except OSError as exc:  # a read-only cache still serves this run
            log.debug("cannot record ref %s: %s", ref, exc)

    def _from_cache(self, why: str) -> None:
        import huggingface_hub as hh

        try:
            snap = hh.snapshot_download(self.repo, revision=self.revision, cache_dir=self.cache_dir,
                                        local_files_only=True)
        except Exception as exc:  # noqa: BLE001
            raise HubError(
                f"repository '{self.repo}@{self.revision}' is not in the HF cache ({self.cache_dir}) and {why}; "
                f"run `rsinfer download {self.repo} DIR` where the Hub is reachable and serve it with `path:`"
            ) from exc
        self.snapshot = Path(snap)
        self.commit = self.snapshot.name
        self.files = _LocalFiles(self.snapshot, self.repo).files

    def _raise_or_fallback(self, exc: Exception) -> None:
        typed = _typed_hub_error(exc, self.repo, self.revision, self.token)
        if typed is not None:
            raise typed from exc
        # network trouble: serve what the cache has, as huggingface_hub itself does for files
        log.warning("cannot reach the Hub for '%s' (%s); trying the local cache", self.repo,
                    type(exc).__name__)
        self._from_cache(f"the Hub is unreachable ({type(exc).__name__}: {exc})")

    def constants(self, rel: str) -> Path | None:
        """The nodes and small constants of graph `rel` (onnxfile.Graph as JSON), read by byte ranges once per
        commit and kept beside the HF cache; None where they cannot be had (offline and not kept, no ranges)."""
        from huggingface_hub.file_download import repo_folder_name

        from .onnxfile import OnnxFileError, RangeBytes, read_graph_from

        out = (self.cache_dir.parent / "rsinfer-constants" / repo_folder_name(repo_id=self.repo, repo_type="model")
               / str(self.commit) / (rel + ".json"))
        if out.is_file() or self.snapshot is not None:
            return out if out.is_file() else None
        try:
            size, fetch = self._ranges(rel)
            graph = read_graph_from(RangeBytes(size, fetch))
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps(graph.to_json()), encoding="utf-8")
            tmp.replace(out)
        except (OnnxFileError, OSError, HubError) as exc:
            log.warning("cannot read the constants of %s in '%s': %s", rel, self.repo, exc)
            return None
        return out

    def _ranges(self, rel: str) -> tuple[int, Any]:
        """(size, fetch(start, end) → bytes) of file `rel` over HTTP range requests."""
        import huggingface_hub as hh
        from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]  # documented, re-exported

        url = hh.hf_hub_url(self.repo, rel, revision=self.commit, endpoint=self.endpoint)
        headers = build_hf_headers(token=self.token)
        try:
            size = hh.get_hf_file_metadata(url, token=self.token).size
        except Exception as exc:  # noqa: BLE001
            raise HubError(f"no size for {rel}: {exc}") from exc
        if not size:
            raise HubError(f"no size for {rel}")

        def fetch(start: int, end: int) -> bytes:
            try:
                r = hh.get_session().get(url, headers={**headers, "Range": f"bytes={start}-{end - 1}"},
                                      follow_redirects=True, timeout=30)
            except Exception as exc:  # noqa: BLE001 - the network's errors, whatever the client
                raise HubError(f"range request: {exc}") from exc
            if r.status_code != 206:
                raise HubError(f"the Hub answered {r.status_code} to a range request")
            return bytes(r.content)

        return int(size), fetch

    def fetch(self, rel: str) -> Path:
        if self.snapshot is not None:
            return self.snapshot / rel
        import huggingface_hub as hh

        bridge = _tqdm_bridge(self.progress, rel) if self.progress else None
        try:
            return Path(hh.hf_hub_download(self.repo, rel, revision=self.commit, cache_dir=self.cache_dir,
                                           token=self.token, endpoint=self.endpoint, tqdm_class=bridge))
        except Exception as exc:  # noqa: BLE001
            typed = _typed_hub_error(exc, self.repo, self.revision, self.token)
            raise typed or HubError(f"cannot download '{rel}' from '{self.repo}@{self.revision}': {exc}") from exc


def _typed_hub_error(exc: Exception, repo: str, revision: str, token: str | None) -> HubError | None:
    """Our error for what huggingface_hub raised; None for network trouble (no answer from the Hub)."""
    from huggingface_hub import errors as he

    if isinstance(exc, he.GatedRepoError):
        return RepoAccessError(f"repository '{repo}' is gated: accept its terms on the Hub, then set HF_TOKEN "
                               f"({'the token given was refused' if token else 'no token is set'})")
    if isinstance(exc, he.RevisionNotFoundError):
        return HubError(f"revision '{revision}' not found in repository '{repo}'")
    if isinstance(exc, he.RepositoryNotFoundError):
        return RepoAccessError(f"repository '{repo}' not found, gated, or private; check the id or set HF_TOKEN")
    if isinstance(exc, he.RemoteEntryNotFoundError):
        return HubError(f"a file listed by '{repo}@{revision}' is missing on the Hub: {exc}")
    if isinstance(exc, he.HfHubHTTPError):
        return HubError(f"the Hub refused a request for '{repo}': {exc}")
    return None


def _tqdm_bridge(progress: Progress, name: str) -> type[Any]:
    """A tqdm stand-in that forwards huggingface_hub's byte counts to our Progress."""

    class Bridge:
        def __init__(self, *args: Any, total: int | None = None, **kwargs: Any) -> None:
            progress.start(name, total)

        def update(self, n: int = 1) -> None:
            progress.advance(name, n)

        def close(self) -> None:
            progress.done(name)

        def __enter__(self) -> Bridge:
            return self

        def __exit__(self, *exc: Any) -> None:
            self.close()

        def __getattr__(self, item: str) -> Any:
            return lambda *a, **k: None

    return Bridge


# ---------------------------------------------------------------- resolution


def graph_candidates(dtype: str = "auto", file: str | None = None, prefer: str | None = None) -> list[str]:
    """The graph preference order: `file` first, then the family's graph in the dtype's precisions (CLIP's
    vision_model_fp16.onnx for fp16), the dtype's favourites, the default list."""
    favourites = list(DTYPE_FIRST[normalize_dtype(dtype)])
    family = _variants(prefer, favourites) + [prefer] + _variants(prefer, DEFAULT_GRAPHS) if prefer else []
    order = ([file] if file else []) + family + favourites + \
        list(DEFAULT_GRAPHS) + [f.graphs[0] for f in families.all_families() if f.graphs]   # a folder of any kind
    return list(dict.fromkeys(order))


def _variants(graph: str, names: Any) -> list[str]:
    """`graph` (vision_model.onnx) in the precisions `names` are (model_fp16.onnx → vision_model_fp16.onnx)."""
    stem = graph.removesuffix(".onnx")
    return [stem + n.removeprefix("model") for n in names if n.startswith("model")]


def paired_graph(graph_file: str, main: str, other: str) -> str:
    """The file of a family's second graph that goes with its main graph `graph_file`: the same precision suffix
    (onnx/vision_model_quantized.onnx → text_model_quantized.onnx); the plain name where `graph_file` is not named
    after `main`."""
    name, stem = PurePosixPath(graph_file).name.removesuffix(".onnx"), main.removesuffix(".onnx")
    suffix = name[len(stem):] if name.startswith(stem) else ""
    return other.removesuffix(".onnx") + suffix + ".onnx"


def layout_graph(files: frozenset[str], subfolder: str | None = None) -> str | None:
    """The main graph of the several-graph family whose layout a repo's listing has (Xenova's CLIP: onnx/
    vision_model*.onnx beside text_model*.onnx): its combined onnx/model.onnx must not be taken for the model."""
    names = {PurePosixPath(f).name for f in files if PurePosixPath(f).parent.as_posix() in
             {"", ".", "onnx", (subfolder or "").strip("/")}}
    for f in families.all_families():
        if f.graphs and all(any(n.startswith(g.removesuffix(".onnx")) and n.endswith(".onnx") for n in names)
                            for g in f.graphs):
            return f.graphs[0]
    return None


def _folders(subfolder: str | None) -> list[str]:
    return list(dict.fromkeys(["", (subfolder or "").strip("/"), "onnx"]))


def _join(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name


def pick_graph(files: frozenset[str], dtype: str = "auto", file: str | None = None,
               subfolder: str | None = None, prefer: str | None = None) -> tuple[str, str, list[str]]:
    """(repo-relative graph, why, candidate order). For each candidate: root, then subfolder, then onnx/."""
    candidates = graph_candidates(dtype, file, prefer)
    if file:
        for folder in _folders(subfolder):
            rel = _join(folder, file)
            if rel in files:
                return rel, f"pinned by `file: {file}`", candidates
        raise HubError(f"`file: {file}` is not in the model's files; graphs there: {_graphs(files)}")
    for cand in candidates:
        for folder in _folders(subfolder):
            rel = _join(folder, cand)
            if rel in files:
                rank = candidates.index(cand) + 1
                why = (f"preference #{rank} ({cand}) with dtype {normalize_dtype(dtype)}; "
                       f"searched root, {'`' + subfolder + '/`, ' if subfolder else ''}onnx/")
                return rel, why, candidates
    raise HubError(f"no ONNX graph found (looked for {', '.join(candidates)} in root"
                   f"{', ' + subfolder if subfolder else ''} and onnx/); graphs there: {_graphs(files)}. "
                   "Pin one with `file:`")


def _graphs(files: frozenset[str]) -> str:
    found = sorted(f for f in files if f.endswith(".onnx"))
    return ", ".join(found) if found else "none"


def external_data_of(graph: str, files: frozenset[str]) -> list[str]:
    """Weight files ORT loads from beside the graph: `<graph>_data`, `<graph>.data`, `<graph>_data_1`…"""
    return sorted(f for f in files if f != graph and (f.startswith(graph + "_data") or f == graph + ".data"))


def _find_aux(name: str, sources: list[tuple[_Files, str | None]]) -> tuple[_Files, str] | None:
    for src, subfolder in sources:
        for folder in _folders(subfolder):
            rel = _join(folder, name)
            if rel in src.files:
                return src, rel
    return None


def module_files(modules_json: Path | None, modules_rel: str | None, files: frozenset[str]) -> list[tuple[str, str]]:
    """(aux name, repo-relative file) of what a sentence-transformers `modules.json` names: each module folder's
    `config.json` and `*.safetensors` weights (a Dense layer, a LayerNorm), named relative to modules.json's folder
    as sentence-transformers reads them. The Transformer's own folder holds the torch model the ONNX graph replaces:
    only its `sentence_bert_config.json` is taken. A `pytorch_model.bin` is never fetched (a torch pickle)."""
    if modules_json is None or modules_rel is None:
        return []
    try:
        modules = json.loads(modules_json.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []          # the family that reads modules.json says what is wrong with it
    base = PurePosixPath(modules_rel).parent.as_posix()
    base = "" if base == "." else base
    out: list[tuple[str, str]] = []
    for module in modules if isinstance(modules, list) else []:
        path = str(module.get("path") or "").strip("/") if isinstance(module, dict) else ""
        if not path or ".." in PurePosixPath(path).parts:
            continue
        transformer = str(module.get("type", "")).endswith("Transformer")
        prefix = _join(base, path) + "/"
        for rel in sorted(files):
            name = rel[len(prefix):]
            if not rel.startswith(prefix) or "/" in name:
                continue
            if name == "sentence_bert_config.json" if transformer else (name == "config.json"
                                                                        or name.endswith(".safetensors")):
                out.append((name if transformer else f"{path}/{name}", rel))
    return out


def _aux_files(main: _Files, spec: ModelSource, sources: list[tuple[_Files, str | None]],
               tokenizer_source: Any) -> tuple[dict[str, Path], dict[str, str]]:
    """The aux files (tokenizer, configs, a sentence-transformers folder's modules) fetched: name → local path, and
    name → where each came from. `tokenizer_source()`: the `tokenizer_hf` repo, asked only for what `main` lacks."""
    aux: dict[str, Path] = {}
    aux_origin: dict[str, str] = {}
    for name in spec.aux_files if spec.aux_files is not None else families.aux_files():
        hit = _find_aux(name, sources)
        if hit is None and spec.tokenizer_hf:
            hit = _find_aux(name, [(tokenizer_source(), None)])
        if hit is None:
            continue
        src, rel = hit
        aux[name] = src.fetch(_safe_rel(rel))
        aux_origin[name] = f"{src.label}:{rel}"
    modules = _find_aux("modules.json", [(main, spec.subfolder)])
    for name, rel in module_files(aux.get("modules.json"), modules[1] if modules else None, main.files):
        if name not in aux:
            aux[name] = main.fetch(_safe_rel(rel))
            aux_origin[name] = f"{main.label}:{rel}"
    return aux, aux_origin


def _family_of(main_graph: str | None) -> families.Family | None:
    """The several-graph family whose main graph is `main_graph`."""
    return next((f for f in families.all_families() if main_graph and f.graphs and f.graphs[0] == main_graph), None)


def _paired_aux(spec: ModelSource, graph: str, fam: families.Family) -> ModelSource:
    """`spec` asking for the other graphs of `fam` in the precision of `graph`."""
    prefer = fam.graphs[0]
    names = spec.aux_files if spec.aux_files is not None else families.aux_files()
    return replace(spec, aux_files=tuple(paired_graph(graph, prefer, n) if n in fam.graphs[1:] else n
                                                     for n in names))


def _constant_graphs(main: _Files, subfolder: str | None, fam: families.Family | None, aux: dict[str, Path],
                     aux_origin: dict[str, str]) -> None:
    """The constants of the first of `fam`'s constant_graphs a Hub repo has, as aux `<name>.constants.json` (a
    local folder's graph is read where it lies)."""
    if fam is None or not isinstance(main, _HubFiles):
        return
    for name in fam.constant_graphs:
        hit = _find_aux(name, [(main, subfolder)])
        # offline, the snapshot lists what was downloaded: the constants kept of a graph never downloaded count
        rels = [hit[1]] if hit else [] if main.snapshot is None else [_join(f, name) for f in _folders(subfolder)]
        for rel in rels:
            path = main.constants(_safe_rel(rel))
            if path is not None:
                aux[name + ".constants.json"] = path
                aux_origin[name + ".constants.json"] = f"{main.label}:{rel} (nodes and small constants)"
                return
        if hit:
            return


def resolve(spec: ModelSource, cache_dir: Path | None = None, progress: Progress | None = None) -> ResolvedModel:
    """Find (and fetch into the HF cache) the graph, its external data and the aux files of a model."""
    cache = cache_dir or hub_cache_dir()
    if (spec.hf is None) == (spec.path is None):
        raise ConfigError("exactly one of `hf` or `path` must be set")
    origin = None
    if spec.path is not None:
        root = Path(spec.path).expanduser()
        if not root.is_dir():
            raise HubError(f"model folder '{spec.path}' does not exist or is not a folder")
        main: _Files = _LocalFiles(root, f"path:{spec.path}")
        source = f"path:{spec.path}"
        prov = root / PROVENANCE_FILE
        if prov.is_file():
            try:
                origin = json.loads(prov.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                origin = None
    else:
        assert spec.hf is not None   # a source is a path or a repo
        main = _HubFiles(spec.hf, spec.revision, cache, progress)
        source = f"hf:{spec.hf}@{spec.revision}"
    prefer = spec.prefer or layout_graph(main.files, spec.subfolder)
    graph, why, candidates = pick_graph(main.files, spec.dtype, spec.file, spec.subfolder, prefer)
    fam = _family_of(prefer)
    if fam is not None:      # the family's other graphs in the main graph's precision
        spec = _paired_aux(spec, graph, fam)
    sources: list[tuple[_Files, str | None]] = [(main, spec.subfolder)]
    tok_src: _Files | None = None

    def tokenizer_source() -> _Files:
        nonlocal tok_src, source
        if tok_src is None:
            assert spec.tokenizer_hf is not None
            tok_src = _HubFiles(spec.tokenizer_hf, "main", cache, progress)
            source += f"+aux:{spec.tokenizer_hf}"
        return tok_src

    aux, aux_origin = _aux_files(main, spec, sources, tokenizer_source)
    _constant_graphs(main, spec.subfolder, fam, aux, aux_origin)
    if "tokenizer.json" not in aux and spec.needs_tokenizer:
        extra = f" nor in '{spec.tokenizer_hf}'" if spec.tokenizer_hf else ""
        raise HubError(f"tokenizer.json not found in {main.label} (root, "
                       f"{spec.subfolder + ', ' if spec.subfolder else ''}onnx/){extra}; "
                       "set `tokenizer_hf` to a repo that has it")
    ext = external_data_of(graph, main.files)
    graph_path = main.fetch(_safe_rel(graph))
    for rel in ext:
        main.fetch(_safe_rel(rel))
    commit = getattr(main, "commit", None)
    return ResolvedModel(
        source=source, graph_file=graph, graph_path=graph_path, graph_reason=why,
        candidates=tuple(candidates), external_data=tuple(ext), tokenizer_path=aux.get("tokenizer.json"),
        aux=aux, aux_origin=aux_origin, repo=spec.hf, revision=spec.revision if spec.hf else None,
        commit=commit, origin=origin,
    )


# ---------------------------------------------------------------- download


def _umask() -> int:
    """This process's umask, read without changing it where Linux says it (/proc/self/status), else by setting it
    and back."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _place(src: Path, dest: Path) -> bool:
    """Copy src to dest atomically, with the mode a plain write gets (0666 less the umask: mkstemp's 0600 made a
    folder copied for a service user unreadable to it); False when dest already holds the same bytes."""
    if dest.is_file() and dest.stat().st_size == src.stat().st_size and filecmp.cmp(src, dest, shallow=False):
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    os.fchmod(fd, 0o666 & ~_umask())
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


@dataclass(frozen=True)
class DownloadResult:
    resolved: ResolvedModel
    out: Path
    files: tuple[tuple[str, int, bool], ...]  # (relative path, size, written?)


def _inside(out: Path, rel: str) -> Path:
    dest = (out / _safe_rel(rel)).resolve()
    if not dest.is_relative_to(out.resolve()):
        raise HubError(f"refusing file name {rel!r}: it would escape {out}")
    return dest


def download(spec: ModelSource, out: Path, cache_dir: Path | None = None,
             progress: Progress | None = None) -> DownloadResult:
    """Resolve a Hub model, then write a self-contained folder in the layout `path:` loads."""
    if spec.hf is None:
        raise ConfigError("download needs a Hub repo id")
    resolved = resolve(spec, cache_dir, progress)
    plan: list[tuple[str, Path]] = [(resolved.graph_file, resolved.graph_path)]
    for rel in resolved.external_data:
        plan.append((rel, resolved.graph_path.parent / PurePosixPath(rel).name))
    plan += [(name, path) for name, path in resolved.aux.items()]
    out.mkdir(parents=True, exist_ok=True)
    targets = [(rel, src, _inside(out, rel)) for rel, src in plan]  # refuse before writing anything
    written = []
    for rel, src, dest in targets:
        changed = _place(src, dest)
        written.append((rel, dest.stat().st_size, changed))
    prov = {"repo": spec.hf, "revision": spec.revision, "commit": resolved.commit,
            "file": resolved.graph_file, "tokenizer_hf": spec.tokenizer_hf,
            "aux": resolved.aux_origin}
    text = json.dumps(prov, indent=2, sort_keys=True) + "\n"
    prov_path = out / PROVENANCE_FILE
    if not prov_path.is_file() or prov_path.read_text(encoding="utf-8") != text:
        prov_path.write_text(text, encoding="utf-8")
    return DownloadResult(resolved=resolved, out=out, files=tuple(written))
