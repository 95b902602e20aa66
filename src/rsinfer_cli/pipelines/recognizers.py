"""Deterministic PII recognizers for formats with an exact shape, validated by the libraries that know them.

Small token classifiers label these unreliably (a phone number in a format they were not trained on, an IBAN inside
a paragraph); a recognizer finds every one that validates. What validates is not written here: phone numbers are
Google's libphonenumber (`phonenumbers`, leniency VALID: a number of a real numbering plan, for every configured
region, and `+` numbers always); IBANs, card numbers (Luhn) and national ids are python-stdnum's check digits;
IPv4 and IPv6 are the standard library's `ipaddress`. A regular expression only proposes candidates. A number that
fails its check is not PII to a recognizer (the model may still label it). Matches win over overlapping model spans
(as in Presidio), and of overlapping matches the checksum-validated type wins.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..engine.cancel import checkpoint
from .spans import EVERY, Taken

RECOGNIZERS = ("email", "url", "ip_address", "ssn", "credit_card", "phone", "iban", "national_id")
DEFAULT_RECOGNIZERS = ("email", "url", "ip_address", "ssn", "credit_card", "phone", "iban")
TYPES = {"email": "EMAIL", "url": "URL", "ip_address": "IP_ADDRESS", "ssn": "SSN", "credit_card": "CREDIT_CARD_NUMBER",
         "phone": "PHONE", "iban": "IBAN", "national_id": "NATIONAL_ID"}


@dataclass(frozen=True)
class Match:
    entity_type: str
    start: int                      # code point offsets, end exclusive
    end: int
    scheme: str | None = None       # NATIONAL_ID: which one (DE_IDNR, FR_NIR, ...)


_EMAIL = re.compile(r"(?<![\w.%+-])[A-Za-z0-9][A-Za-z0-9._%+-]*@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
                    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\.[A-Za-z]{2,}(?![\w-])")
_URL = re.compile(r"\b(?:https?://|www\.)[^\s<>\"'`]+", re.IGNORECASE)
_IPV4 = re.compile(r"(?<![\w.:])\d{1,3}(?:\.\d{1,3}){3}(?![\w:]|\.\d)")
_IPV6 = re.compile(r"(?<![\w:.])(?:[0-9A-Fa-f]{0,4}:){2,7}(?:[0-9A-Fa-f]{1,4}|\d{1,3}(?:\.\d{1,3}){3})?"
                   r"(?![\w:]|\.\d)")
_SSN = re.compile(r"(?<![\d-])\d{3}-\d{2}-\d{4}(?![\d-])")
_CARD = re.compile(r"(?<![\d+-])\d(?:[ -]?\d){11,18}(?![\d-])")
_SIX_DIGITS = re.compile(r"\d(?:\D{0,4}\d){5}")
_IBAN = re.compile(r"(?<![A-Za-z0-9])[A-Z]{2}\d{2}(?: ?[A-Z0-9]){10,32}(?![A-Za-z0-9])")
# issuer prefixes (the first digits) of the card networks, with their lengths
_ISSUERS: tuple[tuple[tuple[int, int], tuple[int, ...], tuple[int, ...]], ...] = (
    ((4, 4), (13, 16, 19), ()),                    # Visa
    ((51, 55), (16,), ()), ((2221, 2720), (16,), ()),                  # Mastercard
    ((34, 34), (15,), ()), ((37, 37), (15,), ()),                      # American Express
    ((6011, 6011), (16, 17, 18, 19), ()), ((644, 649), (16, 17, 18, 19), ()), ((65, 65), (16, 17, 18, 19), ()),
    ((3528, 3589), (16, 17, 18, 19), ()),          # JCB
    ((300, 305), (14, 15, 16, 17, 18, 19), ()), ((36, 36), (14, 15, 16, 17, 18, 19), ()),
    ((38, 39), (14, 15, 16, 17, 18, 19), ()),      # Diners Club
    ((62, 62), (16, 17, 18, 19), ()),              # UnionPay
    ((50, 50), tuple(range(12, 20)), ()), ((56, 58), tuple(range(12, 20)), ()), ((67, 67), tuple(range(12, 20)), ()),
)


# the checksum finders' candidates, checked or not: (entity type, start, end)
Shaped = list[tuple[str, int, int]]


def _issuer_ok(digits: str) -> bool:
    for (lo, hi), lengths, _ in _ISSUERS:
        width = len(str(lo))
        if len(digits) in lengths and lo <= int(digits[:width]) <= hi:
            return True
    return False


def _emails(text: str, regions: Sequence[str], shaped: Shaped) -> list[Match]:
    return [Match("EMAIL", *m.span()) for m in _EMAIL.finditer(text)]


def _urls(text: str, regions: Sequence[str], shaped: Shaped) -> list[Match]:
    out: list[Match] = []
    for m in _URL.finditer(text):
        a, b = m.span()
        while b > a and text[b - 1] in ".,;:!?)]}'\"":  # sentence punctuation after the address
            b -= 1
        out.append(Match("URL", a, b))
    return out


def _ips(text: str, regions: Sequence[str], shaped: Shaped) -> list[Match]:
    out: list[Match] = []
    for pattern in (_IPV4, _IPV6) if ":" in text else (_IPV4,):
        for m in pattern.finditer(text):
            try:
                ipaddress.ip_address(m.group())
            except ValueError:
                continue
            out.append(Match("IP_ADDRESS", *m.span()))
    return out


def _ssns(text: str, regions: Sequence[str], shaped: Shaped) -> list[Match]:
    from stdnum.us import ssn

    out: list[Match] = []
    for m in _SSN.finditer(text):
        shaped.append(("SSN", *m.span()))
        if ssn.is_valid(m.group()):
            out.append(Match("SSN", *m.span()))
    return out


def _cards(text: str, regions: Sequence[str], shaped: Shaped) -> list[Match]:
    from stdnum import luhn

    out: list[Match] = []
    for m in _CARD.finditer(text):
        shaped.append(("CREDIT_CARD_NUMBER", *m.span()))
        digits = re.sub(r"\D", "", m.group())
        if 13 <= len(digits) <= 19 and _issuer_ok(digits) and luhn.is_valid(digits):
            out.append(Match("CREDIT_CARD_NUMBER", *m.span()))
    return out


def _phones(text: str, regions: Sequence[str], shaped: Shaped) -> list[Match]:
    if _SIX_DIGITS.search(text) is None:          # no phone number has fewer than six digits close together
        return []
    import phonenumbers

    seen: set[tuple[int, int]] = set()
    out: list[Match] = []
    # ZZ: the numbers written with their + country code, whatever the regions (none without a +)
    for region in (*regions, "ZZ") if "+" in text else regions:
        for m in phonenumbers.PhoneNumberMatcher(text, region, leniency=phonenumbers.Leniency.VALID):
            checkpoint()                 # libphonenumber's matcher is slow: each match is worth the look
            start = m.start
            if text[start] == "(" and m.raw_string.count("(") > m.raw_string.count(")"):
                start += 1       # "(0121 234 5309)": the matcher keeps the opening bracket, not the closing one
            if (start, m.end) not in seen:
                seen.add((start, m.end))
                out.append(Match("PHONE", start, m.end))
    return out


def _ibans(text: str, regions: Sequence[str], shaped: Shaped) -> list[Match]:
    from stdnum import iban

    out: list[Match] = []
    for m in _IBAN.finditer(text):
        checkpoint()
        shaped.append(("IBAN", *m.span()))
        value, start = m.group(), m.start()
        for end in range(len(value), 14, -1):     # the longest prefix that validates: a group after it is not its
            if (end == len(value) or value[end] == " ") and iban.is_valid(value[:end]):
                out.append(Match("IBAN", start, start + end))
                break
    return out


def _schemes() -> dict[str, list[tuple[str, re.Pattern[str], Callable[[str], bool]]]]:
    """Region → (scheme, candidate pattern, python-stdnum validator) of its national ids with check digits."""
    from stdnum.de import idnr
    from stdnum.es import dni, nie
    from stdnum.fr import nir
    from stdnum.gb import nhs
    from stdnum.in_ import aadhaar
    from stdnum.it import codicefiscale
    from stdnum.nl import bsn
    from stdnum.pl import pesel

    b, e = r"(?<![\w+.-])", r"(?![\w-]|[.,]\d)"
    return {
        "GB": [("GB_NHS", re.compile(rf"{b}\d{{3}}[ -]?\d{{3}}[ -]?\d{{4}}{e}"), nhs.is_valid)],
        "DE": [("DE_IDNR", re.compile(rf"{b}\d{{2}} ?\d{{3}} ?\d{{3}} ?\d{{3}}{e}"), idnr.is_valid)],
        "FR": [("FR_NIR", re.compile(rf"{b}[12] ?\d{{2}} ?\d{{2}} ?(?:\d{{2}}|2[AB]) ?\d{{3}} ?\d{{3}} ?\d{{2}}{e}"),
                nir.is_valid)],
        "ES": [("ES_DNI", re.compile(rf"{b}\d{{8}}-?[A-Z]{e}"), dni.is_valid),
               ("ES_NIE", re.compile(rf"{b}[XYZ]-?\d{{7}}-?[A-Z]{e}"), nie.is_valid)],
        "IN": [("IN_AADHAAR", re.compile(rf"{b}[2-9]\d{{3}} ?\d{{4}} ?\d{{4}}{e}"), aadhaar.is_valid)],
        "NL": [("NL_BSN", re.compile(rf"{b}(?:\d{{9}}|\d{{4}}\.\d{{2}}\.\d{{3}}){e}"), bsn.is_valid)],
        "IT": [("IT_CF", re.compile(rf"{b}[A-Z]{{6}}\d{{2}}[A-EHLMPR-T]\d{{2}}[A-Z]\d{{3}}[A-Z]{e}"),
                codicefiscale.is_valid)],
        "PL": [("PL_PESEL", re.compile(rf"{b}\d{{11}}{e}"), pesel.is_valid)],
    }


_SCHEMES: dict[str, list[tuple[str, re.Pattern[str], Callable[[str], bool]]]] | None = None
ID_REGIONS = ("GB", "DE", "FR", "ES", "IN", "NL", "IT", "PL")   # US ids are the `ssn` recognizer's


def _national_ids(text: str, regions: Sequence[str], shaped: Shaped) -> list[Match]:
    global _SCHEMES
    if _SCHEMES is None:
        _SCHEMES = _schemes()
    out: list[Match] = []
    for region in regions:
        for scheme, pattern, valid in _SCHEMES.get(region, ()):
            for m in pattern.finditer(text):
                checkpoint()
                shaped.append(("NATIONAL_ID", *m.span()))
                if valid(m.group()):
                    out.append(Match("NATIONAL_ID", *m.span(), scheme=scheme))
    return out


FINDERS: dict[str, Callable[[str, Sequence[str], Shaped], list[Match]]] = {
    "url": _urls, "email": _emails, "iban": _ibans, "credit_card": _cards, "national_id": _national_ids,
    "ssn": _ssns, "ip_address": _ips, "phone": _phones,
}
# of overlapping matches the first type here wins: a checksum beats a shape, a shape beats phone metadata
PRIORITY = {name: i for i, name in enumerate(FINDERS)}


def check_regions(regions: Sequence[str]) -> list[str]:
    """The regions neither phonenumbers nor a national-id scheme knows."""
    import phonenumbers

    known = set(phonenumbers.SUPPORTED_REGIONS) | set(ID_REGIONS)
    return [r for r in regions if r not in known]


def recognize(text: str, names: Sequence[str], regions: Sequence[str] = ("US",)) -> list[Match]:
    """Every validated match of the recognizers `names`, in order of start; overlapping matches resolved by type
    priority (then length), so an email inside a URL or a phone-shaped IBAN is reported once."""
    return scan(text, names, regions)[0]


def scan(text: str, names: Sequence[str], regions: Sequence[str] = ("US",)
         ) -> tuple[list[Match], list[tuple[int, int]]]:
    """`recognize`'s matches, and where the checksum types' candidates stand (IBANs, card numbers, national ids,
    SSNs) whether or not their check passed: digits inside one are a part of that number - a mistyped IBAN - and
    never a phone number or an id of their own. One pass of each recognizer over the text for both."""
    found: list[tuple[int, Match]] = []
    shaped: Shaped = []
    for name in names:
        checkpoint()
        found.extend((PRIORITY[name], m) for m in FINDERS[name](text, regions, shaped))
    found.sort(key=lambda pm: (pm[0], -(pm[1].end - pm[1].start), pm[1].start))
    # digits inside something shaped like an IBAN whose check failed are a mistyped IBAN, not a phone or an id
    ibans = Taken.of(len(text), ((a, b) for kind, a, b in shaped if kind == "IBAN"))
    taken = Taken(len(text))
    kept: list[Match] = []
    for i, (_, m) in enumerate(found):
        if not i % EVERY:
            checkpoint()
        if m.entity_type != "IBAN" and ibans.overlaps(m.start, m.end):
            continue
        if not taken.overlaps(m.start, m.end):
            taken.take(m.start, m.end)
            kept.append(m)
    return sorted(kept, key=lambda m: (m.start, m.end)), [(a, b) for _, a, b in shaped]


def to_json(m: Match) -> dict[str, Any]:
    out: dict[str, Any] = {"entity_type": m.entity_type, "start": m.start, "end": m.end}
    if m.scheme is not None:
        out["scheme"] = m.scheme
    return out
