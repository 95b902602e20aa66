"""Reading request bodies: JSON parsing and typed field access with `param` names in every error."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..errors import InputError
from ..jsonio import JSONDecodeError, loads
from .errors import RequestValidationError

MISSING: Any = object()


async def json_body(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object; any content type is accepted (`curl -d` sends form encoding)."""
    raw = await request.read()
    if not raw.strip():
        raise InputError("request body is empty; send a JSON object")
    try:
        data = loads(raw)
    except JSONDecodeError as exc:
        raise InputError(f"malformed JSON body: {exc}") from None
    if not isinstance(data, dict):
        raise RequestValidationError(f"the body must be a JSON object, got {_kind(data)}")
    return data


def _kind(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
            dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)


class Body:
    """Typed access to the fields of one request body."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def _get(self, key: str, default: Any) -> Any:
        value = self.data.get(key, MISSING)
        if value is MISSING or value is None:
            if default is MISSING:
                raise RequestValidationError(f"`{key}` is required", param=key)
            return default
        return value

    def str(self, key: str, default: Any = MISSING) -> Any:
        value = self._get(key, default)
        if value is not default and not isinstance(value, str):
            raise RequestValidationError(f"`{key}` must be a string, got {_kind(value)}", param=key)
        return value

    def bool(self, key: str, default: Any = MISSING) -> Any:
        value = self._get(key, default)
        if value is not default and not isinstance(value, bool):
            raise RequestValidationError(f"`{key}` must be true or false, got {_kind(value)}", param=key)
        return value

    def int(self, key: str, default: Any = MISSING) -> Any:
        value = self._get(key, default)
        if value is not default and (not isinstance(value, int) or isinstance(value, bool)):
            raise RequestValidationError(f"`{key}` must be an integer, got {_kind(value)}", param=key)
        return value

    def number(self, key: str, default: Any = MISSING) -> Any:
        value = self._get(key, default)
        if value is not default and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise RequestValidationError(f"`{key}` must be a number, got {_kind(value)}", param=key)
        return value

    def str_list(self, key: str, default: Any = MISSING, *, allow_str: bool = False) -> Any:
        """A list of strings (or one string when allow_str), as given."""
        value = self._get(key, default)
        if value is default:
            return value
        if allow_str and isinstance(value, str):
            return value
        if not isinstance(value, list):
            want = "a string or an array of strings" if allow_str else "an array of strings"
            raise RequestValidationError(f"`{key}` must be {want}, got {_kind(value)}", param=key)
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise RequestValidationError(f"`{key}[{i}]` must be a string, got {_kind(item)}",
                                             param=f"{key}[{i}]")
        return value


def text_or_token_input(value: Any, key: str) -> tuple[list[str] | None, list[list[int]] | None, bool]:
    """OpenAI/TEI `input`: a string, strings, token ids, or lists of token ids → (texts, ids, was_single)."""
    if isinstance(value, str):
        return [value], None, True
    if not isinstance(value, list):
        raise RequestValidationError(f"`{key}` must be a string, an array of strings, or token ids; got "
                                     f"{_kind(value)}", param=key)
    if not value:
        raise InputError(f"`{key}` is empty", param=key)
    if all(isinstance(v, str) for v in value):
        return value, None, False
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return None, [value], True
    if all(isinstance(v, list) for v in value):
        rows = []
        for i, row in enumerate(value):
            if not all(isinstance(t, int) and not isinstance(t, bool) for t in row):
                raise RequestValidationError(f"`{key}[{i}]` must be an array of integer token ids",
                                             param=f"{key}[{i}]")
            rows.append(row)
        return None, rows, False
    first = type(value[0])
    bad = next((i for i, v in enumerate(value) if type(v) is not first or first not in (str, int, list)), 0)
    raise RequestValidationError(f"`{key}` mixes types or holds {_kind(value[bad])} at index {bad}; send strings "
                                 "or token ids", param=f"{key}[{bad}]")
