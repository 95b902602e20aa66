"""What every inference route starts with: the parsed body, the model it names (or its kind's default), and
how to answer."""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec
from aiohttp import web

from ... import families
from ...engine.model import LoadedModel
from ...errors import InputError, PayloadTooLarge
from ...jsonio import MAX_JSON_DEPTH, depth, encode
from ...pipelines.base import RowPipeline, Work
from ...runtime.core import PlanArgs
from ...runtime.record import RequestRecord
from ..errors import RequestValidationError
from ..schemas import Usage
from ..state import ServerState

P = TypeVar("P", bound=RowPipeline)
Q = TypeVar("Q", bound=msgspec.Struct)
R = TypeVar("R")
STATE = web.AppKey("state", ServerState)   # the app's ServerState
RECORD = web.RequestKey("record", RequestRecord)   # the request's record, made by the middleware (server/app.py)
_DECODERS: dict[type[Any], msgspec.json.Decoder[Any]] = {}
_AT = re.compile(r"^(?P<text>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)


def decode(raw: bytes, schema: type[Q]) -> Q:
    """The request body, decoded once into its Struct. A body without the request's shape (a required field
    missing, a field of the wrong type, not an object) is a 422 naming the field; a well-formed value that is not
    allowed (an unknown enum value, out of bounds) is a 400; malformed JSON is a 400."""
    if not raw.strip():
        raise InputError("request body is empty; send a JSON object")
    nested = depth(raw)
    if nested > MAX_JSON_DEPTH:
        raise InputError(f"the body nests arrays and objects {nested} deep; at most {MAX_JSON_DEPTH}")
    decoder = _DECODERS.get(schema)
    if decoder is None:
        decoder = _DECODERS[schema] = msgspec.json.Decoder(schema)
    try:
        return decoder.decode(raw)  # type: ignore[no-any-return]
    except msgspec.ValidationError as exc:
        m = _AT.match(str(exc))
        text, path = (m.group("text"), m.group("path") or "") if m else (str(exc), "")
        param = path.lstrip(".") or None
        missing = re.match(r"Object missing required field `([^`]+)`", text)
        if missing:
            field = f"{param}.{missing.group(1)}" if param else missing.group(1)
            raise RequestValidationError(f"`{field}` is required", param=field) from None
        if param is None and text.startswith("Expected `object`"):
            raise RequestValidationError(f"the body must be a JSON object ({text})") from None
        where = f"`{param}`: " if param else ""
        if text.startswith("Invalid enum value") or re.search(r"[<>]=? |length", text):
            raise InputError(f"{where}{text}", param=param) from None
        raise RequestValidationError(f"{where}{text}", param=param) from None
    except msgspec.DecodeError as exc:
        raise InputError(f"malformed JSON body: {exc}") from None
    except RecursionError:     # (refused above; kept so that no body can make it a 500)
        raise InputError(f"the body nests arrays and objects too deep; at most {MAX_JSON_DEPTH}") from None


@dataclass
class Call(Generic[Q]):
    state: ServerState
    req: Q
    model: LoadedModel
    record: RequestRecord

    def pipeline(self, kind: type[P]) -> P:
        """The model's pipeline, as the route's family expects it (a kind's protocol, such as `Embedder` or
        `Reranker`, or its own pipeline for routes only it answers: TEI's /tokenize needs a tokenizer)."""
        pipe = self.state.pipelines[self.model.key]
        if not isinstance(pipe, kind):
            from ...errors import KindMismatch

            raise KindMismatch(f"model '{self.model.name}' is {_a(self.model.kind)} model; this route needs "
                               f"{_a(kind.kind)} model", param="model", model=self.model.name)
        return pipe

    def infer(self, plan: Callable[PlanArgs, Work[R]], *args: PlanArgs.args,
              **kwargs: PlanArgs.kwargs) -> Coroutine[Any, Any, R]:
        """The request through the inference core: `plan(*args, **kwargs)` - a family's plan and what its route
        passes it, checked by mypy against the plan's own signature. The core's coroutine itself, for the route to
        await (no coroutine of its own in between)."""
        return self.state.core.infer(self.record, self.model, plan, *args, **kwargs)


def _a(kind: str) -> str:
    return f"an {kind}" if kind[:1] in "aeiou" else f"a {kind}"


async def begin(request: web.Request, kind: str, schema: type[Q], named: bool = True) -> Call[Q]:
    """Decode the body into `schema` and pick the model: the one the path names (`/models/{name}/...`, TEI's routes
    under a multi-model server's per-model base URL), else the one the body names, else the default of `kind`
    (`named=False`: shapes without a `model` field)."""
    state = request.app[STATE]
    req = decode(await request.read(), schema)
    name = request.match_info.get("name") or (getattr(req, "model", None) if named else None)
    model = state.registry.get(name if isinstance(name, str) else None, kind)
    return Call(state, req, model, request[RECORD])


def check_count(call: Call[Any], key: str, n: int) -> None:
    """At most `server.max_texts` texts in one request's `key` (else 413 naming the limit)."""
    limit = call.state.config.server.max_texts
    if n > limit:
        raise PayloadTooLarge(f"`{key}` has {n} items; at most {limit} per request (server.max_texts)", param=key)


def check_inputs(call: Call[Any], key: str, items: list[Any]) -> list[Any]:
    """A request's items (`key`) as its model's family reads them (families.InputKind), the one place their limits
    are enforced: at most `server.max_texts` of them (413), each decoded into the family's row (an InputError naming
    `key[i]` when it cannot be) and at most its size limit (413 naming it: a text's characters, else what its kind
    declares)."""
    kind = families.get(call.model.config.kind).inputs
    check_count(call, key, len(items))
    if kind.decode is None:         # text: the rows are the strings, their characters bounded
        limit = char_limit(call)
        for i, text in enumerate(items):
            if len(text) > limit:
                raise PayloadTooLarge(f"`{key}[{i}]` has {len(text)} characters; at most {limit} per text "
                                      "(max_text_chars)", param=f"{key}[{i}]")
        return items
    decode, size = kind.decoder(), kind.sizer()
    limit = kind.max_size if kind.max_size is not None else char_limit(call)
    rows = []
    for i, item in enumerate(items):
        where = f"{key}[{i}]"
        row = decode(item, where)
        n = size(row)
        if n > limit:
            raise PayloadTooLarge(f"`{where}` has {n} {kind.unit}; at most {limit} per item (model kind "
                                  f"{call.model.config.kind})", param=where)
        rows.append(row)
    return rows


def char_limit(call: Call[Any]) -> int:
    """Characters per text: the model's `max_text_chars`, else the server's."""
    return call.model.config.max_text_chars or call.state.config.server.max_text_chars


def check_chars(call: Call[Any], key: str, texts: list[str] | str | None) -> None:
    """Every text at most `max_text_chars` characters (the model's, else the server's), else 413 naming the limit;
    checked before any tokenizing."""
    if texts is None:
        return
    limit = char_limit(call)
    for i, text in enumerate([texts] if isinstance(texts, str) else texts):
        if len(text) > limit:
            where = key if isinstance(texts, str) else f"{key}[{i}]"
            raise PayloadTooLarge(f"`{where}` has {len(text)} characters; at most {limit} per text "
                                  "(max_text_chars)", param=where)


def check_copied(call: Call[Any], key: str, chars: int, texts: int) -> None:
    """A request's string of `chars` characters that goes with each of its `texts` (a prompt, NLI hypotheses, an
    assertion) is tokenized that many times: the copies may come to at most what one body may carry
    (server.max_body_mb, as characters). A 1 MB prompt on 256 texts was 256 MB of tokenizing from a 1 MB body (413
    naming `key`)."""
    cap = int(call.state.config.server.max_body_mb * 2**20)
    if chars * texts > cap:
        raise PayloadTooLarge(f"`{key}` ({chars} characters) goes with each of {texts} texts: {chars * texts} "
                              f"characters to tokenize; at most {cap} (server.max_body_mb, as characters)", param=key)


def check_prompt(call: Call[Any], prompt: str | None, texts: list[str] | None) -> None:
    """A request's `prompt` is put before each of its texts: it counts toward each text's `max_text_chars`, and its
    copies toward the body's size (check_copied); 413 naming `prompt`."""
    if not prompt or not texts:
        return
    limit = char_limit(call)
    longest = max(map(len, texts))
    if len(prompt) + longest > limit:
        raise PayloadTooLarge(f"`prompt` ({len(prompt)} characters) with the longest text ({longest}) is more than "
                              f"{limit} characters (max_text_chars): the prompt counts toward each text",
                              param="prompt")
    check_copied(call, "prompt", len(prompt), len(texts))


def texts_of(call: Call[Any], value: str | list[str], key: str) -> list[str]:
    """A request's `key` (a text or texts) as a list, held to the limits every route shares: not empty, at most
    `server.max_texts` texts of at most `max_text_chars` characters."""
    texts = [value] if isinstance(value, str) else value
    if not texts:
        raise InputError(f"`{key}` is empty", param=key)
    check_count(call, key, len(texts))
    check_chars(call, key, texts)
    return texts


def hf_parameters(call: Call[Any], params: dict[str, Any], schema: type[Q]) -> Q:
    """A Hugging Face task's options, read as `schema` (a 422/400 naming a bad one): `parameters`, under the body's
    top-level keys of the same names (huggingface_hub sends `truncate`, `truncation_direction`, `prompt_name`,
    `normalize` there)."""
    from ...jsonio import dumps

    top = {k: v for k in ("truncate", "truncation_direction", "prompt_name", "normalize")
           if (v := getattr(call.req, k, None)) is not None}
    return decode(dumps({**params, **top}), schema)


def usage(tokens: int) -> Usage:
    """OpenAI's `usage` object (prompt tokens only: nothing is generated)."""
    return Usage(prompt_tokens=tokens, total_tokens=tokens)


def truncation_direction(value: str | None) -> str:
    """TEI's `truncation_direction`: right (default) or left, in either case (the schema allows only those)."""
    return (value or "right").lower()


def json_response(body: Any, headers: dict[str, str] | None = None) -> web.Response:
    """A 200 with `body` - the route's response Struct (its documented schema: mypy checks the fields a route sets
    against it), or a list of them - as JSON."""
    return web.Response(body=encode(body), content_type="application/json", headers=headers)


def vectors(rows: Any) -> list[list[float]]:
    """A 2-D numpy array where a response Struct declares `list[list[float]]`: the array itself, which the encoder
    writes through orjson at its own precision (jsonio.encode) - no Python float is made for it."""
    return rows  # type: ignore[no-any-return]


def truncation_headers(truncated: int) -> dict[str, str] | None:
    return {"x-rsinfer-truncated": str(truncated)} if truncated else None
