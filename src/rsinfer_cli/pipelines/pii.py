"""PII: token classification over whole documents → BIOES spans with character offsets → redaction.

A text longer than max_len tokens is scanned in windows overlapping by max_len/4 tokens; each token is labelled
once (in an overlap the first half comes from the earlier window, the second from the later), so nothing past
the first window escapes. Nothing here logs a text or a span.
"""

from __future__ import annotations

import re
import secrets
import time
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import opt
from ..engine.cancel import checkpoint
from ..engine.model import LoadedModel
from ..errors import ConfigError, InputError, ModelLoadError, PayloadTooLarge
from .base import LOGIT_OUTPUTS, Array, Timed, Timing, Work, id2label, pick_output, softmax
from .pii_rules import Found, Pattern, PatternSpec, Rules
from .pseudonym import Pseudonyms, key_from
from .recognizers import DEFAULT_RECOGNIZERS, ID_REGIONS, RECOGNIZERS, check_regions, recognize, scan
from .recognizers import TYPES as RECOGNIZED
from .replacer import Replacer
from .spans import EVERY, Containers, Taken
from .text import Encoded, TextPipeline, encode_batch


@dataclass(frozen=True)
class Entity:
    entity_type: str
    text: str
    score: float
    start: int      # Unicode code point offsets into the text, end exclusive
    end: int
    scheme: str | None = None   # a NATIONAL_ID's scheme (DE_IDNR, FR_NIR, ...)
    # what found it: "model", a recognizer ("phone"), a pattern's name, "deny_list", "model (address merged)"
    source: str = field(default="model", compare=False)
    found: Found | None = field(default=None, compare=False, repr=False)   # a pattern's match: how it scored

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"entity_type": self.entity_type, "text": self.text, "score": self.score,
                               "start": self.start, "end": self.end}
        if self.scheme is not None:
            out["scheme"] = self.scheme
        return out


@dataclass
class Detection(Timed):
    entities: list[list[Entity]]   # per text
    timing: Timing


@dataclass(frozen=True)
class Redacted:
    """One span as redaction reports it: where it was, what stands there now; never the value it removed."""

    entity_type: str
    score: float
    start: int                      # in the original text (code points, end exclusive)
    end: int
    replacement: str                # what the redacted text has instead ("" for mode remove)
    redacted_start: int             # where that is in the redacted text
    redacted_end: int

    def to_json(self) -> dict[str, Any]:
        return {"entity_type": self.entity_type, "score": self.score, "start": self.start, "end": self.end,
                "replacement": self.replacement, "redacted_start": self.redacted_start,
                "redacted_end": self.redacted_end}


@dataclass
class Redaction:
    texts: list[str]               # redacted, per text
    detection: Detection           # what was found (with the values: for the process, never for the answer)
    spans: list[list[Redacted]]    # per text: what the answer may show of each redacted span

    @property
    def timing(self) -> Timing:
        return self.detection.timing


def check_threshold(threshold: float | None, param: str = "threshold") -> None:
    """A probability threshold must lie in [0, 1] (InputError naming it)."""
    if threshold is not None and not (0.0 <= float(threshold) <= 1.0):
        raise InputError(f"`{param}` must be between 0 and 1, got {threshold}", param=param)


def parse_tag(label: str) -> tuple[str, str]:
    """(tag, type): tag O | B | I | E | S. Unknown prefixes count as I; a bare label is I of itself."""
    if label in ("O", ""):
        return "O", ""
    prefix, sep, rest = label.partition("-")
    if not sep:
        return "I", label
    return (prefix if prefix in ("B", "I", "E", "S") else "I"), rest


def plan_windows(n: int, width: int, overlap: int) -> list[tuple[int, int]]:
    """[start, end) token windows of at most `width` tokens covering n tokens, consecutive ones overlapping."""
    if n <= width:
        return [(0, n)]
    step = max(width - overlap, 1)
    out = []
    start = 0
    while True:
        end = min(start + width, n)
        out.append((start, end))
        if end >= n:
            return out
        start += step


def stitch(windows: list[tuple[int, int]], rows: list[Array]) -> Array:
    """Per-token rows of overlapping windows → one row per token: each overlap is split at its middle."""
    if len(windows) == 1:
        return rows[0]
    parts = []
    for k, ((s, e), row) in enumerate(zip(windows, rows, strict=True)):
        lo = s if k == 0 else (s + windows[k - 1][1]) // 2
        hi = e if k == len(windows) - 1 else (windows[k + 1][0] + e) // 2
        parts.append(row[lo - s: hi - s])
    return np.concatenate(parts)


# characters a span may be widened over so it never cuts a word, an address or a number in two
_JOINERS = frozenset("._%+-@/:#&=?~'")
_OPENERS = frozenset("\"'([{<«")
_CLOSERS = frozenset(".,;:!?\"')]}>»")


def _word_char(ch: str) -> bool:
    return (ch.isalnum() and ord(ch) < 0x2E80) or ch in _JOINERS  # not CJK: those scripts have no spaces


def whole_words(text: str, a: int, b: int) -> tuple[int, int]:
    """[a, b) widened to the word it starts and ends in (`john` in `john.smith@example.com` → the address),
    without pulling in quotes, brackets or sentence punctuation at its edges."""
    na, nb = a, b
    while na > 0 and _word_char(text[na - 1]):
        na -= 1
    while na < a and text[na] in _OPENERS | _CLOSERS:
        na += 1
    while nb < len(text) and _word_char(text[nb]):
        nb += 1
    while nb > b and text[nb - 1] in _CLOSERS:
        nb -= 1
    return na, nb


class _Walk:
    """The BIOES walk's spans: those closed, and the one open ([type, start, end, probs])."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, int, int, list[float]]] = []
        self.open: list[Any] | None = None

    def close(self) -> None:
        if self.open is not None:
            self.spans.append((self.open[0], self.open[1], self.open[2], self.open[3]))
            self.open = None

    def start(self, etype: str, a: int, b: int, p: float) -> None:
        self.close()
        self.open = [etype, a, b, [p]]

    def single(self, etype: str, a: int, b: int, p: float) -> None:
        self.close()
        self.spans.append((etype, a, b, [p]))

    def extend(self, etype: str, b: int, p: float) -> bool:
        """The open span, when of `etype`, taken to `b`; False when there is none of that type."""
        if self.open is None or self.open[0] != etype:
            return False
        self.open[2] = b
        self.open[3].append(p)
        return True


def _bioes(offsets: Sequence[tuple[int, int]], label_ids: Array, probs: Array, labels: Sequence[str],
           threshold: float) -> list[tuple[str, int, int, list[float]]]:
    """The tokens' spans by their BIOES tags; a `B-X` glued to the previous piece extends an open `X`."""
    walk = _Walk()
    prev_end = -1
    for (a, b), lid, p in zip(offsets, label_ids, probs, strict=True):
        if a == b:  # an empty piece carries no characters
            continue
        tag, etype = parse_tag(labels[lid]) if p >= threshold else ("O", "")
        glued = a == prev_end
        prev_end = b
        if tag == "O":
            walk.close()
        elif tag == "S":
            walk.single(etype, a, b, p)
        elif tag == "B" and not glued:
            walk.start(etype, a, b, p)
        elif tag == "E":
            if walk.extend(etype, b, p):
                walk.close()
            else:
                walk.single(etype, a, b, p)
        elif not walk.extend(etype, b, p):    # I, or a glued B, with no open span of its type
            walk.start(etype, a, b, p)
    walk.close()
    return walk.spans


def decode(text: str, offsets: Sequence[tuple[int, int]], label_ids: Array, probs: Array,
           labels: Sequence[str], threshold: float) -> list[Entity]:
    """The BIOES state machine over one text's tokens (special tokens already excluded).

    Two improvements over a plain BIOES walk, because the model labels word pieces: a `B-X` on a piece glued to
    the previous token (no gap between their offsets) extends an open `X` span instead of splitting the word;
    and a span is widened to whole words (so `john` + `smith` + `com` labelled inside an address becomes the
    address), fragments of one type that then meet are merged, and of spans with the same range the most
    probable type is kept."""
    merged: list[list[Any]] = []  # [type, start, end, probs], sorted by start
    # the last merged span of each type: spans come in token order and widening to whole words keeps their starts
    # in order, so one that meets an earlier span of its type meets the last of that type (one look, not a scan)
    last: dict[str, list[Any]] = {}
    for i, (etype, a, b, ps) in enumerate(_bioes(offsets, label_ids, probs, labels, threshold)):
        if not i % EVERY:
            checkpoint()
        piece = text[a:b]
        a, b = a + len(piece) - len(piece.lstrip()), b - (len(piece) - len(piece.rstrip()))
        if a >= b:
            continue
        a, b = whole_words(text, a, b)
        same = last.get(etype)
        if same is not None and a <= same[2] and same[1] <= b:
            same[1], same[2] = min(same[1], a), max(same[2], b)
            same[3].extend(ps)
        else:
            last[etype] = span = [etype, a, b, list(ps)]
            merged.append(span)
    best: dict[tuple[int, int], Entity] = {}
    for etype, a, b, ps in merged:
        e = Entity(etype, text[a:b], float(np.mean(ps)), a, b)
        if (a, b) not in best or e.score > best[(a, b)].score:
            best[(a, b)] = e
    return sorted(best.values(), key=lambda e: (e.start, e.end))


def with_recognized(text: str, model: list[Entity], names: Sequence[str],
                    regions: Sequence[str] = ("US",)) -> list[Entity]:
    """Validated matches (score 1.0) added to the model's spans; a model span overlapping a match gives way. So does
    one inside a number of a checksum type whose check failed ("0044 0532" inside a mistyped IBAN is a piece of it,
    not a phone number: recognizers.scan), and a model phone number that is such a number whole."""
    found, spans = scan(text, names, regions)
    matches = [Entity(m.entity_type, text[m.start:m.end], 1.0, m.start, m.end, m.scheme, FOUND_BY[m.entity_type])
               for m in found]
    if not model:
        return matches
    taken = Taken.of(len(text), ((m.start, m.end) for m in matches))
    shaped = Containers(spans)
    kept = [e for e in model if not taken.overlaps(e.start, e.end)
            and not shaped.holds(e.start, e.end, e.entity_type in PHONE_LABELS)]
    return sorted(kept + matches, key=lambda e: (e.start, e.end))


FOUND_BY = {etype: name for name, etype in RECOGNIZED.items()}     # a recognizer's type → its name
PHONE_LABELS = frozenset({"PHONE", "PHONE_NUMBER", "PHONENUMBER", "TELEPHONE", "TELEPHONENUM"})


def with_rules(text: str, entities: list[Entity], rules: Rules, threshold: float) -> list[Entity]:
    """The deny list's values and the custom patterns' matches (those scoring at least `threshold`) added; a model
    span overlapping one gives way, and of overlapping matches the longer wins."""
    found: list[Found] = sorted((f for f in rules.found(text) if f.score >= threshold),
                                key=lambda f: (-(f.end - f.start), -f.score, f.start))
    if not found:
        return entities
    matches: list[Entity] = []
    taken = Taken(len(text))
    for i, f in enumerate(found):
        if not i % EVERY:
            checkpoint()
        if not taken.overlaps(f.start, f.end):
            taken.take(f.start, f.end)
            matches.append(Entity(f.entity_type, text[f.start:f.end], f.score, f.start, f.end, source=f.source,
                                  found=f))
    kept = [e for e in entities if not taken.overlaps(e.start, e.end)]
    return sorted(kept + matches, key=lambda e: (e.start, e.end))


# the address labels of PII models (rampart's, and the usual spellings of others)
ADDRESS_PARTS = frozenset({"BUILDING_NUMBER", "STREET_NAME", "STREET", "STREET_ADDRESS", "SECONDARY_ADDRESS", "CITY",
                           "STATE", "ZIP_CODE", "ZIPCODE", "POSTCODE", "POSTAL_CODE", "COUNTY", "ADDRESS"})
# words that belong to an address between its parts: unit words, and the particles of place names
_UNIT = frozenset({"apt", "apartment", "suite", "ste", "unit", "flat", "floor", "fl", "room", "rm", "no", "nr",
                   "bldg", "building", "block", "bis", "ter", "étage", "etage", "whg", "wohnung", "stock", "og", "#",
                   "appartement", "appt", "app", "bâtiment", "bat", "piso", "puerta", "interno", "scala"})
# street types: an address word wherever it stands between two parts ("12 rue de la Paix" labelled 12 ... Paix)
_STREETS = frozenset({"street", "st", "road", "rd", "avenue", "ave", "av", "boulevard", "blvd", "lane", "ln", "drive",
                      "dr", "way", "court", "ct", "place", "pl", "square", "sq", "terrace", "close", "crescent", "row",
                      "rue", "allée", "allee", "quai", "cours", "chemin", "impasse", "route", "passage", "straße",
                      "strasse", "str", "weg", "platz", "gasse", "ring", "damm", "ufer", "calle", "via", "viale",
                      "piazza", "corso", "plaza", "paseo", "ulica"})
_PARTICLES = frozenset({"am", "an", "der", "die", "im", "de", "la", "le", "les", "du", "des", "sur", "en", "upon",
                        "sous", "lès", "bei", "ob", "y", "del"})
_GAP_WORD = re.compile(r"[^\s,/()]+")
_STREET_PARTS = frozenset({"STREET_NAME", "STREET", "STREET_ADDRESS"})
_NUMBER_BEFORE = re.compile(r"(?<![\w.,-])\d{1,5}[A-Za-z]?(?:-\d{1,5})?\s+$")
_NUMBER_AFTER = re.compile(r"\s+\d{1,5}[A-Za-z]?(?:-\d{1,5})?(?![\w.-]|,\d)")
_UNIT_WORDS = r"apt|apartment|suite|ste|unit|flat|floor|room|bldg|building|wohnung|whg|appartement|appt|piso"
# a unit's designator: a number (12, 5B, 3-1), a letter and a number (B2), or one letter (Flat B) - never a word
_DESIGNATOR = r"(?:\d[\w-]{0,5}|[A-Za-z]\d[\w-]{0,4}|[A-Za-z](?![\w-]))"
_NEAR_UNIT = re.compile(rf"(?i)(?:\b(?:{_UNIT_WORDS})\.?\s*#?\s*{_DESIGNATOR}|#\s*{_DESIGNATOR})\s*,?\s*$")
_AFTER_UNIT = re.compile(rf"(?i)^\s*,?\s*(?:\b(?:{_UNIT_WORDS})\.?\s*#?\s*{_DESIGNATOR}|#\s*{_DESIGNATOR})")


def _gap_ok(text: str, a: int, b: int, weak: Callable[[int, int], bool]) -> bool:
    """Whether text[a:b], between two address parts, belongs to the same address: punctuation, unit words and their
    designators, capitalised place-name words and particles, or words the model gave an address label weakly."""
    gap = text[a:b]
    if len(gap) > 40 or any(ch in gap for ch in ";:!?") or "\n\n" in gap:
        return False
    words = list(_GAP_WORD.finditer(gap))
    if len(words) > 4:
        return False
    prev_unit = False
    for w in words:
        word = w.group().strip(".-")
        if not word:
            continue
        if not _address_word(word, prev_unit) and not weak(a + w.start(), a + w.end()):
            return False
        if w.group().endswith(".") and len(word) > 4 and w.end() < len(gap):   # a sentence ends in the gap
            return False
        prev_unit = word.lower() in _UNIT
    return True


def _address_word(word: str, after_unit: bool) -> bool:
    """A word that belongs to an address wherever it stands: a unit word or its designator, a particle, a street
    type, a short number, a capitalised place-name word."""
    low = word.lower()
    return (low in _UNIT or low in _PARTICLES or low in _STREETS or (after_unit and len(word) <= 6)
            or (any(ch.isdigit() for ch in word) and len(word) <= 6) or word[0].isupper())


def merge_addresses(text: str, entities: Sequence[Entity], weak: Callable[[int, int], bool]) -> list[Entity]:
    """Address parts (building number, street, secondary address, city, state, postcode) that follow each other
    within one address become one ADDRESS entity covering what lies between them, so no piece of the address stays
    readable; a unit (`Flat 3`, `Apt 5B`) just before or after is taken in. A lone part stays as it is, and no word
    outside the address is taken: a gap with a sentence end, a lowercase word the model did not label, or more
    than four words ends the address."""
    ordered = sorted(entities, key=lambda e: (e.start, e.end))
    out: list[Entity] = []
    group: list[Entity] = []

    def flush() -> None:
        if len(group) >= 2:
            a, b = group[0].start, max(e.end for e in group)
            first, last = group[0], max(group, key=lambda e: e.end)
            if first.entity_type in _STREET_PARTS:     # "350 Fifth Avenue": the building number the model missed
                number = _NUMBER_BEFORE.search(text, max(0, a - 12), a)
                a = number.start() if number is not None else a
            unit = _NEAR_UNIT.search(text, max(0, a - 24), a)
            if unit is not None and unit.end() == a:
                a = unit.start()
            if last.entity_type in _STREET_PARTS:      # "Hauptstraße 5"
                number = _NUMBER_AFTER.match(text, b)
                b = number.end() if number is not None else b
            after = _AFTER_UNIT.match(text, b)
            if after is not None:
                b = after.end()
            score = float(np.mean([e.score for e in group]))
            out.append(Entity("ADDRESS", text[a:b], score, a, b, source="model (address parts merged)"))
        else:
            out.extend(group)
        group.clear()

    end = 0                      # the end of the group's furthest part
    for i, e in enumerate(ordered):
        if not i % EVERY:
            checkpoint()
        if e.entity_type in ADDRESS_PARTS:
            if group and (e.start < group[-1].end or _gap_ok(text, end, e.start, weak)):
                group.append(e)
                end = max(end, e.end)
                continue
            flush()
            group.append(e)
            end = e.end
        else:
            flush()
            out.append(e)
    flush()
    return sorted(out, key=lambda e: (e.start, e.end))


def resolve_overlaps(entities: Sequence[Entity]) -> list[Entity]:
    """Non-overlapping spans: one contained in a larger one loses to it; otherwise the first by start wins."""
    kept: list[Entity] = []
    for e in sorted(entities, key=lambda e: (e.start, -(e.end - e.start))):
        if not kept or e.start >= kept[-1].end:
            kept.append(e)
    return kept


def redact(text: str, entities: Sequence[Entity], mode: str = "mask", mask_char: str = "*",
           replacement: str | None = None, salt: bytes = b"") -> str:
    """The text with every (overlap-resolved) entity masked, removed, replaced by `<TYPE>` or hashed."""
    return redact_spans(text, entities, Replacer(mode, mask_char, replacement, salt))[0]


def redact_spans(text: str, entities: Sequence[Entity], replacer: Replacer) -> tuple[str, list[Redacted]]:
    """(the redacted text, each applied span with its replacement and where that sits in the redacted text).
    Spans inside a larger one are covered by it and not listed on their own."""
    out, done = rewrite(text, entities, lambda e, value: replacer(e.entity_type, value),
                        "replacement" if replacer.mode in ("replace", "pseudonym", "numbered") else "mode")
    return out, [Redacted(e.entity_type, e.score, e.start, e.end, new, a, b) for e, new, a, b in done]


# a redacted text is at most ANSWER_GROWTH times its input plus ANSWER_SLACK characters: replacements longer than
# what they stand in for (a template, a hash) cannot turn a small request into a huge answer (a 209 KB body of
# one-letter spans with a 2 KB `replacement` was a 400 MB answer); past it, a 413 says so before the text is built
ANSWER_GROWTH = 4
ANSWER_SLACK = 4096


def answer_limit(text: str) -> int:
    return ANSWER_GROWTH * len(text) + ANSWER_SLACK


def rewrite(text: str, entities: Sequence[Entity], new_value: Callable[[Entity, str], str], param: str = "mode"
            ) -> tuple[str, list[tuple[Entity, str, int, int]]]:
    """The text with each (overlap-resolved) entity's value replaced by `new_value(entity, value)`, and for each
    entity what now stands in its place and where: (entity, new value, start, end in the new text). PayloadTooLarge
    (naming `param`, what made it grow) when the new text would pass `answer_limit`."""
    out: list[str] = []
    done: list[tuple[Entity, str, int, int]] = []
    pos = length = 0
    limit = answer_limit(text)
    for i, e in enumerate(resolve_overlaps(entities)):
        if not i % EVERY:
            checkpoint()
        before = text[pos:e.start]
        out.append(before)
        length += len(before)
        new = new_value(e, text[e.start:e.end])
        out.append(new)
        done.append((e, new, length, length + len(new)))
        length += len(new)
        if length > limit:
            raise PayloadTooLarge(f"the redacted text would be longer than {limit} characters ({ANSWER_GROWTH}x its "
                                  f"input of {len(text)}, plus {ANSWER_SLACK}): the replacements are longer than the "
                                  f"spans they stand in for; use a shorter `{param}` value, or mask", param=param)
        pos = e.end
    out.append(text[pos:])
    return "".join(out), done


MAX_LABELS = 64             # labels one GLiNER prompt may hold (pii_labels)
MAX_LABEL_CHARS = 100       # characters of one label
ENTITY_TYPE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
# what an open-label model is asked for: label texts (each answers as its pii_labels type, else as the label written
# UPPER_SNAKE), or label text -> the entity type it answers as
Labels = Sequence[str] | Mapping[str, str]


def check_labels(labels: dict[str, str] | None) -> list[tuple[str, str]]:
    """pii_labels: at most MAX_LABELS labels of 1 to MAX_LABEL_CHARS characters, each mapped to an entity type
    written as rsinfer's and Presidio's are (UPPER_SNAKE)."""
    if labels is None:
        return []
    if not labels:
        return [("pii_labels", "empty: name at least one label, or leave it unset for the defaults")]
    if len(labels) > MAX_LABELS:
        return [("pii_labels", f"{len(labels)} labels; at most {MAX_LABELS}")]
    errors = []
    for label, etype in labels.items():
        if not label.strip() or len(label) > MAX_LABEL_CHARS:
            errors.append((f"pii_labels[{label[:40]!r}]", f"a label is 1 to {MAX_LABEL_CHARS} characters"))
        elif not isinstance(etype, str) or not ENTITY_TYPE.fullmatch(etype):
            errors.append((f"pii_labels[{label!r}]", f"entity type {etype!r} must be UPPER_SNAKE_CASE, e.g. "
                                                     "EMPLOYEE_ID"))
    return errors


@dataclass(frozen=True)
class PiiOptions:
    """The pii family's model keys."""

    # a token's label probability needed to be part of an entity (a request's `threshold` overrides)
    threshold: float = opt(0.5, ge=0, le=1)
    # the salt of `hash` mode; unset: random per process (equal values hash equal only within one)
    pii_hash_salt: str | None = None
    # mode `pseudonym`'s key: a file holding at least 128 bits as hex or base64 (unset: $RSINFER_PSEUDONYM_KEY; the
    # key is never logged nor answered)
    pii_pseudonym_key_file: str | None = None
    # how a pseudonym is written: {type}, {hash} (its first pii_pseudonym_width hex characters of the HMAC) and
    # {key_id} (four hex characters naming the key, to tell tokens of a rotated key apart)
    pii_pseudonym_template: str = "<{type}_{hash}>"
    # hex characters of a pseudonym's HMAC (8: 32 bits; see docs/records.md for the collision rates)
    pii_pseudonym_width: int = opt(8, ge=4, le=64)
    # pattern recognizers beside the model, each validating what it finds; [] turns them off
    pii_recognizers: tuple[str, ...] = opt(DEFAULT_RECOGNIZERS, choices=RECOGNIZERS)
    pii_regions: tuple[str, ...] = ("US",)      # phone numbering plans and national-id schemes to recognise
    pii_merge: tuple[str, ...] = opt(("address",), choices=("address",))   # address parts → one ADDRESS
    # a word between two address parts belongs to the address when the model gave it an address label with at
    # least this probability (below `threshold`, so it was not labelled)
    address_gap_threshold: float = opt(0.2, ge=0, le=1)
    # pattern recognizers of your own: {entity_type, regex, name, validator, context, score} (pipelines/pii_rules.py)
    pii_patterns: tuple[PatternSpec, ...] = ()
    # values never redacted (compared after NFKC normalisation and case folding; regex: RE2, whole text)
    allow_list: tuple[str, ...] = ()
    # exact (NFKC normalised, case folded) | regex (RE2; the whole value must match)
    allow_list_match: str = opt("exact", choices=("exact", "regex"))
    # values always redacted, by entity type: {EMPLOYEE_NAME: [Jane Roe]} (whole words, any case)
    deny_list: dict[str, tuple[str, ...]] | None = None
    # the languages Presidio's `language` may name for this model (another is a 400)
    pii_languages: tuple[str, ...] = ("en",)
    # a GLiNER model (gliner_config.json): the labels it is asked for, each with the entity type it answers as
    # ({"person": PERSON, "employee id": EMPLOYEE_ID}); unset: person, organization, location, email, phone number,
    # address and date of birth (pipelines/pii_gliner.py)
    pii_labels: dict[str, str] | None = None

    def rules(self) -> Rules:
        """The patterns and lists compiled (InputError naming the key of a bad one)."""
        patterns = [Pattern(spec, f"pii_patterns[{i}]") for i, spec in enumerate(self.pii_patterns)]
        return Rules.of(patterns, self.allow_list, self.allow_list_match == "regex", self.deny_list)

    def check(self) -> list[tuple[str, str]]:
        errors = []
        errors += check_labels(self.pii_labels)
        try:
            self.rules()
        except InputError as exc:
            where, _, why = exc.message.partition(": ")
            errors.append((where, why))
        unknown = check_regions(self.pii_regions)
        for region in unknown:
            i = self.pii_regions.index(region)
            errors.append((f"pii_regions[{i}]", f"unknown region {region!r}: an ISO 3166 code phonenumbers "
                                                f"knows (US, GB, DE, FR, ...)"))
        if "national_id" in self.pii_recognizers and not unknown \
                and not any(r in ID_REGIONS for r in self.pii_regions):
            errors.append(("pii_recognizers", f"national_id has no scheme in regions {', '.join(self.pii_regions)} "
                                              f"(national ids are recognised for {', '.join(ID_REGIONS)}; US "
                                              "social security numbers are the `ssn` recognizer's)"))
        return errors


class PiiPipeline(TextPipeline):
    kind = "pii"
    ragged = True

    def __init__(self, model: LoadedModel) -> None:
        super().__init__(model)
        cfg = model.config
        opts = cfg.own(PiiOptions)
        if opts.pii_labels is not None:
            raise ModelLoadError(f"model '{cfg.name}': pii_labels name what an open-label (GLiNER) model is asked for, "
                                 "and this folder has no gliner_config.json: it is a token classifier, which finds "
                                 "the labels of its config.json id2label; drop pii_labels, or point path at a GLiNER "
                                 "folder", model=cfg.name)
        self.labels = id2label(model)
        self.output = pick_output(model, LOGIT_OUTPUTS)
        shape = self.output_shape(self.output)
        if len(shape) != 3:
            raise ModelLoadError(f"model '{cfg.name}': pii output '{self.output}' has shape {list(shape)}; "
                                 "expected [batch, seq, labels]", model=cfg.name)
        if isinstance(shape[-1], int) and shape[-1] != len(self.labels):
            raise ModelLoadError(f"model '{cfg.name}': the graph has {shape[-1]} labels but config.json id2label "
                                 f"has {len(self.labels)}", model=cfg.name)
        self.address_columns = [i for i, label in enumerate(self.labels) if parse_tag(label)[1] in ADDRESS_PARTS]
        self.setup(opts, {parse_tag(label)[1] for label in self.labels} - {""}, bool(self.address_columns))
        tok = self.encoder.tokenizer
        probe, bare = tok.encode("x", add_special_tokens=True).ids, tok.encode("x", add_special_tokens=False).ids
        at = next((i for i in range(len(probe)) if probe[i:i + len(bare)] == bare), 0)
        self.prefix, self.suffix = probe[:at], probe[at + len(bare):]
        max_len = model.max_len or 512
        self.window = max_len - len(self.prefix) - len(self.suffix)
        if self.window < 8:
            raise ModelLoadError(f"model '{cfg.name}': max_len {max_len} leaves no room for text", model=cfg.name)
        self.overlap = max(max_len // 4, 1) if self.window > max_len // 4 else self.window // 2

    def setup(self, opts: PiiOptions, model_types: set[str], address_parts: bool) -> None:
        """What every PII model has beside its own: recognizers, rules, merging, threshold, salt and key."""
        cfg = self.model.config
        self.recognizers = opts.pii_recognizers
        self.regions = tuple(r.upper() for r in opts.pii_regions)
        self.rules = opts.rules()          # the entry's own patterns, allow and deny lists (pii_rules.py)
        # load phonenumbers' metadata and python-stdnum's tables now, not on the first request (~50 ms)
        recognize("+1 415 555 0100, DE89 3704 0044 0532 0130 00, 4111 1111 1111 1111", self.recognizers,
                  self.regions)
        self.merge = opts.pii_merge
        self.gap_threshold = opts.address_gap_threshold
        merged = {"ADDRESS"} if "address" in self.merge and address_parts else set()
        self.types = sorted(model_types | {RECOGNIZED[r] for r in self.recognizers} | merged | set(self.rules.types))
        self.threshold = opts.threshold
        self.languages = opts.pii_languages
        self.salt_source = "pii_hash_salt" if opts.pii_hash_salt else \
            "random per process (set pii_hash_salt for stable hashes)"
        self.salt = opts.pii_hash_salt.encode("utf-8") if opts.pii_hash_salt else secrets.token_bytes(16)
        try:
            key = key_from(opts.pii_pseudonym_key_file, f"model '{cfg.name}': pii_pseudonym_key_file")
            self.pseudonyms = None if key is None else Pseudonyms(key, opts.pii_pseudonym_template,
                                                                  opts.pii_pseudonym_width, self.regions[0])
        except ConfigError as exc:
            raise ModelLoadError(exc.message, model=cfg.name) from None

    def replacer(self, mode: str = "mask", mask_char: str = "*", replacement: str | None = None,
                 salt: bytes | None = None, key: bytes | None = None) -> Replacer:
        """A redaction's replacer (InputError naming a bad option): `salt` and `key` (a run's own, never a
        request's) default to the model's."""
        pseudonyms = self.pseudonyms
        if key is not None:
            template = pseudonyms.template if pseudonyms is not None else "<{type}_{hash}>"
            width = pseudonyms.width if pseudonyms is not None else 8
            try:
                pseudonyms = Pseudonyms(key, template, width, self.regions[0])
            except ConfigError as exc:
                raise InputError(exc.message, param="key") from None
        return Replacer(mode, mask_char, replacement, self.salt if salt is None else salt, pseudonyms,
                        self.regions[0])

    def describe(self) -> dict[str, Any]:
        return {"kind": "pii", "output": self.output, "labels": self.labels, "entity_types": self.types,
                "threshold": self.threshold, "window_tokens": self.window, "window_overlap": self.overlap,
                "recognizers": list(self.recognizers), "regions": list(self.regions), "merge": list(self.merge),
                "hash_salt": self.salt_source,
                "pseudonym_key": f"set (key id {self.pseudonyms.key_id})" if self.pseudonyms else "unset",
                **({"rules": self.rules.describe()} if not self.rules.empty else {})}

    def reduce(self, out: Array, mask: Array) -> Array:
        return softmax(out.astype(np.float32, copy=False))

    def windows_of(self, n: int) -> list[tuple[int, int]]:
        return plan_windows(n, self.window, self.overlap)

    def plan_probs(self, texts: Sequence[str], timing: Timing, labels: Labels | None = None
                   ) -> tuple[Encoded, Callable[[list[Any]], list[tuple[Any, Array]]]]:
        """Window rows of every text, and how their per-token rows stitch back to one row per token per text."""
        t0 = time.perf_counter()
        encs = encode_batch(self.encoder.tokenizer, list(texts), add_special_tokens=False)
        plan: list[tuple[int, list[tuple[int, int]]]] = []
        ids: list[list[int]] = []
        type_ids: list[list[int]] = []
        for enc in encs:
            tokens = enc.ids       # a new list of every id at each read of .ids: once per text, not per window
            wins = self.windows_of(len(tokens))
            plan.append((len(ids), wins))
            for s, e in wins:
                row = self.prefix + tokens[s:e] + self.suffix
                ids.append(row)
                type_ids.append([0] * len(row))
        timing.tokenize_s += time.perf_counter() - t0
        p, q = len(self.prefix), len(self.suffix)

        def per_text(rows: list[Any]) -> list[tuple[Any, Array]]:
            out = []
            for enc, (first, wins) in zip(encs, plan, strict=True):
                parts = [rows[first + k][p: len(rows[first + k]) - q] for k in range(len(wins))]
                probs = stitch(wins, parts) if len(enc) else np.empty((0, len(self.labels)), dtype=np.float32)
                out.append((enc, probs))
            return out

        return Encoded(ids=ids, type_ids=type_ids), per_text

    def check_labels(self, labels: Labels | None, param: str = "labels") -> set[str]:
        """A request's own `labels` (an open-label model's; InputError here): the entity types they add."""
        if labels is not None:
            raise InputError(f"`{param}` needs an open-label (GLiNER) model; model '{self.model.name}' finds the "
                             f"types it was trained on: {', '.join(self.types)}", param=param)
        return set()

    def open_labels(self, entities: Sequence[str], named: Callable[[str], str]) -> dict[str, str] | None:
        """Presidio's `entities` as what an open-label model is asked for: its configured labels and every entity
        none of them answers as (`named`: an entity type as the caller names it), that entity being both the label
        and its type; None: the configured labels (a closed model finds what it was trained on)."""
        return None

    def check_options(self, threshold: float | None, types: Sequence[str] | None, rules: Rules | None = None,
                      texts: Sequence[str] = (), labels: Labels | None = None) -> None:
        """`threshold` in [0, 1], `types` among what the model (asked for `labels`), the recognizers and the rules
        can find, and a request's own patterns within their work limit over `texts` (InputError)."""
        check_threshold(threshold)
        added = self.check_labels(labels)
        if rules is not None:
            rules.check_work(texts)
        if types is not None:
            known = set(self.types) | added | set(rules.types if rules is not None else ())
            unknown = [t for t in types if t not in known]
            if unknown:
                raise InputError(f"unknown entity type(s) {', '.join(map(repr, unknown))}; this model finds "
                                 f"{', '.join(self.types)}", param="types")

    def _entities(self, texts: Sequence[str], per_text: list[tuple[Any, Array]], threshold: float | None,
                  types: Sequence[str] | None, rules: Rules | None = None,
                  rule_threshold: float | None = None) -> list[list[Entity]]:
        """`rule_threshold`: the score the patterns' and deny lists' matches need (default: `threshold`)."""
        thr = self.threshold if threshold is None else float(threshold)
        rules = self.rules if rules is None else self.rules.merged(rules)
        keep = set(types) if types is not None else None
        if keep is not None and keep & ADDRESS_PARTS:
            keep.add("ADDRESS")             # an address asked for by its parts comes whole
        found = []
        for text, item in zip(texts, per_text, strict=True):
            checkpoint()
            ents = self.model_entities(text, item, thr)
            if not rules.empty:
                ents = with_rules(text, ents, rules, thr if rule_threshold is None else rule_threshold)
            if self.recognizers:
                ents = with_recognized(text, ents, self.recognizers, self.regions)
            weak = self.weak_of(item) if "address" in self.merge else None
            if weak is not None:
                ents = merge_addresses(text, ents, weak)
            found.append([e for e in ents if (keep is None or e.entity_type in keep) and not rules.allowed(e.text)])
        return found

    def model_entities(self, text: str, item: Any, threshold: float) -> list[Entity]:
        """The model's own entities in one text, from its part of the rows' outputs (`per_text`'s item)."""
        enc, probs = item
        return decode(text, enc.offsets, probs.argmax(axis=-1), probs.max(axis=-1), self.labels, threshold) \
            if len(probs) else []

    def weak_of(self, item: Any) -> Callable[[int, int], bool] | None:
        """How address merging asks whether a gap between two parts is address (None: no merging for it)."""
        enc, probs = item
        return self._weak(enc.offsets, probs) if self.address_columns and len(probs) else None

    def _weak(self, offsets: Sequence[tuple[int, int]], probs: Array) -> Callable[[int, int], bool]:
        """Whether a token within [a, b) has an address label with at least address_gap_threshold probability."""
        address: list[float] = []     # summed on the first question: most texts have no gap to judge
        ends = [e for _, e in offsets]     # the tokens' ends, in order (pieces do not overlap)

        def weak(a: int, b: int) -> bool:
            if not address:
                address.extend(probs[:, self.address_columns].sum(axis=-1).tolist())
            i = bisect_right(ends, a)      # the first token ending after a
            while i < len(ends) and offsets[i][0] < b:
                if offsets[i][1] > a and address[i] >= self.gap_threshold:
                    return True
                i += 1
            return False

        return weak

    def plan_detect(self, texts: Sequence[str], threshold: float | None = None,
                    types: Sequence[str] | None = None, rules: Rules | None = None,
                    rule_threshold: float | None = None, labels: Labels | None = None) -> Work[Detection]:
        """`rules`: a request's own patterns, allow and deny lists (pii_rules.request_rules), beside the entry's;
        `rule_threshold`: the score their matches need (default `threshold`; Presidio's score_threshold); `labels`:
        what an open-label model is asked for instead of its configured labels."""
        self.check_options(threshold, types, rules, texts, labels)
        check_threshold(rule_threshold, "score_threshold")
        timing = Timing()
        enc, per_text = self.plan_probs(texts, timing, labels)
        return self.work(enc, lambda rows: Detection(self._entities(texts, per_text(rows), threshold, types, rules,
                                                                    rule_threshold), timing), timing)

    def plan_detect_groups(self, groups: Sequence[tuple[Sequence[str], float | None, Sequence[str] | None]],
                           rules: Rules | None = None) -> Work[Detection]:
        """Several lists of texts, each with its own (threshold, types), in one request's work (a record policy's
        fields): the entities of every text, group after group."""
        timing = Timing()
        parts = []
        encs = []
        for texts, threshold, types in groups:
            self.check_options(threshold, types, rules, texts)
            enc, per_text = self.plan_probs(texts, timing)
            parts.append((len(enc.ids), texts, threshold, types, per_text))
            encs.append(enc)

        def finish(rows: list[Any]) -> Detection:
            found: list[list[Entity]] = []
            at = 0
            for n, texts, threshold, types, per_text in parts:
                found += self._entities(texts, per_text(rows[at:at + n]), threshold, types, rules)
                at += n
            return Detection(found, timing)

        return self.work(self.joined(encs), finish, timing)

    def joined(self, encs: Sequence[Any]) -> Any:
        """Several plan_probs rows as one work's (plan_detect_groups)."""
        return Encoded(ids=[i for e in encs for i in e.ids], type_ids=[t for e in encs for t in (e.type_ids or [])])

    def plan_redact(self, texts: Sequence[str], *, mode: str = "mask", mask_char: str = "*",
                    replacement: str | None = None, threshold: float | None = None,
                    types: Sequence[str] | None = None, salt: bytes | None = None,
                    rules: Rules | None = None, key: bytes | None = None,
                    labels: Labels | None = None) -> Work[Redaction]:
        """Each text is a record of its own (numbered mode counts from 1 in each)."""
        replacer = self.replacer(mode, mask_char, replacement, salt, key)  # the options checked before any work
        self.check_options(threshold, types, rules, texts, labels)
        timing = Timing()
        enc, per_text = self.plan_probs(texts, timing, labels)

        def finish(rows: list[Any]) -> Redaction:
            det = Detection(self._entities(texts, per_text(rows), threshold, types, rules), timing)
            done = [redact_spans(t, ents, replacer.record())
                    for t, ents in zip(texts, det.entities, strict=True)]
            return Redaction([d[0] for d in done], det, [d[1] for d in done])

        return self.work(enc, finish, timing)

    def detect(self, texts: Sequence[str], threshold: float | None = None,
               types: Sequence[str] | None = None, rules: Rules | None = None,
               labels: Labels | None = None) -> Detection:
        return self.run(self.plan_detect(texts, threshold, types, rules, labels=labels))

    def redact(self, texts: Sequence[str], **kw: Any) -> Redaction:
        return self.run(self.plan_redact(texts, **kw))


def quality(a: PiiPipeline, b: PiiPipeline, texts: Sequence[str]) -> dict[str, float]:
    """What b loses against a (the quality gate): the F1 of b's spans (type, start, end) against a's."""
    from .quality import span_f1

    def spans(pipe: PiiPipeline) -> list[list[tuple[str, int, int]]]:
        return [[(e.entity_type, e.start, e.end) for e in ents] for ents in pipe.detect(texts).entities]

    want, got = spans(a), spans(b)
    return {"span_f1": span_f1(want, got), "spans": float(sum(map(len, want)))}
