"""How a config's mistakes are told: every one found (not just the first), each with the file and its key path, and
a close match for a misspelt key or value."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

from ..errors import ConfigError


class Errors:
    def __init__(self, file: str) -> None:
        self.file = file
        self.items: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.items.append(f"{self.file}: {path}: {message}" if path else f"{self.file}: {message}")

    def unknown_key(self, where: str, key: Any, allowed: Iterable[str]) -> None:
        """`key` is not one of `allowed`: the close one, else the whole list."""
        allowed = list(allowed)
        close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
        hint = f" (did you mean '{close[0]}'?)" if close else f" (allowed: {', '.join(allowed)})"
        self.add(where, f"unknown key{hint}")

    def raise_if_any(self) -> None:
        if self.items:
            head = self.items[0] if len(self.items) == 1 else \
                f"{len(self.items)} errors in config:\n  " + "\n  ".join(self.items)
            raise ConfigError(head)


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "a mapping"}.get(type(value), type(value).__name__)
