"""Record policies: which fields of a JSON record are kept, scanned as free text, redacted whole or dropped.

    default: keep                 # string fields no path names: keep | scan
    fields:
      id: keep
      user.email: {action: redact, type: EMAIL}       # the whole value is that entity, whatever its JSON type
      "messages[*].content": scan                     # free-text recognition, the model's settings
      "tickets[*].body": {action: scan, types: [GIVEN_NAME, SURNAME], threshold: 0.6, required: true}
      internal_notes: drop

A path is dotted keys, `*` for any key of an object, `[*]` for any item of an array and `[n]` for one; a key with a
dot or bracket in it is written in double quotes (`"a.b"`). A rule holds for the node it names and everything under
it, unless a deeper path names a node of its own; of two paths naming one node the one with more literal steps
wins, then the one written first. A path that matches nothing in a record passes unless it is `required`.

The work is two steps, so that any front can run the model its own way (a blocking call, an awaited one): `plan`
lists the texts to scan by their scan options, `Planned.apply` writes each record back with what the model found.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, InputError
from ..jsonio import dumps_sorted
from .pii import Entity, Redacted, redact_spans
from .replacer import Replacer

ACTIONS = ("keep", "scan", "redact", "drop")
DEFAULTS = ("keep", "scan")
RULE_KEYS = {"keep": {"action", "required"}, "drop": {"action", "required"},
             "scan": {"action", "required", "types", "threshold"}, "redact": {"action", "required", "type"}}
ANY_KEY, ANY_ITEM = object(), object()       # the wildcards of a path's steps
_STEP = re.compile(r'"((?:[^"\\]|\\.)*)"|([^.\[\]"]+)|\[(\*|\d+)\]|(\.)')
MAX_RULES = 256
Step = Any          # a key (str), an index (int), ANY_KEY or ANY_ITEM
Where = tuple[Any, ...]


def parse_path(path: str, where: str) -> tuple[Step, ...]:
    """A path's steps; ConfigError naming `where` for one that is not a path."""
    steps: list[Step] = []
    pos, dot = 0, True        # dot: a key may come next (at the start, or after a '.')
    while pos < len(path):
        m = _STEP.match(path, pos)
        if m is None:
            break
        quoted, name, item, sep = m.groups()
        if sep is not None:
            if dot:
                break
            dot = True
        elif item is not None:
            if dot:             # an item follows a key: a record is an object
                break
            steps.append(ANY_ITEM if item == "*" else int(item))
            dot = False
        else:
            if not dot:
                break
            key = json.loads(f'"{quoted}"') if quoted is not None else name
            steps.append(ANY_KEY if name == "*" else key)
            dot = False
        pos = m.end()
    if pos < len(path) or dot or not steps:
        raise ConfigError(f"{where}: '{path}' is not a path (dotted keys, * for any key, [*] or [n] for array items,"
                          " \"quoted\" keys with dots)")
    return tuple(steps)


@dataclass(frozen=True)
class Rule:
    path: str
    steps: tuple[Step, ...]
    action: str
    order: int
    type: str | None = None                 # redact: the entity type the whole value is
    types: tuple[str, ...] | None = None    # scan: only these types
    threshold: float | None = None          # scan: the model's threshold for this field
    required: bool = False

    @property
    def literal(self) -> int:
        return sum(1 for s in self.steps if s is not ANY_KEY and s is not ANY_ITEM)

    def matches(self, at: Where) -> bool:
        return len(at) == len(self.steps) and all(_step_ok(s, k) for s, k in zip(self.steps, at, strict=True))

    def under(self, at: Where) -> bool:
        """Whether this rule may name a node below `at`."""
        return len(self.steps) > len(at) and all(_step_ok(s, k) for s, k in zip(self.steps, at, strict=False))


def _step_ok(step: Step, key: Any) -> bool:
    if step is ANY_KEY:
        return isinstance(key, str)
    if step is ANY_ITEM:
        return isinstance(key, int)
    return bool(step == key and type(step) is type(key))


def _rule(path: Any, raw: Any, order: int) -> Rule:
    where = f"fields.{path}"
    if not isinstance(path, str):
        raise ConfigError(f"fields: key {path!r} is not a path (a string)")
    steps = parse_path(path, where)
    spec = {"action": raw} if isinstance(raw, str) else raw
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: one of {', '.join(ACTIONS)}, or a mapping with `action`")
    action = spec.get("action")
    if action not in ACTIONS:
        raise ConfigError(f"{where}.action: one of {', '.join(ACTIONS)}, got {action!r}")
    unknown = sorted(set(spec) - RULE_KEYS[action])
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: not a key of a `{action}` rule "
                          f"(it takes {', '.join(sorted(RULE_KEYS[action]))})")
    etype, types, threshold, required = _checked(where, action, spec)
    return Rule(path, steps, action, order, etype, tuple(types) if types else None,
                None if threshold is None else float(threshold), required)


def _checked(where: str, action: str, spec: Mapping[str, Any]) -> tuple[Any, Any, Any, bool]:
    """A rule's type, types, threshold and required flag, each checked (ConfigError naming its key)."""
    etype, types, threshold = spec.get("type"), spec.get("types"), spec.get("threshold")
    if action == "redact" and not (isinstance(etype, str) and re.fullmatch(r"[A-Za-z][\w-]*", etype)):
        raise ConfigError(f"{where}.type: a redact rule names the entity type of the whole value, e.g. EMAIL")
    if types is not None and not (isinstance(types, list) and types and all(isinstance(t, str) for t in types)):
        raise ConfigError(f"{where}.types: a list of entity types")
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                  or not 0 <= threshold <= 1):
        raise ConfigError(f"{where}.threshold: a number between 0 and 1, got {threshold!r}")
    required = spec.get("required", False)
    if not isinstance(required, bool):
        raise ConfigError(f"{where}.required: true or false, got {required!r}")
    return etype, types, threshold, required


@dataclass(frozen=True)
class Policy:
    default: str = "keep"
    rules: tuple[Rule, ...] = ()

    @classmethod
    def of(cls, data: Any, where: str = "policy") -> Policy:
        """A policy from its parsed YAML or JSON; ConfigError naming the key path of the first thing wrong."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where}: a mapping with `default` and `fields`")
        unknown = sorted(set(data) - {"default", "fields"})
        if unknown:
            raise ConfigError(f"{where}: {unknown[0]}: not a policy key (default, fields)")
        default = data.get("default", "keep")
        if default not in DEFAULTS:
            raise ConfigError(f"{where}: default: keep or scan, got {default!r}")
        fields = data.get("fields") or {}
        if not isinstance(fields, Mapping):
            raise ConfigError(f"{where}: fields: a mapping of paths to actions")
        if len(fields) > MAX_RULES:
            raise ConfigError(f"{where}: fields: {len(fields)} paths; at most {MAX_RULES}")
        try:
            rules = tuple(_rule(path, raw, i) for i, (path, raw) in enumerate(fields.items()))
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc.message}") from None
        return cls(default, rules)

    @classmethod
    def load(cls, path: str | Path) -> Policy:
        import yaml

        try:
            data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except UnicodeDecodeError as exc:
            raise ConfigError(f"--policy {path}: not UTF-8 text (byte {exc.start})") from None
        except OSError as exc:
            raise ConfigError(f"--policy {path}: cannot read it: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"--policy {path}: not YAML: {exc}") from None
        return cls.of(data, f"--policy {path}")

    def types(self) -> list[tuple[str, str]]:
        """(key path, type) of every entity type a scan rule names, to check against a model before any record."""
        return [(f"fields.{r.path}.types", t) for r in self.rules for t in r.types or ()]

    def check_types(self, known: Sequence[str], where: str = "policy") -> None:
        for key, t in self.types():
            if t not in known:
                raise ConfigError(f"{where}: {key}: the model has no {t} (it has {', '.join(known)})")

    def plan(self, records: Sequence[Any], where: Callable[[int], str]) -> Planned:
        """What each record asks: its texts to scan (grouped by their scan options), its values to redact whole,
        its fields to drop. InputError naming `where(i)` and the path of a required path that matches nothing."""
        planned = Planned(self)
        for i, record in enumerate(records):
            planned.add(record, where(i))
        return planned


@dataclass
class Slot:
    """One place of a record to change: its container and key, its path as text, and what to do."""

    container: Any
    key: Any
    path: str
    rule: Rule | None                  # None: the default scan
    action: str
    group: tuple[Any, ...] = ()        # scan: the options its texts are scanned with
    index: int = -1                    # scan: its text's place in its group


@dataclass
class _Slots:
    slots: list[Slot] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)


class _Walk:
    def __init__(self, policy: Policy, planned: Planned) -> None:
        self.rules, self.planned, self.out = policy.rules, planned, _Slots()
        self.default = policy.default

    def walk(self, record: Any) -> _Slots:
        if isinstance(record, dict):
            self._children(record, (), None, self.default)
        return self.out

    def _children(self, node: Any, at: Where, rule: Rule | None, action: str) -> None:
        items: Iterator[tuple[Any, Any]] = iter(node.items()) if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            self._node(node, key, value, (*at, key), rule, action)

    def _node(self, container: Any, key: Any, value: Any, at: Where, rule: Rule | None, action: str) -> None:
        own = None
        for r in self.rules:
            if r.matches(at) and (own is None or r.literal > own.literal):
                own = r
        if own is not None:
            self.out.seen.add(own.order)
            rule, action = own, own.action
        if action in ("drop", "redact"):
            if action == "drop" or value is not None:
                self.out.slots.append(Slot(container, key, _path_text(at), rule, action))
            return
        if isinstance(value, (dict, list)):
            if action == "scan" or any(r.under(at) for r in self.rules):
                self._children(value, at, rule, action)
        elif action == "scan" and isinstance(value, str) and value:
            group = (rule.types, rule.threshold) if rule is not None else (None, None)
            texts = self.planned.texts.setdefault(group, [])
            self.out.slots.append(Slot(container, key, _path_text(at), rule, "scan", group, len(texts)))
            texts.append(value)


def _path_text(at: Where) -> str:
    out = ""
    for k in at:
        if isinstance(k, int):
            out += f"[{k}]"
        else:
            name = k if re.fullmatch(r"[^.\[\]\"*]+", k) else json.dumps(k, ensure_ascii=False)
            out += f".{name}" if out else name
    return out


def whole_text(value: Any) -> str:
    """The text a value redacted whole stands for: a string as it is, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    return dumps_sorted(value)


@dataclass
class Planned:
    """The texts every record of a batch asks to scan, by scan options `(types, threshold)`, and each record's
    slots."""

    policy: Policy
    texts: dict[tuple[Any, ...], list[str]] = field(default_factory=dict)
    records: list[tuple[Any, list[Slot]]] = field(default_factory=list)

    def add(self, record: Any, where: str) -> None:
        """One more record (InputError naming `where` and the path of a required path that matches nothing; the
        record is then not added)."""
        marks = {g: len(t) for g, t in self.texts.items()}
        slots = _Walk(self.policy, self).walk(record)
        missing = [r.path for r in self.policy.rules if r.required and r.order not in slots.seen]
        if missing:
            for g in list(self.texts):
                del self.texts[g][marks.get(g, 0):]
            raise InputError(f"{where}: required path '{missing[0]}' matches nothing", param="policy")
        self.records.append((record, slots.slots))

    def clear(self) -> None:
        self.texts.clear()
        self.records.clear()

    def redact(self, found: Mapping[tuple[Any, ...], Sequence[Sequence[Entity]]],
               replacer: Replacer) -> list[tuple[Any, dict[str, list[Redacted]]]]:
        """Each record changed in place and returned with the spans of each changed path (never the values).
        `found`: the entities of `texts`, group by group. Numbered mode numbers afresh in each record."""
        out = []
        for record, slots in self.records:
            replacer.record()
            spans: dict[str, list[Redacted]] = {}
            drops = []
            for s in slots:
                if s.action == "drop":
                    drops.append(s)
                elif s.action == "redact":
                    assert s.rule is not None and s.rule.type is not None
                    text = whole_text(s.container[s.key])
                    whole = Entity(s.rule.type, text, 1.0, 0, len(text), source="policy")
                    new, spans[s.path] = redact_spans(text, [whole], replacer)
                    s.container[s.key] = new
                else:
                    text = s.container[s.key]
                    new, spans[s.path] = redact_spans(text, found[s.group][s.index], replacer)
                    s.container[s.key] = new
            _drop(drops)
            out.append((record, spans))
        return out

    def detect(self, found: Mapping[tuple[Any, ...], Sequence[Sequence[Entity]]]
               ) -> list[tuple[Any, dict[str, list[Entity]]]]:
        """Each record unchanged, with what was found at each path (a value redacted whole: itself, whole)."""
        out = []
        for record, slots in self.records:
            spans: dict[str, list[Entity]] = {}
            for s in slots:
                if s.action == "redact":
                    assert s.rule is not None and s.rule.type is not None
                    text = whole_text(s.container[s.key])
                    spans[s.path] = [Entity(s.rule.type, text, 1.0, 0, len(text), source="policy")]
                elif s.action == "scan":
                    spans[s.path] = list(found[s.group][s.index])
            out.append((record, spans))
        return out


def _drop(slots: list[Slot]) -> None:
    """Dropped fields removed; array items from the last, so that the indices of the others hold."""
    for s in sorted(slots, key=lambda s: -s.key if isinstance(s.key, int) else 0):
        if isinstance(s.container, dict):
            s.container.pop(s.key, None)
        else:
            del s.container[s.key]

