"""A model of several graphs (Family.graphs): the main graph preferred over model.onnx, the other towers fetched
beside it and loaded with the main graph's lanes, each lane's forward reaching its own session of every tower
(LoadedModel.tower); a tower the folder lacks is a load error naming it. Run with tiny-clip's vision and text
towers under a family registered by the test."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from rsinfer_cli import families
from rsinfer_cli.errors import ModelLoadError
from rsinfer_cli.pipelines.base import RowPipeline, Work

pytestmark = pytest.mark.shared
pytest.importorskip("PIL")


class TwoTowers(RowPipeline):
    """Rows are ("text", ids) or ("image", pixels); a forward runs each kind on its tower of the row's lane."""

    kind = "towers_test"

    def forward(self, session: Any, rows: Sequence[Any]) -> list[Any]:
        out: list[Any] = [None] * len(rows)
        images = [i for i, r in enumerate(rows) if r[0] == "image"]
        texts = [i for i, r in enumerate(rows) if r[0] == "text"]
        if images:
            got = self.model.run(session, {"pixel_values": np.stack([rows[i][1] for i in images])}, ["image_embeds"])
            for j, i in enumerate(images):
                out[i] = got["image_embeds"][j]
        if texts:
            tower = self.model.tower("text_model.onnx", session)
            width = max(len(rows[i][1]) for i in texts)
            ids = np.full((len(texts), width), 49407, dtype=np.int64)
            for j, i in enumerate(texts):
                ids[j, :len(rows[i][1])] = rows[i][1]
            got = tower.run(["text_embeds"], {"input_ids": ids})
            for j, i in enumerate(texts):
                out[i] = got[0][j]
        return out

    def plan_both(self, rows: list[tuple[str, Any]]) -> Work[list[Any]]:
        return Work(rows, [1] * len(rows), lambda outs: list(outs), None)


@pytest.fixture
def family():
    fam = families.Family(kind="towers_test", summary="two towers (test)", pipeline=TwoTowers,
                          graphs=("vision_model.onnx", "text_model.onnx"), aux_files=("preprocessor_config.json",))
    families.register(fam)
    yield fam
    families.unregister("towers_test")


def test_both_towers_run_on_each_lane(family, shared_models):
    import rsinfer_cli
    from rsinfer_cli.pipelines import clip
    from rsinfer_cli.pipelines import imageprep as ip

    folder = shared_models / "tiny-clip"
    ref = json.loads((folder / "reference.json").read_text(encoding="utf-8"))
    cfg = ip.ImageConfig.of(json.loads((folder / "preprocessor_config.json").read_text(encoding="utf-8")))
    with rsinfer_cli.load(folder, kind="towers_test", threads=2) as model:
        loaded = model._loaded
        assert loaded.resolved.graph_file == "onnx/vision_model.onnx"
        assert set(loaded.towers) == {"text_model.onnx"}
        assert len(loaded.towers["text_model.onnx"].sessions) == len(loaded.sessions)
        rows = [("image", ip.preprocess((folder / im["file"]).read_bytes(), cfg)) for im in ref["images"][:3]]
        rows += [("text", t["input_ids"]) for t in ref["texts"][:3]]
        pipe = model.pipeline
        outs = pipe.run(pipe.plan_both(rows))
    for got, im in zip(outs[:3], ref["images"][:3], strict=True):
        assert np.abs(got - im["image_embeds"]).max() <= 1e-4
    for got, t in zip(outs[3:], ref["texts"][:3], strict=True):
        assert np.abs(got - t["text_embeds"]).max() <= 1e-4
    assert clip.OUTPUTS["clip"] == ("text_embeds", "image_embeds")


def test_a_missing_tower_is_a_load_error(family, shared_models, tmp_path):
    import rsinfer_cli

    src = shared_models / "tiny-clip"
    folder = tmp_path / "clip"
    for f in src.rglob("*"):
        if f.is_file() and f.name != "text_model.onnx":
            (folder / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            (folder / f.relative_to(src)).symlink_to(f)
    with pytest.raises(ModelLoadError, match="needs text_model.onnx beside onnx/vision_model.onnx"):
        rsinfer_cli.load(folder, kind="towers_test")
