"""CLIP and SigLIP (`kind: image_text`): image and text vectors in one space, and zero-shot image classification,
exactly as transformers computes them (pipelines/imageprep.py: pixels; pipelines/clip.py: text rows, zero-shot).

The folder holds the vision tower (the main graph, onnx/vision_model.onnx) and the text tower beside it
(text_model.onnx, Family.graphs), the processor's preprocessor_config.json and the tokenizer. A row is a text's
token ids or an image's pixels: rows of both kinds share the queue, and a forward runs each kind on its tower of the
lane. An image row is keyed for the row cache by the digest of its bytes and its decoding route.

Vectors are unit length by default (cosine-ready, as the embedding routes of infinity and TEI give them); `normalize:
false` gives transformers' `get_text_features` / `get_image_features` as they are.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import opt
from ..engine.model import LoadedModel
from ..engine.session import Session
from ..errors import InputError, ModelLoadError
from ..families import Folder
from . import clip
from . import imageprep as ip
from .base import Array, Timed, Timing, Work
from .embedding import Embedder, EmbedResult

TEXT_TOWER = "text_model.onnx"
ROUTES = ("processor", "pipeline")
DEFAULT_TEMPLATE = "This is a photo of {}."        # transformers' zero-shot-image-classification default


@dataclass(frozen=True)
class ImageTextOptions:
    """The image_text family's model keys."""

    # zero-shot: exp(logit_scale) scales the cosines (null: model.safetensors' logit_scale, else the one the repo's
    # combined graph onnx/model.onnx scales its logits by)
    logit_scale: float | None = None
    # zero-shot (SigLIP): added to the scaled cosines (null: model.safetensors' logit_bias, else the combined
    # graph's)
    logit_bias: float | None = None
    # zero-shot: the label's prompt ({} is the label); a request's `hypothesis_template` overrides
    zero_shot_template: str = DEFAULT_TEMPLATE
    # encoded bytes of one image; more → 400
    max_image_bytes: int = opt(20 << 20, gt=0)
    # pixels an image's header may declare; more → 400 before any pixel is decoded (a decompression bomb)
    max_image_pixels: int = opt(50_000_000, gt=0)
    # images per request; more → 400
    max_images: int = opt(64, gt=0)
    # labels per zero-shot request
    max_candidate_labels: int = opt(64, gt=0)
    # hosts whose http(s) image URLs a request may name (exact names); empty: URLs are refused, nothing is fetched
    image_url_hosts: tuple[str, ...] = ()
    # a URL's fetch: at most this long (and max_image_bytes)
    image_url_timeout_s: float = opt(10.0, gt=0)


def recognise(folder: Folder) -> str | None:
    kind = clip.KINDS.get(str(folder.config.get("model_type", "")))
    if kind is not None and "preprocessor_config.json" in folder.files:
        return f"config.json model_type: {folder.config.get('model_type')} with preprocessor_config.json"
    return None


@dataclass
class ZeroShotResult(Timed):
    """Per image: (label, score) best first (ties in label order), and the logits in label order."""

    labels: list[list[tuple[str, float]]]
    logits: list[Array]
    timing: Timing


IMAGE = "i"      # an image row is (IMAGE, digest, pixels); a text row its token ids (both survive the engine IPC)


def is_image(row: Any) -> bool:
    return bool(len(row)) and row[0] == IMAGE


class ImageTextPipeline(Embedder):
    kind = "image_text"

    def __init__(self, model: LoadedModel) -> None:
        super().__init__(model)
        name = model.name
        opts = model.config.own(ImageTextOptions)
        if TEXT_TOWER not in model.towers:
            raise ModelLoadError(f"model '{name}': an image_text model needs {TEXT_TOWER}", model=name)
        if model.resolved.tokenizer_path is None:
            raise ModelLoadError(f"model '{name}': an image_text model needs tokenizer.json", model=name)
        try:
            import PIL  # noqa: F401 - decoding and resizing are Pillow's
        except ModuleNotFoundError:
            raise ModelLoadError(f"model '{name}': an image_text model needs Pillow: pip install 'rsinfer[images]'",
                                 model=name) from None
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(model.resolved.tokenizer_path))
        try:
            self.spec = clip.TextSpec.of(model.hf_config, self.tokenizer, f"model '{name}': config.json")
            self.image_cfg = ip.ImageConfig.of(model.aux.get("preprocessor_config.json") or {})
        except ip.ImageConfigError as exc:
            raise ModelLoadError(f"model '{name}': {exc}", model=name) from None
        self.text_output, self.image_output = clip.OUTPUTS[self.spec.kind]
        self._check_outputs(name)
        self.dim = self._width(self.image_output, model.graph)
        self.limits = ip.Limits(opts.max_image_bytes, opts.max_image_pixels)
        self.urls = ip.UrlPolicy(tuple(opts.image_url_hosts), opts.image_url_timeout_s)
        self.max_images, self.max_labels = opts.max_images, opts.max_candidate_labels
        self.template = opts.zero_shot_template
        self._given = {"logit_scale": opts.logit_scale, "logit_bias": opts.logit_bias}
        self.image_cost = max(1, self.max_tokens // 8)      # one fixed shape: eight images a forward at most

    def _check_outputs(self, name: str) -> None:
        text = self.model.towers[TEXT_TOWER].graph
        if self.image_output not in self.model.output_names:
            raise ModelLoadError(f"model '{name}': the vision graph has no output '{self.image_output}'", model=name)
        if self.text_output not in [o.name for o in text.outputs]:
            raise ModelLoadError(f"model '{name}': {self.model.towers[TEXT_TOWER].file} has no output "
                                 f"'{self.text_output}'", model=name)

    def _width(self, output: str, graph: Any) -> int | None:
        info = graph.output(output)
        width = info.shape[-1] if info is not None and info.shape else None
        return width if isinstance(width, int) else None

    def describe(self) -> dict[str, Any]:
        c = self.image_cfg
        return {"kind": self.kind, "family": self.spec.kind, "dim": self.dim,
                "text_tower": self.model.towers[TEXT_TOWER].file,
                "text_positions": self.spec.max_len, "image_size": [c.height, c.width],
                "resample": ip.RESAMPLE[c.resample].lower(),
                "resize": f"shortest edge {c.shortest_edge}, center crop" if c.shortest_edge else "exact",
                "zero_shot_template": self.template, "zero_shot": self._zero_shot_line()}

    def _zero_shot_line(self) -> str:
        got = self._logits
        if isinstance(got, str):
            return f"unavailable: {got}"
        bias = f", logit_bias {got[1]:.6g}" if self.spec.kind == "siglip" else ""
        return f"logit_scale {got[0]:.6g}{bias} (from {got[2]})"

    # ------------------------------------------------------------ rows

    def forward(self, session: Session, rows: Sequence[Any]) -> list[Any]:
        out: list[Any] = [None] * len(rows)
        images = [i for i, r in enumerate(rows) if is_image(r)]
        texts = [i for i, r in enumerate(rows) if not is_image(r)]
        if images:
            px = np.stack([rows[i][2] for i in images])
            got = self.model.run(session, {"pixel_values": px}, [self.image_output])[self.image_output]
            for j, i in enumerate(images):
                out[i] = np.asarray(got[j], dtype=np.float32)
        if texts:
            width = self.spec.max_len if self.spec.pad_to_max else max(len(rows[i]) for i in texts)
            ids = np.full((len(texts), width), self.spec.pad_id, dtype=np.int64)
            for j, i in enumerate(texts):
                ids[j, :len(rows[i])] = rows[i]
            tower = self.model.tower(TEXT_TOWER, session)
            got = tower.run([self.text_output], {"input_ids": ids})[0]
            for j, i in enumerate(texts):
                out[i] = np.asarray(got[j], dtype=np.float32)
        return out

    def row_bytes(self, row: Any) -> bytes:
        if is_image(row):
            return b"i" + bytes(row[1])
        return b"t" + np.asarray(row, dtype="<i4").tobytes()

    def sample_rows(self, batch: int, length: int,
                    shapes: dict[str, list[int]] | None = None) -> tuple[list[Any], list[int]]:
        c = self.image_cfg
        row = (IMAGE, b"\0" * 32, np.zeros((3, c.height, c.width), dtype=np.float32))
        return [row] * batch, [self.image_cost] * batch

    def _text_rows(self, texts: Sequence[str], timing: Timing) -> list[tuple[int, ...]]:
        t0 = time.perf_counter()
        rows = [tuple(r) for r in clip.token_rows(self.tokenizer, self.spec, texts)]
        timing.tokenize_s += time.perf_counter() - t0
        timing.tokens += sum(len(r) for r in rows)
        return rows

    def image_rows(self, images: Sequence[bytes | str], route: str = "processor",
                   param: str = "input") -> list[tuple[str, bytes, Array]]:
        """Encoded images (or URLs of allowed hosts, fetched here on the preparation pool) → rows (InputError naming
        the item that cannot be read)."""
        if len(images) > self.max_images:
            raise InputError(f"`{param}` has {len(images)} images; at most {self.max_images}", param=param)
        rows = []
        for i, item in enumerate(images):
            try:
                data = ip.fetch_image(item, self.urls, self.limits) if isinstance(item, str) else item
                px = ip.preprocess(data, self.image_cfg, self.limits, route)
            except ip.ImageInputError as exc:
                raise InputError(f"{param}[{i}]: {exc}", param=f"{param}[{i}]") from None
            rows.append((IMAGE, hashlib.sha256(route.encode() + b"\0" + data).digest(), px))
        return rows

    # ------------------------------------------------------------ the embedding routes

    def plan(self, texts: Sequence[Any] | None = None, ids: Sequence[Sequence[int]] | None = None, *,
             dimensions: int | None = None, normalize: bool | None = None, truncate: bool | None = None,
             direction: str = "right", param: str = "input", prompt_name: str | None = None,
             prompt: str | None = None) -> Work[EmbedResult]:
        """Texts → their vectors in the shared space."""
        if ids is not None:
            raise InputError("an image_text model embeds texts and images, not token ids", param=param)
        self.check_dimensions(dimensions)
        prefix = self.prompt_text(prompt_name, prompt)
        timing = Timing()
        rows = self._text_rows([prefix + t for t in (texts or ())], timing)
        return Work(rows, [len(r) for r in rows], lambda outs: self._vectors(outs, normalize, timing), timing)

    def plan_images(self, images: Sequence[bytes | str], *, normalize: bool | None = None, route: str = "processor",
                    param: str = "input") -> Work[EmbedResult]:
        """Encoded images → their vectors in the shared space."""
        timing = Timing()
        t0 = time.perf_counter()
        rows = self.image_rows(images, route, param)
        timing.tokenize_s += time.perf_counter() - t0
        return Work(rows, [self.image_cost] * len(rows), lambda outs: self._vectors(outs, normalize, timing), timing)

    def plan_items(self, items: Sequence[tuple[str, Any]], *, normalize: bool | None = None,
                   param: str = "input") -> Work[EmbedResult]:
        """Texts and images in one list (Jina's, Cohere's `inputs`), each embedded by its tower, in order."""
        timing = Timing()
        t0 = time.perf_counter()
        texts = [i for i, (kind, _) in enumerate(items) if kind == "text"]
        images = [i for i, (kind, _) in enumerate(items) if kind != "text"]
        rows: list[Any] = [None] * len(items)
        for i, text_row in zip(texts, self._text_rows([items[i][1] for i in texts], timing), strict=True):
            rows[i] = text_row
        decoded = self.image_rows([items[i][1] for i in images], "processor", param)
        for i, image_row in zip(images, decoded, strict=True):
            rows[i] = image_row
        timing.tokenize_s = time.perf_counter() - t0
        costs = [self.image_cost if is_image(r) else len(r) for r in rows]
        return Work(rows, costs, lambda outs: self._vectors(outs, normalize, timing), timing)

    def _vectors(self, outs: list[Any], normalize: bool | None, timing: Timing) -> EmbedResult:
        vecs = np.stack(outs).astype(np.float32) if outs else np.zeros((0, self.dim or 0), np.float32)
        return EmbedResult(clip.unit(vecs) if normalize is not False and len(vecs) else vecs, timing)

    def check_dimensions(self, dimensions: int | None) -> None:
        if dimensions is not None and dimensions != self.dim:
            raise InputError(f"`dimensions`: this model's vectors are {self.dim} wide", param="dimensions")

    def prompt_text(self, prompt_name: str | None = None, prompt: str | None = None) -> str:
        if prompt_name is not None:
            raise InputError(f"`prompt_name` {prompt_name!r}: an image_text model has no named prompts",
                             param="prompt_name")
        return prompt or ""

    # ------------------------------------------------------------ zero-shot image classification

    @functools.cached_property
    def _logits(self) -> tuple[float, float, str] | str:
        """(logit_scale, logit_bias, source) from the entry, the weights or the combined graph, read once; the reason
        where none has them."""
        from pathlib import Path

        folder = Path(self.model.resolved.graph_path).parent
        folder = folder.parent if folder.name == "onnx" else folder
        try:
            return clip.find_logit_params(folder, self.spec.kind, self._given, self.model.resolved.aux)
        except ModelLoadError as exc:
            return exc.message

    def logit_params(self) -> tuple[float, float]:
        """(logit_scale, logit_bias) (ModelLoadError, as a 400's reason, when neither the entry nor the weights
        have them)."""
        got = self._logits
        if isinstance(got, str):
            raise ModelLoadError(got, model=self.model.name)
        return got[0], got[1]

    def plan_zero_shot(self, images: Sequence[bytes | str], labels: Sequence[str], *, template: str | None = None,
                       param: str = "images") -> Work[ZeroShotResult]:
        """Each image against the labels as transformers' zero-shot-image-classification pipeline scores them (its
        decoding route: EXIF applied, alpha dropped)."""
        labels = list(labels)
        if not labels or len(labels) > self.max_labels:
            raise InputError(f"`candidate_labels`: 1 to {self.max_labels} labels, got {len(labels)}",
                             param="candidate_labels")
        tpl = template if template is not None else self.template
        if "{}" not in tpl:
            raise InputError("`hypothesis_template` must contain {} (where the label goes)",
                             param="hypothesis_template")
        try:
            scale, bias = self.logit_params()
        except ModelLoadError as exc:
            raise InputError(f"zero-shot is not available for model '{self.model.name}': {exc.message}",
                             param="model") from None
        timing = Timing()
        rows: list[Any] = self.image_rows(images, "pipeline", param)
        n = len(rows)
        rows += self._text_rows([tpl.format(label) for label in labels], timing)
        costs = [self.image_cost] * n + [len(r) for r in rows[n:]]

        def finish(outs: list[Any]) -> ZeroShotResult:
            texts = np.stack(outs[n:])
            ranked, logits = [], []
            for image in outs[:n]:
                lg, probs = clip.zero_shot(image, texts, self.spec.kind, scale, bias)
                order = np.argsort(-probs, kind="stable")
                ranked.append([(labels[k], float(probs[k])) for k in order])
                logits.append(lg)
            return ZeroShotResult(ranked, logits, timing)

        return Work(rows, costs, finish, timing)


def trial_feeds(graph: Any, aux: Any) -> dict[str, Any] | None:
    """The load's trial forward on the vision tower: one image of the processor's size."""
    cfg = ip.ImageConfig.of(aux.get("preprocessor_config.json") or {})
    return {"pixel_values": np.zeros((1, 3, cfg.height, cfg.width), dtype=np.float32)}
