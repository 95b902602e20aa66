"""What every inference route starts with: the parsed body, the model it names (or its kind's default), and
how to answer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from aiohttp import web

from ...engine.model import LoadedModel
from ...jsonio import dumps
from ...pipelines.base import RowPipeline, Work
from ..request import Body, json_body
from ..state import STATE, ServerState

P = TypeVar("P", bound=RowPipeline)
R = TypeVar("R")


@dataclass
class Call:
    state: ServerState
    body: Body
    model: LoadedModel

    def pipeline(self, kind: type[P]) -> P:
        """The model's pipeline, as the route's family expects it."""
        pipe = self.state.pipelines[self.model.key]
        if not isinstance(pipe, kind):
            raise TypeError(f"model '{self.model.name}' has a {type(pipe).__name__}, not a {kind.__name__}")
        return pipe

    async def infer(self, plan: Callable[..., Work[R]], *args: Any, **kwargs: Any) -> R:
        return await self.state.infer(self.model, plan, *args, **kwargs)


async def begin(request: web.Request, kind: str, named: bool = True) -> Call:
    """Parse the body and pick the model: the one it names, else the default of `kind` (`named=False`: always
    the default, for shapes without a `model` field)."""
    state = request.app[STATE]
    body = Body(await json_body(request))
    model = state.registry.get(body.str("model", None) if named else None, kind)
    return Call(state, body, model)


def check_count(call: Call, key: str, n: int) -> None:
    """At most `server.max_texts` texts in one request's `key` (else 413 naming the limit)."""
    from ...errors import PayloadTooLarge

    limit = call.state.config.server.max_texts
    if n > limit:
        raise PayloadTooLarge(f"`{key}` has {n} items; at most {limit} per request (server.max_texts)", param=key)


def check_chars(call: Call, key: str, texts: list[str] | str | None) -> None:
    """Every text at most `max_text_chars` characters (the model's, else the server's), else 413 naming the limit;
    checked before any tokenizing."""
    from ...errors import PayloadTooLarge

    if texts is None:
        return
    limit = call.model.config.max_text_chars or call.state.config.server.max_text_chars
    for i, text in enumerate([texts] if isinstance(texts, str) else texts):
        if len(text) > limit:
            where = key if isinstance(texts, str) else f"{key}[{i}]"
            raise PayloadTooLarge(f"`{where}` has {len(text)} characters; at most {limit} per text "
                                  "(max_text_chars)", param=where)


def usage(tokens: int) -> dict[str, int]:
    """OpenAI's `usage` object (prompt tokens only: nothing is generated)."""
    return {"prompt_tokens": tokens, "total_tokens": tokens}


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
