"""What a redacted value becomes, by mode: mask, remove, replace, hash, pseudonym (keyed, the same token for the same
value everywhere: pseudonym.py) or numbered (Presidio's instance counter: `<PERSON_1>`, `<PERSON_2>` in order of
first appearance within one record, the same value the same number)."""

from __future__ import annotations

import hashlib

from ..errors import ConfigError, InputError
from .pseudonym import Pseudonyms, check_template, normalise

MODES = ("mask", "remove", "replace", "hash", "pseudonym", "numbered")
NUMBERED = "<{type}_{n}>"
MAX_REPLACEMENT_CHARS = 200     # a replacement template (`replacement`, Presidio's `new_value`)


class Replacer:
    """One redaction's settings, checked at construction (InputError naming the parameter). `record()` starts a new
    record: numbered mode counts afresh; the other modes keep no state."""

    def __init__(self, mode: str = "mask", mask_char: str = "*", replacement: str | None = None,
                 salt: bytes = b"", pseudonyms: Pseudonyms | None = None, region: str = "US") -> None:
        if mode not in MODES:
            raise InputError(f"unknown redact mode '{mode}' (one of {', '.join(MODES)})", param="mode")
        if len(mask_char) != 1:
            raise InputError("`mask_char` must be a single character", param="mask_char")
        if replacement is not None and len(replacement) > MAX_REPLACEMENT_CHARS:
            raise InputError(f"`replacement` has {len(replacement)} characters; at most {MAX_REPLACEMENT_CHARS}",
                             param="replacement")
        if mode == "pseudonym":
            if pseudonyms is None:
                raise InputError("mode pseudonym needs a key: --key-file, the model entry's pii_pseudonym_key_file "
                                 "or $RSINFER_PSEUDONYM_KEY (never a request's)", param="mode")
            if replacement is not None:
                try:
                    check_template(replacement)
                except ConfigError as exc:
                    raise InputError(exc.message, param="replacement") from None
                pseudonyms = pseudonyms.with_template(replacement)
        if mode == "numbered" and replacement is not None and "{n}" not in replacement:
            raise InputError("`replacement` for mode numbered must contain {n}, e.g. '<{type}_{n}>'",
                             param="replacement")
        self.mode, self.mask_char, self.replacement, self.salt = mode, mask_char, replacement, salt
        self.pseudonyms, self.region = pseudonyms, region
        self.numbers: dict[tuple[str, str], int] = {}
        self.counts: dict[str, int] = {}

    def record(self) -> Replacer:
        """A new record begins (numbered mode numbers from 1 again); returns self."""
        self.numbers.clear()
        self.counts.clear()
        return self

    def __call__(self, entity_type: str, value: str) -> str:
        mode = self.mode
        if mode == "mask":
            return self.mask_char * len(value)
        if mode == "replace":
            return (self.replacement or "<{type}>").replace("{type}", entity_type)
        if mode == "hash":
            return hashlib.sha256(self.salt + value.encode("utf-8")).hexdigest()[:16]
        if mode == "pseudonym":
            assert self.pseudonyms is not None
            return self.pseudonyms.token(entity_type, value)
        if mode == "numbered":
            return self._numbered(entity_type, value)
        return ""

    def _numbered(self, entity_type: str, value: str) -> str:
        key = (entity_type, normalise(entity_type, value, self.region))
        n = self.numbers.get(key)
        if n is None:
            n = self.numbers[key] = self.counts[entity_type] = self.counts.get(entity_type, 0) + 1
        return (self.replacement or NUMBERED).replace("{type}", entity_type).replace("{n}", str(n))
