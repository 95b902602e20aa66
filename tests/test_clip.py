"""CLIP and SigLIP end to end over their own graphs (pipelines/clip.py with pipelines/imageprep.py): token ids
exactly as transformers' processors make them, text and image vectors within 1e-4 of transformers', zero-shot
logits and probabilities (softmax for CLIP, sigmoid for SigLIP, logit_scale/logit_bias from the weights) within
1e-4 of its zero-shot-image-classification pipeline."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("PIL")

from rsinfer_cli.errors import ModelLoadError  # noqa: E402
from rsinfer_cli.pipelines import clip  # noqa: E402
from rsinfer_cli.pipelines import imageprep as ip  # noqa: E402

from synth import STYLES, xenova_folder  # noqa: E402

pytestmark = pytest.mark.shared
TOL = 1e-4


@pytest.fixture(scope="module", params=["tiny-clip", "tiny-siglip"])
def model(request, shared_models):
    import onnxruntime as ort
    from tokenizers import Tokenizer

    folder = shared_models / request.param
    ref = json.loads((folder / "reference.json").read_text(encoding="utf-8"))
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    spec = clip.TextSpec.of(json.loads((folder / "config.json").read_text(encoding="utf-8")), tok)
    text = ort.InferenceSession(str(folder / "onnx" / "text_model.onnx"), providers=["CPUExecutionProvider"])
    vision = ort.InferenceSession(str(folder / "onnx" / "vision_model.onnx"), providers=["CPUExecutionProvider"])
    cfg = ip.ImageConfig.of(json.loads((folder / "preprocessor_config.json").read_text(encoding="utf-8")))
    tname, iname = clip.OUTPUTS[spec.kind]

    def texts(items):
        return text.run([tname], {"input_ids": clip.text_rows(tok, spec, items)})[0]

    def images(files, route="processor"):
        px = np.stack([ip.preprocess((folder / f).read_bytes(), cfg, route=route) for f in files])
        return vision.run([iname], {"pixel_values": px})[0]

    return folder, ref, tok, spec, texts, images


def test_token_ids_are_the_processors(model):
    _, ref, tok, spec, _, _ = model
    rows = clip.text_rows(tok, spec, [t["text"] for t in ref["texts"]])
    for t, row in zip(ref["texts"], rows, strict=True):
        want = t["input_ids"]
        assert row[:len(want)].tolist() == want, t["text"][:30]
        assert (row[len(want):] == spec.pad_id).all()
    assert rows.shape[1] == (spec.max_len if spec.kind == "siglip" else max(len(t["input_ids"]) for t in ref["texts"]))
    assert any(t["truncated"] for t in ref["texts"])


def test_text_and_image_vectors_are_transformers(model):
    _, ref, _, _, texts, images = model
    got = texts([t["text"] for t in ref["texts"]])
    assert np.abs(got - np.array([t["text_embeds"] for t in ref["texts"]])).max() <= TOL
    got = images([im["file"] for im in ref["images"]])
    assert np.abs(got - np.array([im["image_embeds"] for im in ref["images"]])).max() <= TOL
    for im in ref["images"]:          # where the pipeline route decodes otherwise, its own vector
        if "image_embeds" in im["pipeline_path"]:
            assert np.abs(images([im["file"]], "pipeline")[0] - im["pipeline_path"]["image_embeds"]).max() <= TOL


def test_zero_shot_is_the_pipelines(model):
    folder, ref, _, spec, texts, images = model
    scale, bias = clip.logit_params(folder, spec.kind, {})
    assert abs(scale - ref["settings"]["logit_scale"]) <= 1e-6
    for z in ref["zero_shot"]:
        im = next(x for x in ref["images"] if x["name"] == z["image"])
        logits, probs = clip.zero_shot(images([im["file"]], "pipeline")[0], texts(z["sequences"]), spec.kind, scale,
                                       bias)
        assert np.abs(logits - z["logits_per_image"]).max() <= TOL, z["labels"]
        assert np.abs(probs - z["probabilities"]).max() <= TOL, z["labels"]


def test_logit_params_from_the_entry_or_refused(tmp_path, shared_models):
    assert clip.logit_params(tmp_path, "siglip", {"logit_scale": 1.0, "logit_bias": -2.0}) == (1.0, -2.0)
    with pytest.raises(ModelLoadError, match="no model.safetensors"):
        clip.logit_params(tmp_path, "clip", {})
    with pytest.raises(ModelLoadError, match="not CLIP or SigLIP"):
        clip.TextSpec.of({"model_type": "bert"}, None)


# ---------------------------------------------------------------- the scalars of a combined graph (Xenova's layout)

@pytest.mark.parametrize("style", STYLES)
def test_logit_params_from_a_combined_graph(model, style, tmp_path):
    import onnxruntime as ort

    folder, ref, kind = xenova_folder(model[0], tmp_path / "m", style)
    scale, bias, source = clip.find_logit_params(folder, kind, {})
    assert source == "onnx/model.onnx"
    assert abs(scale - ref["settings"]["logit_scale"]) <= 1e-6
    assert abs(bias - ref["settings"].get("logit_bias", 0.0)) <= 1e-6
    # the graph computes what rsinfer computes with what it read off it
    rng = np.random.default_rng(3)
    t, i = rng.standard_normal((5, 16), dtype=np.float32), rng.standard_normal((2, 16), dtype=np.float32)
    sess = ort.InferenceSession(str(folder / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    want = sess.run(["logits_per_image"], {"text_embeds": t, "image_embeds": i})[0]
    got = np.stack([clip.zero_shot(row, t, kind, scale, bias)[0] for row in i])
    assert np.abs(got - want).max() <= 1e-5
    # the entry wins over the graph, each value on its own
    assert clip.find_logit_params(folder, kind, {"logit_scale": 1.5})[:2] == (1.5, pytest.approx(bias, abs=1e-6))


def test_graphs_without_the_scalars_say_why(tmp_path):
    from onnx import TensorProto, helper

    (tmp_path / "onnx").mkdir()
    f = TensorProto.FLOAT
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["logits_per_image"])], "g",
                              [helper.make_tensor_value_info(n, f, [2, 2]) for n in "ab"],
                              [helper.make_tensor_value_info("logits_per_image", f, [2, 2])])
    import onnx

    onnx.save(helper.make_model(graph), str(tmp_path / "onnx" / "model.onnx"))
    with pytest.raises(ModelLoadError, match=r"no model.safetensors; onnx/model.onnx: its logits are not"):
        clip.logit_params(tmp_path, "clip", {})
    (tmp_path / "onnx" / "model.onnx").write_bytes(b"\x3a\xff\xff\xff\xff\x0f")     # graph field past the end
    with pytest.raises(ModelLoadError, match="model.onnx: "):
        clip.logit_params(tmp_path, "clip", {})
    (tmp_path / "onnx" / "model.onnx").unlink()
    with pytest.raises(ModelLoadError, match="no combined graph"):
        clip.logit_params(tmp_path, "siglip", {"logit_scale": 1.0})
