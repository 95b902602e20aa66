"""The Hugging Face Inference API shapes: `POST /models/{name}` answers the task of that model's family, so
`huggingface_hub.InferenceClient(model="http://host:port/models/NAME")` works unmodified. `POST /` does the same for
the one model of a single-model config (TEI's rule). Each family declares its task in the registry (`hf_task`, in
its own routes module, e.g. feature-extraction, text-classification, token-classification); this module only
dispatches and names no family, so each family's own request rules apply here as on its own routes.
"""

from __future__ import annotations

from aiohttp import web

from ... import families
from ...errors import InputError
from ..schemas import HfRequest
from .common import RECORD, STATE, Call, decode

routes = web.RouteTableDef()


async def _answer(request: web.Request, name: str) -> web.Response:
    """The task of the model's family (its `hf_task`, declared in the family registry)."""
    state = request.app[STATE]
    if name not in state.registry.entries:
        from ...errors import ModelNotFound

        raise ModelNotFound(f"model '{name}' not found", param="model", model=name)
    kind = state.registry.entries[name][0].kind
    family = families.get(kind)
    task = family.hf_handler()
    if task is None:
        served = ", ".join(f.kind for f in families.all_families() if f.hf_task is not None)
        raise InputError(f"model '{name}' is a {kind} model; the Hugging Face task routes serve {served} models",
                         param="model")
    call = Call(state, decode(await request.read(), HfRequest), state.registry.get(name, kind), request[RECORD])
    response: web.Response = await task(call, call.req.inputs, call.req.parameters or {})
    return response


@routes.post("/models/{name}")
async def hf_model(request: web.Request) -> web.Response:
    return await _answer(request, request.match_info["name"])


@routes.post("/")
async def hf_root(request: web.Request) -> web.Response:
    """The one model of a single-model config; with several, say where to go."""
    entries = request.app[STATE].registry.entries
    if len(entries) != 1:
        raise InputError(f"several models are served ({', '.join(entries)}): POST to /models/{{name}}",
                         param="model")
    return await _answer(request, next(iter(entries)))
