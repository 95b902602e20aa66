"""What every inference route starts with: the parsed body, the model it names (or its kind's default), and
how to answer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ...jsonio import dumps
from ..request import Body, json_body
from ..state import STATE, ServerState

INLINE_TOKENIZE_BYTES = 2048  # a body this small tokenizes faster on the loop than via a thread and back


@dataclass
class Call:
    state: ServerState
    body: Body
    model: Any
    small: bool

    @property
    def pipe(self) -> Any:
        return self.state.pipelines[self.model.name]

    async def infer(self, plan: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await self.state.infer(self.model, plan, *args, inline=self.small, **kwargs)


async def begin(request: web.Request, kind: str, named: bool = True) -> Call:
    """Parse the body and pick the model: the one it names, else the default of `kind` (`named=False`: always
    the default, for shapes without a `model` field)."""
    state = request.app[STATE]
    body = Body(await json_body(request))
    model = state.registry.get(body.str("model", None) if named else None, kind)
    small = request.content_length is not None and request.content_length <= INLINE_TOKENIZE_BYTES
    return Call(state, body, model, small)


def truncation_direction(body: Body) -> str:
    """TEI's `truncation_direction`: right (default) or left, in either case."""
    from ...errors import InputError

    direction = body.str("truncation_direction", "right").lower()
    if direction not in ("right", "left"):
        raise InputError(f"`truncation_direction` must be \"right\" or \"left\", got {direction!r}",
                         param="truncation_direction")
    return direction


def json_response(data: Any, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=dumps(data), content_type="application/json", headers=headers)


def truncation_headers(truncated: int) -> dict[str, str] | None:
    return {"x-rsinfer-truncated": str(truncated)} if truncated else None
