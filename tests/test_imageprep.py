"""Image preprocessing (pipelines/imageprep.py) against transformers' processors for tiny-clip and tiny-siglip:
every shared image by both of transformers' decoding routes, bit-exact in RGB and in float32 pixel values; the
legacy preprocessor_config format; the configs it refuses; and the inputs it refuses before decoding."""

from __future__ import annotations

import hashlib
import json
import struct
import zlib

import numpy as np
import pytest

pytest.importorskip("PIL")

from rsinfer_cli.pipelines import imageprep as ip  # noqa: E402

pytestmark = pytest.mark.shared


@pytest.fixture(scope="module", params=["tiny-clip", "tiny-siglip"])
def model(request, shared_models):
    folder = shared_models / request.param
    return (folder, ip.ImageConfig.of(json.loads((folder / "preprocessor_config.json").read_text(encoding="utf-8"))),
            json.loads((folder / "reference.json").read_text(encoding="utf-8")))


def _sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def test_every_image_by_both_routes_is_the_processors(model):
    folder, cfg, ref = model
    checked = 0
    for im in ref["images"]:
        data = (folder / im["file"]).read_bytes()
        for route in ("processor", "pipeline"):
            want = im[f"{route}_path"]
            want = im["processor_path"] if want.get("same_as_processor_path") else want
            rgb = np.asarray(ip.to_rgb(ip.open_image(data, ip.Limits()), route), dtype=np.uint8)
            assert _sha(rgb) == want["rgb_sha256"], (im["name"], route)
            x = ip.preprocess(data, cfg, route=route)
            assert x.shape == (3, cfg.height, cfg.width) and x.dtype == np.float32
            assert _sha(x) == want["pixel_values"]["sha256_float32"], (im["name"], route)
            checked += 1
    assert checked == 20
    stored = np.load(folder / "reference_pixel_values.npy")
    firsts = [ip.preprocess((folder / im["file"]).read_bytes(), cfg) for im in ref["images"]
              if im["name"] in ("gradient_rgb", "rgba_alpha")]
    assert np.array_equal(np.stack(firsts), stored)


def test_the_legacy_config_format_means_the_same(shared_models):
    """Xenova/clip-vit-base-patch32's file: `size: 224`, `crop_size: 224`, feature_extractor_type, and no
    do_rescale / rescale_factor / do_convert_rgb (transformers' defaults)."""
    folder = shared_models / "tiny-clip"
    current = json.loads((folder / "preprocessor_config.json").read_text(encoding="utf-8"))
    legacy = {"crop_size": 224, "do_center_crop": True, "do_normalize": True, "do_resize": True,
              "feature_extractor_type": "CLIPFeatureExtractor", "image_mean": current["image_mean"],
              "image_std": current["image_std"], "resample": 3, "size": 224}
    data = (folder / "images" / "portrait_300x500.jpg").read_bytes()
    assert np.array_equal(ip.preprocess(data, ip.ImageConfig.of(legacy)),
                          ip.preprocess(data, ip.ImageConfig.of(current)))


@pytest.mark.parametrize(("change", "said"), [
    ({"image_processor_type": "ViTImageProcessor"}, "image_processor_type 'ViTImageProcessor' is not one"),
    ({"do_pad": True}, "do_pad asks for preprocessing rsinfer does not compute"),
    ({"do_resize": False}, "do_resize false"),
    ({"do_center_crop": False}, "without do_center_crop"),
    ({"resample": 9}, "resample 9 is not a Pillow filter"),
    ({"image_mean": [0.5]}, "needs three image_mean"),
])
def test_configs_it_does_not_compute_are_refused(shared_models, change, said):
    raw = json.loads((shared_models / "tiny-clip" / "preprocessor_config.json").read_text(encoding="utf-8"))
    with pytest.raises(ip.ImageConfigError, match=said):
        ip.ImageConfig.of({**raw, **change})


def _png_header_only(w: int, h: int) -> bytes:
    """A PNG whose header declares w x h with almost no pixel data: a decompression bomb's shape."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + \
        chunk(b"IEND", b"")


def test_bad_images_are_refused_before_decoding(shared_models):
    cfg = ip.ImageConfig.of(json.loads((shared_models / "tiny-clip" / "preprocessor_config.json").read_text(
        encoding="utf-8")))
    bomb = _png_header_only(40_000, 40_000)
    assert len(bomb) < 200
    with pytest.raises(ip.ImageInputError, match="(1600000000|40000 x 40000) pixels.*refused before decoding"):
        ip.preprocess(bomb, cfg)
    with pytest.raises(ip.ImageInputError, match="9000 x 9000 pixels; at most 50000000"):
        ip.preprocess(_png_header_only(9_000, 9_000), cfg)
    whole = next(p for p in (shared_models / "tiny-clip" / "images").iterdir() if p.suffix == ".png").read_bytes()
    with pytest.raises(ip.ImageInputError, match="cannot decode the image"):
        ip.preprocess(whole[: len(whole) // 2], cfg)
    svg = b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect width="10" height="10"/></svg>'
    with pytest.raises(ip.ImageInputError, match="not an image in a format read here"):
        ip.preprocess(svg, cfg)
    with pytest.raises(ip.ImageInputError, match="bytes; at most 100"):
        ip.preprocess(whole, cfg, ip.Limits(max_bytes=100))
