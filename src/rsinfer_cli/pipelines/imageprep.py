"""Images as a CLIP or SigLIP vision tower sees them: decoded, converted to RGB, resized, cropped, rescaled and
normalised exactly as transformers' image processors do (their Pillow backend), every constant read from the
folder's `preprocessor_config.json`.

- Decoding, two routes, as transformers has them:
  - `processor` (`processor(images=Image.open(f))`, the model cards' call): an image with an alpha band or a
    transparency entry (RGBA, LA, PA, P with a transparent index) is alpha-composited onto white; any other mode
    goes through `convert("RGB")`; EXIF orientation is not applied.
  - `pipeline` (the zero-shot-image-classification pipeline's `load_image`): `ImageOps.exif_transpose`, then
    `convert("RGB")` (an alpha band is dropped), then the processor's conversion (a palette's transparent index,
    now an RGB colour key, turns white).
- Resize: CLIP's `size.shortest_edge` (the short side to S, the long side `int(S * long / short)`), or
  `size.height` × `size.width` exactly (SigLIP); Pillow's `resize` with the config's `resample` and no reducing gap,
  on the 8-bit RGB image. Center crop `crop_size`: top = (H - h) // 2, left = (W - w) // 2.
- Rescale in float64 (`uint8 * rescale_factor`), then float32; normalise `(x - mean) / std` in float32; channels
  first.
- Limits before any pixel is decoded: the encoded size, and the pixel count the header declares (a few-KB PNG can
  declare 40,000 × 40,000); only PNG, JPEG, WebP and GIF (its first frame) are read.

Anything the config asks that is not computed here is refused with its name (ImageConfigError).
"""

from __future__ import annotations

import functools
import io
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
RESAMPLE = {0: "NEAREST", 1: "LANCZOS", 2: "BILINEAR", 3: "BICUBIC", 4: "BOX", 5: "HAMMING"}
PROCESSORS = ("CLIPImageProcessor", "CLIPFeatureExtractor", "SiglipImageProcessor", "Siglip2ImageProcessor")
KNOWN_KEYS = {"do_resize", "size", "resample", "do_center_crop", "crop_size", "do_rescale", "rescale_factor",
              "do_normalize", "image_mean", "image_std", "do_convert_rgb", "image_processor_type", "processor_class",
              "feature_extractor_type", "_valid_processor_keys"}


class ImageConfigError(ValueError):
    """A preprocessor_config.json asking for something not computed here (the message names the key)."""


class ImageInputError(ValueError):
    """An image that cannot be read within the limits (the message says why; the caller names the item)."""


@dataclass(frozen=True)
class ImageConfig:
    """What preprocessing reads of preprocessor_config.json (both its current and legacy formats)."""

    shortest_edge: int | None        # CLIP: the short side's length after resizing
    height: int                      # the tensor's height and width
    width: int
    resize_hw: tuple[int, int] | None  # SigLIP: resize to exactly this (no crop)
    resample: int
    crop: bool
    rescale: float | None
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None
    convert_rgb: bool

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> ImageConfig:
        _check_known(raw)
        resample = int(raw.get("resample", 3))
        if resample not in RESAMPLE:
            raise ImageConfigError(f"preprocessor_config.json: resample {resample} is not a Pillow filter")
        shortest, resize_hw, do_crop, (h, w) = _geometry(raw)
        rescale = float(raw.get("rescale_factor", 1 / 255)) if raw.get("do_rescale", True) else None
        mean, std = _normalisation(raw)
        return cls(shortest, h, w, resize_hw, resample, do_crop, rescale, mean, std,
                   bool(raw.get("do_convert_rgb", True)))


def _check_known(raw: Mapping[str, Any]) -> None:
    """The processor type and every key are ones computed here."""
    unknown = sorted(k for k in raw if k not in KNOWN_KEYS and not k.startswith("_") and raw[k] not in (None, False))
    kind = raw.get("image_processor_type") or raw.get("feature_extractor_type")
    if kind is not None and kind not in PROCESSORS:
        raise ImageConfigError(f"preprocessor_config.json: image_processor_type {kind!r} is not one rsinfer "
                               f"computes ({', '.join(PROCESSORS)})")
    if unknown:
        raise ImageConfigError(f"preprocessor_config.json: {', '.join(unknown)} asks for preprocessing rsinfer "
                               "does not compute")
    if raw.get("do_resize", True) is False:
        raise ImageConfigError("preprocessor_config.json: do_resize false: images of any size cannot make one fixed "
                               "tensor")


def _geometry(raw: Mapping[str, Any]) -> tuple[int | None, tuple[int, int] | None, bool, tuple[int, int]]:
    """(shortest edge, exact resize, whether to crop, the tensor's height and width)."""
    size, crop = raw.get("size", 224), raw.get("crop_size")
    do_crop = bool(raw.get("do_center_crop", crop is not None))
    shortest, resize_hw = _size(size)
    if shortest is not None:
        if not do_crop:
            raise ImageConfigError("preprocessor_config.json: a shortest_edge resize without do_center_crop gives "
                                   "images of different sizes")
        return shortest, None, True, _hw(crop if crop is not None else shortest, "crop_size")
    assert resize_hw is not None
    return None, resize_hw, do_crop, _hw(crop, "crop_size") if do_crop and crop is not None else resize_hw


def _normalisation(raw: Mapping[str, Any]) -> tuple[tuple[float, ...] | None, tuple[float, ...] | None]:
    if not raw.get("do_normalize", True):
        return None, None
    mean = tuple(float(x) for x in raw.get("image_mean", ()))
    std = tuple(float(x) for x in raw.get("image_std", ()))
    if len(mean) != 3 or len(std) != 3:
        raise ImageConfigError("preprocessor_config.json: do_normalize needs three image_mean and image_std")
    return mean, std


def _size(size: Any) -> tuple[int | None, tuple[int, int] | None]:
    if isinstance(size, int):                        # the legacy format: "size": 224 is the shortest edge
        return size, None
    if isinstance(size, Mapping):
        if "shortest_edge" in size:
            return int(size["shortest_edge"]), None
        if "height" in size and "width" in size:
            return None, (int(size["height"]), int(size["width"]))
    raise ImageConfigError(f"preprocessor_config.json: size {size!r} is neither shortest_edge nor height and "
                           "width")


def _hw(value: Any, key: str) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    if isinstance(value, Mapping) and "height" in value and "width" in value:
        return int(value["height"]), int(value["width"])
    raise ImageConfigError(f"preprocessor_config.json: {key} {value!r} is not a size")


@dataclass(frozen=True)
class Limits:
    max_bytes: int = 20 << 20            # encoded
    max_pixels: int = 50_000_000         # declared by the header, width × height


def open_image(data: bytes, limits: Limits) -> Any:
    """The image `data` holds, its header checked against the limits before any pixel is decoded."""
    from PIL import Image, UnidentifiedImageError

    if len(data) > limits.max_bytes:
        raise ImageInputError(f"{len(data)} bytes; at most {limits.max_bytes}")
    try:
        img = Image.open(io.BytesIO(data), formats=FORMATS)
    except Image.DecompressionBombError as exc:      # Pillow's own limit, past ours: the header's size is in it
        raise ImageInputError(f"{exc}; at most {limits.max_pixels} pixels (a decompression bomb is refused before "
                              "decoding)") from None
    except UnidentifiedImageError:
        raise ImageInputError(f"not an image in a format read here ({', '.join(FORMATS)})") from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise ImageInputError(f"cannot read the image: {exc}") from None
    w, h = img.size
    if w * h > limits.max_pixels:
        raise ImageInputError(f"{w} x {h} pixels; at most {limits.max_pixels} (a decompression bomb is refused "
                              "before decoding)")
    if w < 1 or h < 1:
        raise ImageInputError(f"an image of {w} x {h} pixels")
    return img


def to_rgb(img: Any, route: str = "processor") -> Any:
    """The decoded image as 8-bit RGB by transformers' `route` (processor | pipeline)."""
    from PIL import Image, ImageOps

    try:
        if route == "pipeline":    # load_image, then the processor's own conversion: a palette's transparent index
            img = ImageOps.exif_transpose(img).convert("RGB")      # is now an RGB colour key, which turns white
        if img.mode in ("RGBA", "LA", "PA") or "transparency" in img.info:
            rgba = img.convert("RGBA")
            white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            return Image.alpha_composite(white, rgba).convert("RGB")
        return img.convert("RGB")
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise ImageInputError(f"cannot decode the image: {exc}") from None


def pixels(rgb: Any, cfg: ImageConfig) -> np.ndarray:
    """An RGB image → float32 [3, height, width] as the processor makes it."""
    from PIL import Image

    resample = Image.Resampling(cfg.resample)
    if cfg.shortest_edge is not None:
        w, h = rgb.size
        short, long = (w, h) if w <= h else (h, w)
        new_long = int(cfg.shortest_edge * long / short)
        size = (cfg.shortest_edge, new_long) if w <= h else (new_long, cfg.shortest_edge)
    else:
        assert cfg.resize_hw is not None
        size = (cfg.resize_hw[1], cfg.resize_hw[0])
    resized = rgb.resize(size, resample, reducing_gap=None)
    arr = np.asarray(resized, dtype=np.uint8)
    if cfg.crop:
        top, left = (arr.shape[0] - cfg.height) // 2, (arr.shape[1] - cfg.width) // 2
        arr = _crop(arr, top, left, cfg.height, cfg.width)
    lut = _table(cfg.rescale, cfg.mean, cfg.std)
    out: np.ndarray = lut[np.arange(3)[:, None, None], arr.transpose(2, 0, 1)]    # [3, H, W], one pass
    return out


@functools.lru_cache(maxsize=16)
def _table(rescale: float | None, mean: tuple[float, ...] | None, std: tuple[float, ...] | None) -> np.ndarray:
    """Each 8-bit value of each channel through the processor's arithmetic - rescale in float64, then float32,
    (x - mean) / std in float32 - as a [3, 256] table: the same operations on the same values, so looking a pixel up
    gives the bits computing it would."""
    x = np.tile(np.arange(256, dtype=np.uint8), (3, 1))
    v = (x.astype(np.float64) * rescale).astype(np.float32) if rescale is not None else x.astype(np.float32)
    if mean is not None and std is not None:
        v = (v - np.array(mean, dtype=np.float32)[:, None]) / np.array(std, dtype=np.float32)[:, None]
    out: np.ndarray = np.ascontiguousarray(v, dtype=np.float32)
    return out


def _crop(arr: np.ndarray, top: int, left: int, h: int, w: int) -> np.ndarray:
    """transformers' center_crop: an image smaller than the crop is padded with zeros around it first."""
    if top >= 0 and left >= 0:
        return arr[top:top + h, left:left + w]
    ph, pw = max(h, arr.shape[0]), max(w, arr.shape[1])
    padded = np.zeros((ph, pw, arr.shape[2]), dtype=arr.dtype)
    t, lft = (ph - arr.shape[0]) // 2, (pw - arr.shape[1]) // 2
    padded[t:t + arr.shape[0], lft:lft + arr.shape[1]] = arr
    top, left = (ph - h) // 2, (pw - w) // 2
    return padded[top:top + h, left:left + w]


def preprocess(data: bytes, cfg: ImageConfig, limits: Limits | None = None, route: str = "processor") -> np.ndarray:
    """Encoded image bytes → the vision tower's float32 [3, H, W] (ImageInputError naming what is wrong)."""
    return pixels(to_rgb(open_image(data, limits or Limits()), route), cfg)


def is_url(item: str) -> bool:
    return item.strip()[:8].lower().startswith(("http://", "https:/"))


def image_item(item: Any, limits: Limits) -> bytes | str:
    """An image as a request gives it: base64 or a data URI (`data:image/png;base64,...`) → its bytes; an http(s)
    URL → the URL, which only a model whose entry allows its host fetches (fetch_image)."""
    if isinstance(item, str) and is_url(item):
        return item.strip()
    return image_bytes(item, limits)


def image_bytes(item: Any, limits: Limits) -> bytes:
    """An image as base64 or a data URI → its bytes (ImageInputError saying what is wrong)."""
    import base64
    import binascii

    if not isinstance(item, str):
        raise ImageInputError(f"an image is a base64 string or a data URI, got {type(item).__name__}")
    text = item.strip()
    if is_url(text):
        raise ImageInputError("image URLs are not fetched here: send the image as base64 or a data URI")
    if text[:5].lower() == "data:":
        head, sep, text = text.partition(",")
        if not sep or ";base64" not in head.lower():
            raise ImageInputError("a data URI must be base64 (data:image/png;base64,...)")
    if len(text) > limits.max_bytes * 4 // 3 + 4:
        raise ImageInputError(f"more than {limits.max_bytes} bytes")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ImageInputError("not valid base64") from None


@dataclass(frozen=True)
class UrlPolicy:
    """Which image URLs a model fetches: none unless its entry names hosts (a server that fetches what a request
    names can be made to reach hosts it should not)."""

    hosts: tuple[str, ...] = ()
    timeout_s: float = 10.0


def fetch_image(url: str, policy: UrlPolicy, limits: Limits) -> bytes:
    """The bytes at `url`: http(s), a host of the policy's, no redirect, at most limits.max_bytes, within the timeout
    (ImageInputError saying which rule it broke)."""
    import urllib.error
    import urllib.request
    from urllib.parse import urlsplit

    if not policy.hosts:
        raise ImageInputError("image URLs are off for this model (its image_url_hosts names none): send the image "
                              "as base64 or a data URI")
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("http", "https") or host not in {h.lower() for h in policy.hosts}:
        raise ImageInputError(f"host {host or '?'!r} is not in the model's image_url_hosts")

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            raise ImageInputError("the image URL redirects; a redirect is not followed")

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), NoRedirect())
    try:
        with opener.open(url, timeout=policy.timeout_s) as resp:
            data: bytes = resp.read(limits.max_bytes + 1)
    except ImageInputError:
        raise
    except urllib.error.HTTPError as exc:
        raise ImageInputError(f"fetching the image URL: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ImageInputError(f"fetching the image URL failed: {reason}") from None
    if len(data) > limits.max_bytes:
        raise ImageInputError(f"the image URL holds more than {limits.max_bytes} bytes")
    return data
