"""CLIP and SigLIP (`kind: image_text`): zero-shot image classification on `POST /classify/zero-shot-image` and as
the Hugging Face task on `POST /models/{name}`; image and text vectors on the embedding routes the family serves
(`/v1/embeddings` with infinity's `modality: image`). Images come as base64 or data URIs, never as URLs."""

from __future__ import annotations

from typing import Annotated, Any

from aiohttp import web
from msgspec import Meta

from ...errors import InputError
from ...pipelines import imageprep as ip
from ...pipelines.image_text import ImageTextPipeline
from ..errors import RequestValidationError
from ..schemas import Model, Op, Request, Response, TextOptions
from .common import Call, begin, check_count, hf_parameters, json_response, texts_of, truncation_headers


class ZeroShotImageRequest(Request):
    """transformers' zero-shot-image-classification pipeline as a request."""

    image: Annotated[str | list[str], Meta(description="An image, or images: base64 or data URIs")]
    candidate_labels: list[str]
    hypothesis_template: Annotated[str | None, Meta(description=(
        "The label's prompt, {} for the label (default: the model's zero_shot_template)"))] = None
    model: Model = None


class LabelScore(Response):
    label: str
    score: float


OPS: tuple[Op, ...] = (
    Op(("/classify/zero-shot-image",), "POST", "Zero-shot image classification (CLIP's softmax, SigLIP's sigmoid): "
       "each label's score, best first", "image_text", ZeroShotImageRequest,
       list[LabelScore | list[LabelScore]]),
)

routes = web.RouteTableDef()
BENCH = {"/classify/zero-shot-image": lambda texts: {"image": _DOT, "candidate_labels": texts[:4] or ["x"]}}
_DOT = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC")  # 1x1 PNG


def images_of(call: Call[Any], value: str | list[str], key: str) -> list[bytes | str]:
    """A request's images as bytes (InputError naming the item)."""
    items = [value] if isinstance(value, str) else value
    check_count(call, key, len(items))
    pipe = call.pipeline(ImageTextPipeline)
    out = []
    for i, item in enumerate(items):
        try:
            out.append(ip.image_item(item, pipe.limits))
        except ip.ImageInputError as exc:
            where = key if isinstance(value, str) else f"{key}[{i}]"
            raise InputError(f"{where}: {exc}", param=where) from None
    return out


async def zero_shot(call: Call[Any], value: str | list[str], labels: list[str], template: str | None,
                    key: str) -> web.Response:
    images = images_of(call, value, key)
    pipe = call.pipeline(ImageTextPipeline)
    res = await call.infer(pipe.plan_zero_shot, images, labels, template=template, param=key)
    out = [[LabelScore(label=label, score=score) for label, score in ranked] for ranked in res.labels]
    return json_response(out[0] if isinstance(value, str) else out, truncation_headers(res.truncated))


@routes.post("/classify/zero-shot-image")
async def classify_image(request: web.Request) -> web.Response:
    call = await begin(request, "image_text", ZeroShotImageRequest)
    req = call.req
    return await zero_shot(call, req.image, req.candidate_labels, req.hypothesis_template, "image")


class HfImageParameters(TextOptions):
    candidate_labels: list[str] | None = None
    hypothesis_template: str | None = None


async def hf_task(call: Call[Any], inputs: Any, params: dict[str, Any]) -> web.Response:
    """The Hugging Face Inference API for an image_text model: zero-shot-image-classification (`inputs`: an image
    as base64, `parameters.candidate_labels`) → [{label, score}] best first; feature-extraction (`inputs`: a text or
    texts) → their vectors."""
    opts = hf_parameters(call, params, HfImageParameters)
    if opts.candidate_labels is not None:
        if not isinstance(inputs, str):
            raise RequestValidationError("zero-shot-image-classification takes one image as `inputs`", param="inputs")
        return await zero_shot(call, inputs, opts.candidate_labels, opts.hypothesis_template, "inputs")
    if not (isinstance(inputs, str) or (isinstance(inputs, list) and all(isinstance(t, str) for t in inputs))):
        raise RequestValidationError("an image_text model answers feature-extraction (`inputs`: a text or texts) "
                                     "and zero-shot-image-classification", param="inputs")
    pipe = call.pipeline(ImageTextPipeline)
    res = await call.infer(pipe.plan, texts_of(call, inputs, "inputs"), param="inputs")
    return json_response(res.vectors if isinstance(inputs, list) else res.vectors[0])
