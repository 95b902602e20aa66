"""Deterministic PII recognizers for formats with an exact shape (and a checksum where one exists).

Small token classifiers label these unreliably (an address in pieces, or not at all inside a paragraph); a
pattern finds all of them. Their spans win over overlapping model spans, as in Presidio and in the rampart
model's own package.
"""

from __future__ import annotations

import re
from collections.abc import Callable

RECOGNIZERS = ("email", "url", "ip_address", "ssn", "credit_card")
TYPES = {"email": "EMAIL", "url": "URL", "ip_address": "IP_ADDRESS", "ssn": "SSN", "credit_card": "CREDIT_CARD_NUMBER"}

_EMAIL = re.compile(r"(?<![\w.%+-])[A-Za-z0-9][A-Za-z0-9._%+-]*@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
                    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\.[A-Za-z]{2,}(?![\w-])")
_URL = re.compile(r"\b(?:https?://|www\.)[^\s<>\"'`]+", re.IGNORECASE)
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IP = re.compile(rf"(?<![\d.]){_OCTET}(?:\.{_OCTET}){{3}}(?!\.?\d)")
_SSN = re.compile(r"(?<![\d-])(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?![\d-])")
_CARD = re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])")


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _emails(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in _EMAIL.finditer(text)]


def _urls(text: str) -> list[tuple[int, int]]:
    out = []
    for m in _URL.finditer(text):
        a, b = m.span()
        while b > a and text[b - 1] in ".,;:!?)]}'\"":  # sentence punctuation after the address
            b -= 1
        out.append((a, b))
    return out


def _ips(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in _IP.finditer(text)]


def _ssns(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in _SSN.finditer(text)]


def _cards(text: str) -> list[tuple[int, int]]:
    out = []
    for m in _CARD.finditer(text):
        digits = re.sub(r"\D", "", m.group())
        if 13 <= len(digits) <= 19 and _luhn(digits):
            out.append(m.span())
    return out


FINDERS: dict[str, Callable[[str], list[tuple[int, int]]]] = {
    "email": _emails, "url": _urls, "ip_address": _ips, "ssn": _ssns, "credit_card": _cards,
}


def recognize(text: str, names: tuple[str, ...]) -> list[tuple[str, int, int]]:
    """(entity type, start, end) of every match, in code point offsets; a URL's own email is not repeated."""
    found: list[tuple[str, int, int]] = []
    for name in names:
        found.extend((TYPES[name], a, b) for a, b in FINDERS[name](text))
    found.sort(key=lambda s: (s[1], -(s[2] - s[1])))
    kept: list[tuple[str, int, int]] = []
    for span in found:  # a match inside a longer one (an email in a URL) is dropped
        if kept and span[1] < kept[-1][2]:
            continue
        kept.append(span)
    return kept
