"""Pseudonyms: the same value becomes the same token across records, files, processes and runs with one key.

A pseudonym is HMAC-SHA256(key, entity kind NUL normalised value), its first `width` hex characters rendered by a
template (`<{type}_{hash}>`); the kind is the type, with the spellings of one kind made one (PHONE and Presidio's
PHONE_NUMBER; GIVEN_NAME, SURNAME and PERSON). The value is normalised per type first, so that the ways one value
is written map to one token: e-mail addresses case-folded, phone numbers as E.164 (phonenumbers, in the model's
first region), ids compacted (python-stdnum's clean: no spaces, dashes, dots or slashes, upper case), everything
else NFKC-normalised, case-folded and with its whitespace collapsed. Without the key nobody can go back or test a
guess; a key under 128 bits is refused. Nothing here logs a value or the key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import unicodedata
from pathlib import Path

from ..errors import ConfigError

KEY_ENV = "RSINFER_PSEUDONYM_KEY"
MIN_KEY_BYTES = 16                     # 128 bits: a shorter key can be searched
TEMPLATE = "<{type}_{hash}>"
WIDTH = 8                              # hex characters of the HMAC: 32 bits, a collision among ~77k values is 50%
MAX_WIDTH = 64
PHONES = frozenset({"PHONE", "PHONE_NUMBER", "PHONENUMBER", "TELEPHONE", "TELEPHONENUM"})
EMAILS = frozenset({"EMAIL", "EMAIL_ADDRESS"})
IDS = frozenset({"NATIONAL_ID", "SSN", "US_SSN", "IBAN", "IBAN_CODE", "CREDIT_CARD", "CREDIT_CARD_NUMBER", "TAX_ID",
                 "PASSPORT", "DRIVERS_LICENSE", "BANK_ACCOUNT", "ROUTING_NUMBER", "ACCOUNT_NUMBER", "ID_NUMBER"})
NAMES = frozenset({"PERSON", "NAME", "GIVEN_NAME", "SURNAME", "FIRST_NAME", "LAST_NAME", "FULL_NAME", "MIDDLE_NAME"})
# one hash namespace for the spellings of a kind, so that rsinfer's PHONE and Presidio's PHONE_NUMBER, a GIVEN_NAME
# and a PERSON, give one hash for one value (the token still shows the type it was found as)
_SAME = {**dict.fromkeys(PHONES, "PHONE"), **dict.fromkeys(EMAILS, "EMAIL"), **dict.fromkeys(NAMES, "PERSON"),
         "SSN": "SSN", "US_SSN": "SSN", "IBAN_CODE": "IBAN", "CREDIT_CARD_NUMBER": "CREDIT_CARD"}
_SPACE = re.compile(r"\s+")


def parse_key(material: str | bytes, where: str) -> bytes:
    """A key written as hex or base64 (surrounding whitespace ignored), at least 128 bits; ConfigError naming
    `where` (never the key)."""
    text = material.decode("ascii", "replace") if isinstance(material, bytes) else material
    text = text.strip()
    key: bytes | None = None
    if re.fullmatch(r"(?:[0-9a-fA-F]{2})+", text):
        key = bytes.fromhex(text)
    elif re.fullmatch(r"[A-Za-z0-9+/_-]+={0,2}", text):         # base64, standard or URL-safe
        body = text.rstrip("=").replace("-", "+").replace("_", "/")
        try:
            key = base64.b64decode(body + "=" * (-len(body) % 4), validate=True)
        except (binascii.Error, ValueError):
            key = None
    if key is None:
        raise ConfigError(f"{where}: the pseudonym key must be hex or base64")
    if len(key) < MIN_KEY_BYTES:
        raise ConfigError(f"{where}: the pseudonym key has {len(key) * 8} bits; at least {MIN_KEY_BYTES * 8} "
                          "(generate one: python -c \"import secrets; print(secrets.token_hex(32))\")")
    return key


def read_key_file(path: str | Path, where: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read the pseudonym key file: {exc.strerror}") from None
    return parse_key(data, where)


def key_from(key_file: str | Path | None, where: str) -> bytes | None:
    """The key of a key file, else $RSINFER_PSEUDONYM_KEY, else None."""
    if key_file:
        return read_key_file(key_file, where)
    env = os.environ.get(KEY_ENV)
    return parse_key(env, f"${KEY_ENV}") if env else None


def check_template(template: str, param: str = "replacement") -> None:
    if "{hash}" not in template:
        raise ConfigError(f"`{param}`: a pseudonym template must contain {{hash}}, e.g. '{TEMPLATE}'")
    left = template.replace("{type}", "").replace("{hash}", "").replace("{key_id}", "")
    if "{" in left or "}" in left:
        raise ConfigError(f"`{param}`: a pseudonym template may hold {{type}}, {{hash}} and {{key_id}} only")


class Pseudonyms:
    """One key's pseudonyms. `region`: the phone numbering plan of numbers written without a country code."""

    def __init__(self, key: bytes, template: str = TEMPLATE, width: int = WIDTH, region: str = "US") -> None:
        if len(key) < MIN_KEY_BYTES:
            raise ConfigError(f"the pseudonym key has {len(key) * 8} bits; at least {MIN_KEY_BYTES * 8}")
        check_template(template)
        if not 4 <= width <= MAX_WIDTH:
            raise ConfigError(f"the pseudonym width must be 4 to {MAX_WIDTH} hex characters, got {width}")
        self._key = key
        self.template, self.width, self.region = template, width, region
        # names the key without revealing it: rotate keys and tell the tokens of each apart
        self.key_id = hmac.new(key, b"rsinfer pseudonym key id", hashlib.sha256).hexdigest()[:4]

    def __repr__(self) -> str:           # never the key
        return f"Pseudonyms(key_id={self.key_id!r}, template={self.template!r}, width={self.width})"

    def with_template(self, template: str) -> Pseudonyms:
        """The same key rendered by another template."""
        return Pseudonyms(self._key, template, self.width, self.region)

    def digest(self, entity_type: str, value: str) -> str:
        kind = _SAME.get(entity_type, entity_type)
        message = f"{kind}\x00{normalise(entity_type, value, self.region)}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()[:self.width]

    def token(self, entity_type: str, value: str) -> str:
        return self.template.replace("{type}", entity_type).replace("{key_id}", self.key_id) \
            .replace("{hash}", self.digest(entity_type, value))


def normalise(entity_type: str, value: str, region: str = "US") -> str:
    """The one spelling of a value that its ways of being written share."""
    text = unicodedata.normalize("NFKC", value).strip()
    if entity_type in EMAILS:
        return text.casefold()
    if entity_type in PHONES:
        return _e164(text, region)
    if entity_type in IDS:
        from stdnum.util import clean

        return clean(text, " -./").upper()
    return _SPACE.sub(" ", text).casefold()


def _e164(text: str, region: str) -> str:
    import phonenumbers

    try:
        number = phonenumbers.parse(text, region)
    except phonenumbers.NumberParseException:
        return re.sub(r"\D", "", text)
    return phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164)
