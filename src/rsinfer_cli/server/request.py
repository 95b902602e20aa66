"""Request bodies: routes decode theirs into msgspec Structs (`routes/common.decode`); this holds the hand check
of OpenAI's untagged `input` items."""

from __future__ import annotations

from typing import Any

from ..errors import InputError
from .errors import RequestValidationError


def _kind(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
            dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)


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
