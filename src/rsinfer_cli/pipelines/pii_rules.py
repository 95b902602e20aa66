"""What a data team adds to PII detection: pattern recognizers of its own (employee numbers, ticket ids), values never
redacted (an allow list) and values always redacted (a deny list) - in the model entry, and per request (Presidio's
`ad_hoc_recognizers`, `allow_list`, `deny_list`).

- A pattern's regular expressions run on RE2 (google-re2): linear time in the text, whatever the pattern, so a
  pattern that would backtrack catastrophically in Python's `re` (`(a+)+$`) cannot stall a request. RE2 has no
  backreferences or lookaround; a pattern that uses them is refused when it is compiled, with the reason.
- `validator`: `luhn`, `iban`, or a python-stdnum module by name (`stdnum.ean`, `stdnum.de.idnr`); a match that
  fails it is dropped. `context`: words that raise the score by 0.35 (at most 1.0) when one stands among the five
  words before the match (Presidio's context enhancer, its defaults). A match is kept when its score reaches the
  request's threshold.
- The allow list: an entity whose whole text is an allowed value is never redacted nor reported. Values compare
  after Unicode NFKC normalisation and case folding ("ACME GmbH" allows "Acme GmbH"); with `allow_list_match:
  regex`, each entry is an RE2 expression that must match the whole text.
- The deny list: `{ENTITY_TYPE: [values]}`; each value is found as a whole word (not inside a longer word),
  ignoring case, and always redacted as that type.
"""

from __future__ import annotations

import importlib
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..config import opt
from ..engine.cancel import checkpoint
from ..errors import InputError
from .spans import EVERY

CONTEXT_BOOST = 0.35          # Presidio's context_similarity_factor
CONTEXT_FLOOR = 0.4           # Presidio's min_score_with_context_similarity
CONTEXT_WORDS = 5             # words before a match searched for context (Presidio's prefix count)
MAX_PATTERNS = 32             # per request
MAX_REGEXES = 8               # per pattern
MAX_REGEX_CHARS = 1000
MAX_VALUES = 1000             # allow values, and deny values of all types together, per request, each of at most
MAX_VALUE_CHARS = 200
# a request's regular expression over a text: its RE2 program size x the text's characters. RE2 is linear in the
# text but, when its DFA runs out of memory, proportional to the program too: 8 ns per unit measured for a 4,925-
# instruction program over 100,000 characters (3.9 s); under ~1,000 instructions it keeps to its DFA (0.04 ns).
# 100M units is under 1 s at the worst measured; a usual id pattern (10-50 instructions) passes over any text
# max_text_chars allows. Between expressions (and every 1,024 matches) the request's deadline is checked
MAX_REGEX_WORK = 100_000_000
DENY_WINDOW = 65_536          # the deny list's scan is checked against the deadline every this many characters
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class PatternSpec:
    """A pattern recognizer of your own (`pii_patterns` in the model entry; a request's `patterns`)."""

    # the entity type its matches get (EMPLOYEE_ID)
    entity_type: str
    # RE2 regular expressions (a string or a list): no backreferences or lookaround, linear time
    regex: tuple[str, ...] = opt((), one_or_many=True)
    # its name, for `describe` and errors (default: the entity type)
    name: str | None = None
    # luhn | iban | a python-stdnum module (stdnum.ean, stdnum.de.idnr): a match that fails it is dropped
    validator: str | None = None
    # words that raise the score by 0.35 when one stands among the five words before a match
    context: tuple[str, ...] = ()
    # the score of a match (kept when it reaches the threshold)
    score: float = opt(0.85, ge=0, le=1)


@dataclass(frozen=True)
class Found:
    entity_type: str
    start: int
    end: int
    score: float
    source: str = "deny_list"     # the pattern's name, or the deny list
    regex: str | None = None      # the expression that matched (a pattern's)
    original_score: float | None = None    # before context raised it
    context_word: str = ""        # the context word that raised it


def _validator(name: str, where: str) -> Callable[[str], bool]:
    """`luhn`, `iban` or `stdnum.<module>` → its `is_valid`."""
    module = {"luhn": "stdnum.luhn", "iban": "stdnum.iban"}.get(name, name)
    if not module.startswith("stdnum."):
        raise InputError(f"{where}.validator: '{name}' is not luhn, iban or a python-stdnum module "
                         "(stdnum.ean, stdnum.de.idnr, ...)", param=f"{where}.validator")
    try:
        valid = importlib.import_module(module).is_valid
    except (ImportError, AttributeError):
        raise InputError(f"{where}.validator: python-stdnum has no module '{module}' with is_valid",
                         param=f"{where}.validator") from None
    digits_only = name == "luhn"

    def check(value: str) -> bool:
        """A value the validator cannot judge (python-stdnum raising on a 5,000-digit match) is not valid."""
        try:
            return bool(valid(re.sub(r"\D", "", value) if digits_only else value))
        except Exception:  # noqa: BLE001 - a validator's failure is its verdict on this value, never the request's
            return False

    return check


def compile_re2(expr: str, where: str, spans_only: bool = False) -> Any:
    """`spans_only`: no capturing groups (RE2's never_capture) - only where a match's span is all that is read: RE2
    then finds it with its DFA alone, without the submatch engine (`(.*a){20}` over 100k characters: 100 -> 1 ms)."""
    import re2

    if len(expr) > MAX_REGEX_CHARS:
        raise InputError(f"{where}: a regular expression of {len(expr)} characters; at most {MAX_REGEX_CHARS}",
                         param=where)
    options = re2.Options()
    options.log_errors = False           # the error is ours to report, not RE2's to print on stderr
    options.never_capture = spans_only
    try:
        return re2.compile(expr, options)
    except re2.error as exc:   # RE2 says why: a backreference, a lookaround, a syntax error
        why = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise InputError(f"{where}: {expr!r} is not an RE2 regular expression: {why}", param=where) from None


class Pattern:
    def __init__(self, spec: PatternSpec, where: str) -> None:
        if not spec.entity_type or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", spec.entity_type):
            raise InputError(f"{where}.entity_type: '{spec.entity_type}' is not an entity type (letters, digits, "
                             "underscores and hyphens: EMPLOYEE_ID)", param=f"{where}.entity_type")
        if not spec.regex:
            raise InputError(f"{where}.regex: a pattern needs at least one regular expression", param=f"{where}.regex")
        if len(spec.regex) > MAX_REGEXES:
            raise InputError(f"{where}.regex: {len(spec.regex)} regular expressions; at most {MAX_REGEXES}",
                             param=f"{where}.regex")
        self.name = spec.name or spec.entity_type
        self.entity_type = spec.entity_type
        self.where = where
        self.regexes = [compile_re2(r, f"{where}.regex[{i}]", spans_only=True) for i, r in enumerate(spec.regex)]
        self.sources = spec.regex
        self.valid = _validator(spec.validator, where) if spec.validator else None
        self.context = frozenset(unicodedata.normalize("NFKC", w).casefold() for w in spec.context)
        self.score = spec.score

    def check_work(self, chars: int) -> None:
        """InputError naming the expression whose program over a text of `chars` characters is past
        MAX_REGEX_WORK."""
        for i, rx in enumerate(self.regexes):
            if rx.programsize * chars > MAX_REGEX_WORK:
                where = f"{self.where}.regex[{i}]"
                raise InputError(f"{where}: an RE2 program of {rx.programsize} instructions over a text of {chars} "
                                 f"characters is past the limit of {MAX_REGEX_WORK:,} instruction-characters per "
                                 "expression; simplify the expression (bounded repeats inside repeats grow its "
                                 "program) or send shorter texts", param=where.split("[")[0])

    def find(self, text: str) -> list[Found]:
        out: list[Found] = []
        seen: set[tuple[int, int]] = set()
        for rx, source in zip(self.regexes, self.sources, strict=True):
            checkpoint()
            for n, m in enumerate(rx.finditer(text)):
                if not n % EVERY:
                    checkpoint()
                a, b = m.span()
                if a == b or (a, b) in seen:
                    continue
                seen.add((a, b))
                if self.valid is not None and not self.valid(text[a:b]):
                    continue
                score, word = self.score, self._context_word(text, a) if self.context else ""
                if word:    # Presidio's enhancer: raised by 0.35, to at least 0.4, at most 1.0
                    score = max(min(1.0, score + CONTEXT_BOOST), CONTEXT_FLOOR)
                out.append(Found(self.entity_type, a, b, score, self.name, source, self.score, word))
        return out

    def _context_word(self, text: str, start: int) -> str:
        """The first context word among the words before `start` ("" when none is)."""
        words = _WORD.findall(text[max(0, start - 200):start])[-CONTEXT_WORDS:]
        return next((w for w in words if unicodedata.normalize("NFKC", w).casefold() in self.context), "")


def normalise(value: str) -> str:
    return unicodedata.normalize("NFKC", value).casefold()


@dataclass(frozen=True)
class Rules:
    """Patterns, allow and deny lists, compiled (`Rules.of`): the model entry's, or the entry's with a request's
    added (`merged`)."""

    patterns: tuple[Pattern, ...] = ()
    allow_values: frozenset[str] = frozenset()        # normalised (NFKC, case folded)
    allow_regexes: tuple[Any, ...] = ()               # RE2, matching the whole value
    deny: tuple[tuple[str, re.Pattern[str]], ...] = ()  # (entity type, its values as one whole-word pattern)

    @classmethod
    def of(cls, patterns: Sequence[Pattern] = (), allow: Sequence[str] = (), allow_regex: bool = False,
           deny: Mapping[str, Sequence[str]] | None = None) -> Rules:
        return cls(
            patterns=tuple(patterns),
            allow_values=frozenset() if allow_regex else frozenset(normalise(v) for v in allow),
            allow_regexes=tuple(compile_re2(v, f"allow_list[{i}]") for i, v in enumerate(allow)) if allow_regex
            else (),
            deny=tuple((t, re.compile(r"(?<!\w)(?:" + "|".join(re.escape(v) for v in sorted(vs, key=len,
                                                                                          reverse=True))
                                      + r")(?!\w)", re.IGNORECASE)) for t, vs in (deny or {}).items() if vs))

    @property
    def types(self) -> list[str]:
        return sorted({p.entity_type for p in self.patterns} | {t for t, _ in self.deny})

    @property
    def empty(self) -> bool:
        return not (self.patterns or self.allow_values or self.allow_regexes or self.deny)

    def found(self, text: str) -> list[Found]:
        """The deny list's values (score 1.0) and the patterns' matches in `text`."""
        out = [Found(t, a, b, 1.0) for t, rx in self.deny for a, b in _windowed(rx, text)]
        for p in self.patterns:
            out.extend(p.find(text))
        return out

    def check_work(self, texts: Sequence[str]) -> None:
        """A request's patterns held to MAX_REGEX_WORK over its longest text (InputError naming the expression)."""
        longest = max(map(len, texts), default=0)
        for p in self.patterns:
            p.check_work(longest)

    def allowed(self, value: str) -> bool:
        if self.allow_values and normalise(value) in self.allow_values:
            return True
        return any(rx.fullmatch(value) is not None for rx in self.allow_regexes)

    def describe(self) -> dict[str, Any]:
        return {"patterns": [{"name": p.name, "entity_type": p.entity_type} for p in self.patterns],
                "allow_list": len(self.allow_values) + len(self.allow_regexes),
                "deny_list": sorted({t for t, _ in self.deny})}

    def merged(self, other: Rules) -> Rules:
        return Rules(self.patterns + other.patterns, self.allow_values | other.allow_values,
                     self.allow_regexes + other.allow_regexes, self.deny + other.deny)


def _windowed(rx: re.Pattern[str], text: str) -> list[tuple[int, int]]:
    """rx.finditer(text)'s spans, the same ones, found window by window of DENY_WINDOW characters with a deadline
    checkpoint between windows (one finditer over a 1,000,000-character text with 1,000 values is ~12 s of CPU that
    nothing could stop). A deny value is at most MAX_VALUE_CHARS long, so a match that starts in a window is decided
    by the characters up to MAX_VALUE_CHARS + 1 past it; its lookbehind sees the text before the window."""
    out: list[tuple[int, int]] = []
    n, pos = len(text), 0
    while pos < n:
        checkpoint()
        stop = min(n, pos + DENY_WINDOW)
        reach = n if stop == n else min(n, stop + MAX_VALUE_CHARS + 2)
        for m in rx.finditer(text, pos, reach):
            if m.start() >= stop:
                break
            out.append(m.span())
            stop = max(stop, m.end())
        pos = stop
    return out


def request_rules(patterns: Sequence[Mapping[str, Any]] | None, allow: Sequence[str] | None, allow_match: str,
                  deny: Mapping[str, Sequence[str]] | None) -> Rules | None:
    """A request's own rules (bounded: at most 32 patterns, 1000 allow or deny values), or None without any."""
    if not patterns and not allow and not deny:
        return None
    if allow_match not in ("exact", "regex"):
        raise InputError(f"`allow_list_match` must be exact or regex, got '{allow_match}'", param="allow_list_match")
    compiled = []
    for i, raw in enumerate(patterns or ()):
        if i >= MAX_PATTERNS:
            raise InputError(f"{len(patterns or ())} patterns; at most {MAX_PATTERNS} a request", param="patterns")
        compiled.append(Pattern(spec_of(raw, f"patterns[{i}]"), f"patterns[{i}]"))
    values = list(allow or ())
    denied = {str(t): list(vs) for t, vs in (deny or {}).items()}
    _check_lists(values, denied)
    return Rules.of(compiled, values, allow_match == "regex", denied)


def _check_lists(values: list[str], denied: dict[str, list[str]]) -> None:
    """A request's allow and deny lists within MAX_VALUES (deny: all types together) of 1 to MAX_VALUE_CHARS
    characters, each deny type an entity type (InputError naming the key)."""
    for what, vals in (("allow_list", values), *((f"deny_list.{t}", vs) for t, vs in denied.items())):
        if len(vals) > MAX_VALUES or any(len(v) > MAX_VALUE_CHARS or not v for v in vals):
            raise InputError(f"{what}: at most {MAX_VALUES} values of 1 to {MAX_VALUE_CHARS} characters",
                             param=what.split(".")[0])
    total = sum(map(len, denied.values()))
    if total > MAX_VALUES:
        raise InputError(f"deny_list: {total} values over {len(denied)} entity types; at most {MAX_VALUES} a "
                         "request, all types together", param="deny_list")
    for t in denied:
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", t):
            raise InputError(f"deny_list: '{t}' is not an entity type (letters, digits, underscores and hyphens)",
                             param="deny_list")


def spec_of(raw: Mapping[str, Any], where: str) -> PatternSpec:
    """A request's pattern (a JSON object, Presidio's ad-hoc recognizer shape accepted: `supported_entity`,
    `patterns: [{regex, score}]`, `context`) as a PatternSpec."""
    if not isinstance(raw, Mapping):
        raise InputError(f"{where}: a pattern is an object", param=where)
    etype = raw.get("entity_type", raw.get("supported_entity"))
    regex, score = _regexes(raw)
    if not isinstance(etype, str) or regex is None:
        raise InputError(f"{where}: needs `entity_type` (a string) and `regex` (a string or a list of strings), "
                         "or Presidio's `patterns` ([{regex, score}], each score a number)", param=where)
    context = raw.get("context") or []
    if not _strings(context):
        raise InputError(f"{where}.context: a list of words", param=f"{where}.context")
    if score is not None and (not isinstance(score, (int, float)) or not 0 <= score <= 1):
        raise InputError(f"{where}.score: a number from 0 to 1", param=f"{where}.score")
    validator, name = raw.get("validator"), raw.get("name")
    if validator is not None and not isinstance(validator, str):
        raise InputError(f"{where}.validator: a string", param=f"{where}.validator")
    return PatternSpec(entity_type=etype, regex=tuple(regex), name=name if isinstance(name, str) else None,
                       validator=validator, context=tuple(context), score=0.85 if score is None else float(score))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _regexes(raw: Mapping[str, Any]) -> tuple[list[str] | None, Any]:
    """(the pattern's regular expressions, its score): rsinfer's `regex` and `score`, or Presidio's `patterns`
    list (the score is its highest); None when they are not strings."""
    regex, score = raw.get("regex"), raw.get("score")
    if regex is None and isinstance(raw.get("patterns"), list):
        items = raw["patterns"]
        if not all(isinstance(p, Mapping) and (p.get("score") is None or _number(p["score"])) for p in items):
            return None, score       # "needs `regex`": each of Presidio's patterns is {regex, score: a number}
        regex = [p.get("regex") for p in items]
        scores = [float(p["score"]) for p in items if p.get("score") is not None]
        if score is None and scores:
            score = max(scores)
    if isinstance(regex, str):
        regex = [regex]
    return (regex if _strings(regex) else None), score
