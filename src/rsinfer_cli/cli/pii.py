"""Redact PII in JSONL (or plain) lines for shell pipelines: every other field and the record order are kept."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

import typer

from .common import COLUMN_OPT, ERROR_COLUMN_OPT, MODEL_FLAGS, TABLE_OUTPUT_OPT, ModelFlags, model_command

if TYPE_CHECKING:
    from ..api import Model
    from ..pipelines.pii import PiiPipeline

EXAMPLES = """

Examples:

  cat records.jsonl | rsinfer redact --config cfg.yaml --model pii --field text > clean.jsonl

  rsinfer redact --path models/rampart-pii --field message.body --field subject --mode replace < in.jsonl

  kubectl logs app | rsinfer redact --path models/rampart-pii --plain --mode mask

  rsinfer redact --path models/rampart-pii --input tickets.parquet --column body --output clean.parquet

  rsinfer redact --path models/rampart-pii --policy policy.yaml --mode pseudonym --key-file pii.key < in.jsonl
"""

DETECT_EXAMPLES = """

Examples:

  cat records.jsonl | rsinfer detect --config cfg.yaml --model pii --field text --types EMAIL,PHONE
"""

SPANS_KEY = "pii_spans"
OnError = Literal["fail", "skip", "keep"]
ON_ERROR = get_args(OnError)
Mode = Literal["mask", "remove", "replace", "hash", "pseudonym", "numbered"]   # pipelines/replacer.py's MODES
# the options `redact` and `detect` share
INPUT_LINES_OPT = typer.Option(None, "--input", "-i", help="JSONL (or --plain) file; default stdin ('-').")
PLAIN_OPT = typer.Option(False, "--plain", help="Lines are plain text, not JSONL.")
THRESHOLD_OPT = typer.Option(None, "--threshold", help="Minimum token probability (model default 0.5).")
TYPES_OPT = typer.Option(None, "--types", help="Only these entity types, comma-separated.")
LABELS_OPT = typer.Option(None, "--labels", help="An open-label (GLiNER) model: the labels to find instead of its "
                          "pii_labels, comma-separated ('employee id,case number'); each answers as its pii_labels "
                          "type, else as itself in UPPER_SNAKE.")
REGIONS_OPT = typer.Option(None, "--regions", help="Phone numbering plans and national-id schemes to recognise, "
                           "comma-separated ISO codes, e.g. US,GB,DE (default: the model's pii_regions).")
ON_ERROR_OPT = typer.Option("fail", "--on-error", help="A malformed line (not JSON, not an object): fail, skip "
                            "(named on stderr) or keep (every line as read, blank ones too).")
ALLOW_MISSING_OPT = typer.Option(False, "--allow-missing", help="A record may lack a --field or hold a non-string "
                                 "there (passed through unchanged); else an error naming the line.")


@dataclass
class Item:
    lineno: int
    line: str
    record: dict[str, Any] | None = None             # None: plain text, or a kept line
    texts: list[tuple[str, str]] = field(default_factory=list)   # (field path, text)
    passthrough: bool = False                        # written back exactly as read (`raw`)
    raw: str = ""
    where: str = ""                                  # --policy: the file and line, for its errors


def _field_texts(record: dict[str, Any], fields: list[str], where: str,
                 allow_missing: bool) -> list[tuple[str, str]]:
    from ..errors import InputError
    from .io import get_field

    out = []
    for f in fields:
        try:
            value = get_field(record, f)
        except KeyError:
            if allow_missing:
                continue
            raise InputError(f"{where}: no field '{f}' (use --field, or --allow-missing for optional fields)") \
                from None
        if value is None:
            continue
        if not isinstance(value, str):
            if allow_missing:  # nothing to redact there: the record goes through unchanged
                continue
            raise InputError(f"{where}: field '{f}' is {type(value).__name__}, not a string "
                             "(--allow-missing lets such records through unchanged)")
        out.append((f, value))
    return out


@dataclass(frozen=True)
class Run:
    """What `redact` or `detect` was asked to do (detect: spans of every field, nothing changed)."""

    redacting: bool
    fields: tuple[str, ...] = ("text",)
    plain: bool = False
    on_error: str = "fail"
    allow_missing: bool = False
    mode: str = "mask"
    mask_char: str = "*"
    replacement: str | None = None
    threshold: float | None = None
    types: tuple[str, ...] | None = None
    spans: bool = True
    salt: bytes | None = None
    batch_lines: int = 256
    rules: Any = None            # --patterns / --allow: pii_rules.Rules beside the model entry's own
    policy: Any = None           # --policy: records.Policy (instead of --field)
    key: bytes | None = None     # --key-file: mode pseudonym's key
    labels: tuple[str, ...] | None = None    # --labels: what an open-label (GLiNER) model is asked for

    def check(self) -> None:
        """Each flag's own rule, before any model loads (ConfigError naming the flag)."""
        from ..errors import ConfigError
        from ..pipelines.replacer import MODES

        rules = (
            (self.on_error in ON_ERROR, f"--on-error must be one of {', '.join(ON_ERROR)}, got '{self.on_error}'"),
            (not self.redacting or self.mode in MODES, f"--mode must be one of {', '.join(MODES)}, got '{self.mode}'"),
            (len(self.mask_char) == 1, f"--mask-char must be exactly one character, got {self.mask_char!r}"),
            (self.replacement is None or self.mode != "replace" or "{type}" in self.replacement,
             "--replacement must contain {type}, e.g. '<{type}>'"),
            (not (self.plain and self.policy is not None), "--policy needs JSONL records, not --plain lines"),
            (not (self.labels is not None and self.policy is not None),
             "--labels applies to --field texts; a policy's fields are scanned for the model's pii_labels"),
            (not (self.plain and self.spans and self.redacting),
             "--spans needs JSONL records; with --plain use `rsinfer detect --plain`"),
            (self.batch_lines >= 1, f"--batch-lines must be >= 1, got {self.batch_lines}"),
            (self.threshold is None or 0.0 <= self.threshold <= 1.0,
             f"--threshold must be between 0 and 1, got {self.threshold}"),
        )
        for ok, message in rules:
            if not ok:
                raise ConfigError(message)


@dataclass(frozen=True)
class Table:
    """--output, --column and --error-column: a .parquet or .csv --input is redacted (or scanned) as a table."""

    output: Path | None = None
    column: str | None = None
    error_column: str | None = None

    def job(self, run: Run) -> Any:
        from ..errors import ConfigError
        from .common import table_job

        if len(run.fields) > 1 and self.column is None:
            raise ConfigError("tables: one --column at a time (got several --field)")
        column = self.column or run.fields[0]
        if run.redacting:
            options = {"mode": run.mode, "mask_char": run.mask_char, "replacement": run.replacement,
                       "threshold": run.threshold, "types": run.types, "salt": run.salt, "rules": run.rules,
                       "key": run.key, "labels": run.labels}
            return table_job("redact", options, column, None, self.error_column, output_column=column,
                             spans=run.spans, spans_column=SPANS_KEY)
        return table_job("detect", {"threshold": run.threshold, "types": run.types, "rules": run.rules,
                                    "labels": run.labels}, column, None, self.error_column, output_column=SPANS_KEY)


def _run(run: Run, input_: Path | None, source: ModelFlags, regions: tuple[str, ...] | None,
         table: Table | None = None) -> None:
    """Lines in, the same lines out in order: each record's fields redacted (or its spans added), `batch_lines` at a
    time. A bad line (with --on-error fail) or a record without its field stops the run after everything before
    it was written."""
    from ..errors import ConfigError, InputError
    from ..pipelines.pii import PiiPipeline
    from .common import open_model
    from .io import read_lines
    from .tables import table_command, wants_table

    run.check()
    if table is not None and wants_table(input_, table.output):
        if run.policy is not None:
            raise ConfigError("--policy redacts JSONL records; a table's columns are --column")
        table_command(PiiPipeline.kind, source, table.job(run), input_, table.output,
                      flags={"pii_regions": "--regions"}, pii_regions=regions)
        return
    lines = read_lines(input_)
    model = open_model(PiiPipeline.kind, source, flags={"pii_regions": "--regions"}, pii_regions=regions)
    pipe = model.pipeline
    assert isinstance(pipe, PiiPipeline)
    _check_types(pipe, run)
    if run.policy is not None:
        run.policy.check_types([*pipe.types, *(run.rules.types if run.rules else ())], "--policy")
    if run.redacting and run.mode == "hash" and run.salt is None and pipe.salt_source.startswith("random"):
        print("rsinfer: note: no hash salt configured (--hash-salt or pii_hash_salt); hashes differ between runs",
              file=sys.stderr)
    out = _Output(model, run)
    malformed = _Malformed()
    items = _items(lines, run, malformed)
    while True:
        try:
            item = next(items, None)
            if item is None:
                break
            out.add(item)
        except InputError:
            out.flush()              # everything before the bad line is written, in order
            raise
    out.flush()
    malformed.report()


def _check_types(pipe: PiiPipeline, run: Run) -> None:
    """--labels fit the model (an open-label one), and --types are among what it, those labels and --patterns find
    (ConfigError naming the flag)."""
    from ..errors import ConfigError, InputError

    try:
        added = pipe.check_labels(run.labels, "--labels")
    except InputError as exc:
        raise ConfigError(exc.message) from None
    known = [*pipe.types, *sorted(added - set(pipe.types))]
    unknown = sorted(set(run.types or ()) - set(known) - set(run.rules.types if run.rules else ()))
    if unknown:
        raise ConfigError(f"--types: the model has no {', '.join(unknown)} (it has {', '.join(known)})")


def _items(lines: Iterable[tuple[int, str, str, str]], run: Run, malformed: _Malformed) -> Iterator[Item]:
    """One item per line to write back: a plain line, a record and its fields' texts, or a line kept as read."""
    for lineno, line, name, raw in lines:
        if run.plain:
            yield Item(lineno, line, None, [("", line)] if line.strip() else [])
        elif not line.strip():
            if run.on_error == "keep":  # keep means every line, blank ones too, byte for byte
                yield Item(lineno, line, passthrough=True, raw=raw)
            # otherwise blank lines between JSON records carry nothing
        else:
            item = _record(lineno, line, name, raw, run, malformed)
            if item is not None:
                yield item


def _record(lineno: int, line: str, name: str, raw: str, run: Run, malformed: _Malformed) -> Item | None:
    """A JSON line's item; a malformed one (not JSON, not an object) fails, is skipped or is kept as --on-error
    says. A record without the field, or with a non-string there: --allow-missing, else an error."""
    from ..errors import InputError
    from .io import parse_json_line

    try:
        record = parse_json_line(line, lineno, name)
    except InputError as exc:
        if run.on_error == "fail":
            raise
        malformed.note(lineno, exc, kept=run.on_error == "keep")
        return Item(lineno, line, passthrough=True, raw=raw) if run.on_error == "keep" else None
    if run.policy is not None:
        return Item(lineno, line, record, where=f"{name}: line {lineno}")
    return Item(lineno, line, record, _field_texts(record, list(run.fields), f"{name}: line {lineno}",
                                                   run.allow_missing))


@dataclass
class _Malformed:
    """The malformed lines skipped or kept, said on stderr."""

    skipped: list[int] = field(default_factory=list)
    kept: int = 0

    def note(self, lineno: int, exc: Exception, kept: bool) -> None:
        if kept:
            self.kept += 1
        else:
            self.skipped.append(lineno)
            print(f"rsinfer: skipped {exc}", file=sys.stderr)

    def report(self) -> None:
        if self.skipped:
            shown = ", ".join(map(str, self.skipped[:20])) + (" …" if len(self.skipped) > 20 else "")
            print(f"rsinfer: skipped {len(self.skipped)} malformed line(s): {shown}", file=sys.stderr)
        if self.kept:
            print(f"rsinfer: kept {self.kept} malformed line(s) unchanged", file=sys.stderr)


class _Output:
    """Items wait here until `batch_lines` of them are redacted (or scanned) together and written in order."""

    def __init__(self, model: Model, run: Run) -> None:
        self.model, self.run = model, run
        self.pending: list[Item] = []
        from ..pipelines.records import Planned

        self.planned = Planned(run.policy) if run.policy is not None else None
        pipe: Any = model.pipeline           # a PiiPipeline (_run checked)
        self.replacer = pipe.replacer(run.mode, run.mask_char, run.replacement, run.salt, run.key) \
            if run.redacting and run.policy is not None else None

    def add(self, item: Item) -> None:
        if self.planned is not None and item.record is not None and not item.passthrough:
            self.planned.add(item.record, item.where)     # a required path missing: an error naming the line
        self.pending.append(item)
        if len(self.pending) >= self.run.batch_lines:
            self.flush()

    def flush(self) -> None:
        if self.planned is not None:
            self._flush_records(self.planned)
            return
        new, shown = self._answer([t for it in self.pending for _, t in it.texts])
        k = 0
        for it in self.pending:
            k = self._write(it, new, shown, k)
        sys.stdout.flush()
        self.pending.clear()

    def _flush_records(self, planned: Any) -> None:
        """The pending records redacted (or scanned) by the policy, written in order with the lines kept as read."""
        from .io import write_jsonl

        found = self.model.found_in(planned, self.run.rules)
        done = iter(planned.redact(found, self.replacer) if self.replacer is not None else planned.detect(found))
        for it in self.pending:
            if it.passthrough:
                sys.stdout.write(it.raw)
                continue
            record, spans = next(done)
            if self.run.spans or not self.run.redacting:
                record[SPANS_KEY] = {path: [e.to_json() for e in ents] for path, ents in spans.items()}
            write_jsonl(record)
        sys.stdout.flush()
        self.pending.clear()
        planned.clear()

    def _answer(self, texts: list[str]) -> tuple[list[str], list[list[dict[str, Any]]]]:
        """Each text's new value and its spans (--spans shows where each value was and what replaced it, never the
        value)."""
        run, model = self.run, self.model
        if not texts:
            return [], []
        if run.redacting:
            done = model.redact(texts, mode=run.mode, mask_char=run.mask_char, replacement=run.replacement,
                                threshold=run.threshold, types=run.types, salt=run.salt, rules=run.rules, key=run.key,
                                labels=run.labels)
            return [d.text for d in done], [[e.to_json() for e in d.spans] for d in done]
        found = model.detect(texts, threshold=run.threshold, types=run.types, rules=run.rules, labels=run.labels)
        return texts, [[e.to_json() for e in ents] for ents in found]

    def _write(self, it: Item, new: list[str], shown: list[list[dict[str, Any]]], k: int) -> int:
        """One item written back; returns the index of the next item's first text."""
        from .io import set_field, write_jsonl

        run, out = self.run, sys.stdout
        if it.passthrough:
            out.write(it.raw)
            return k
        if it.record is None:           # a plain line: its new text, or its spans
            for _ in it.texts:
                if run.redacting:
                    out.write(new[k] + "\n")
                else:
                    write_jsonl({"line": it.lineno, "entities": shown[k]})
                k += 1
            if not it.texts and run.redacting:
                out.write(it.line + "\n")
            return k
        found = {}
        for f, _ in it.texts:
            set_field(it.record, f, new[k])
            found[f] = shown[k]
            k += 1
        if run.spans or not run.redacting:
            it.record[SPANS_KEY] = found
        write_jsonl(it.record)
        return k


def _types(value: str | None) -> tuple[str, ...] | None:
    """--types (or --labels): entity types, comma-separated (none given: every type)."""
    wanted = tuple(t.strip() for t in value.split(",") if t.strip()) if value else ()
    return wanted or None


def _rules(patterns: Path | None, allow: Path | None) -> Any:
    """--patterns FILE (YAML or JSON: a list of pii_patterns entries) and --allow FILE (one value a line) as the
    run's rules; ConfigError naming the file and the entry."""
    if patterns is None and allow is None:
        return None
    import yaml

    from ..errors import ConfigError, InputError
    from ..pipelines.pii_rules import Pattern, Rules, spec_of

    compiled = []
    if patterns is not None:
        try:
            data = yaml.safe_load(patterns.read_text(encoding="utf-8"))
        except UnicodeDecodeError as exc:
            raise ConfigError(f"--patterns {patterns}: not UTF-8 text (byte {exc.start})") from None
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"--patterns {patterns}: cannot read it: {exc}") from None
        if isinstance(data, dict) and "pii_patterns" in data:
            data = data["pii_patterns"]
        if not isinstance(data, list):
            raise ConfigError(f"--patterns {patterns}: expected a list of patterns (or `pii_patterns:` with one)")
        try:
            compiled = [Pattern(spec_of(raw, f"[{i}]"), f"[{i}]") for i, raw in enumerate(data)]
        except InputError as exc:
            raise ConfigError(f"--patterns {patterns}: {exc}") from None
    values: list[str] = []
    if allow is not None:
        try:
            values = [line.strip() for line in allow.read_text(encoding="utf-8").splitlines() if line.strip()]
        except UnicodeDecodeError as exc:
            raise ConfigError(f"--allow {allow}: not UTF-8 text (byte {exc.start})") from None
        except OSError as exc:
            raise ConfigError(f"--allow {allow}: cannot read it: {exc.strerror}") from None
    return Rules.of(compiled, values)


PATTERNS_OPT = typer.Option(None, "--patterns", help="YAML or JSON file: a list of pattern recognizers "
                            "({entity_type, regex, name, validator, context, score}, as pii_patterns).")
ALLOW_OPT = typer.Option(None, "--allow", help="File of values never redacted, one a line (any case).")
POLICY_OPT = typer.Option(None, "--policy", help="YAML record policy: which fields (JSON paths with [*] and *) are "
                          "kept, scanned, redacted whole or dropped (docs: Redacting records); instead of --field.")


def _policy(policy: Path | None, fields: list[str] | None) -> Any:
    if policy is None:
        return None
    from ..errors import ConfigError
    from ..pipelines.records import Policy

    if fields:
        raise ConfigError("--policy names the fields itself: drop --field")
    return Policy.load(policy)


def _key(key_file: Path | None) -> bytes | None:
    if key_file is None:
        return None
    from ..pipelines.pseudonym import read_key_file

    return read_key_file(key_file, f"--key-file {key_file}")


def _regions(value: str | None) -> tuple[str, ...] | None:
    return tuple(r.strip().upper() for r in value.split(",") if r.strip()) if value else None


@model_command
def redact_cmd(
    input_: Path = INPUT_LINES_OPT,
    fields: list[str] = typer.Option(None, "--field", "-f", help="Field to redact (dotted path; repeatable)."),
    plain: bool = PLAIN_OPT,
    mode: Mode = typer.Option("mask", "--mode", help="mask, remove, replace (<TYPE>), hash (salted sha256), "
                             "pseudonym (keyed: the same value the same token in every run) or numbered "
                             "(<PERSON_1> in order of appearance, per record)."),
    mask_char: str = typer.Option("*", "--mask-char", help="The character that replaces each masked one."),
    replacement: str = typer.Option(None, "--replacement", help="Template for --mode replace ('[{type}]'), "
                                    "pseudonym ('<{type}_{hash}>', also {key_id}) or numbered ('<{type}_{n}>')."),
    policy: Path = POLICY_OPT,
    key_file: Path = typer.Option(None, "--key-file", help="--mode pseudonym's key: a file of at least 128 bits, hex "
                                  "or base64 (default: the model's pii_pseudonym_key_file, $RSINFER_PSEUDONYM_KEY)."),
    threshold: float = THRESHOLD_OPT,
    types: str = TYPES_OPT,
    labels: str = LABELS_OPT,
    regions: str = REGIONS_OPT,
    spans: bool = typer.Option(False, "--spans", help=f"Add the redacted spans under `{SPANS_KEY}`: type, score, "
                               "offsets and replacement, never the removed value."),
    on_error: OnError = ON_ERROR_OPT,
    allow_missing: bool = ALLOW_MISSING_OPT,
    hash_salt: str = typer.Option(None, "--hash-salt", envvar="RSINFER_PII_HASH_SALT", show_envvar=False,
                                  help="Salt for --mode hash (also $RSINFER_PII_HASH_SALT)."),
    batch_lines: int = typer.Option(256, "--batch-lines", help="Lines redacted together (memory stays bounded)."),
    patterns: Path = PATTERNS_OPT,
    allow: Path = ALLOW_OPT,
    output: Path = TABLE_OUTPUT_OPT,
    column: str = COLUMN_OPT,
    error_column: str = ERROR_COLUMN_OPT,
    source: ModelFlags = MODEL_FLAGS,
) -> None:
    run = Run(redacting=True, fields=tuple(fields or ("text",)), plain=plain, on_error=on_error,
              allow_missing=allow_missing, mode=mode, mask_char=mask_char, replacement=replacement,
              threshold=threshold, types=_types(types), spans=spans,
              salt=hash_salt.encode("utf-8") if hash_salt else None, batch_lines=batch_lines,
              rules=_rules(patterns, allow), policy=_policy(policy, fields), key=_key(key_file),
              labels=_types(labels))
    _run(run, input_, source, _regions(regions), Table(output, column, error_column))


@model_command
def detect_cmd(
    input_: Path = INPUT_LINES_OPT,
    fields: list[str] = typer.Option(None, "--field", "-f", help="Field to scan (dotted path; repeatable)."),
    plain: bool = PLAIN_OPT,
    threshold: float = THRESHOLD_OPT,
    types: str = TYPES_OPT,
    labels: str = LABELS_OPT,
    regions: str = REGIONS_OPT,
    on_error: OnError = ON_ERROR_OPT,
    allow_missing: bool = ALLOW_MISSING_OPT,
    batch_lines: int = typer.Option(256, "--batch-lines", help="Lines scanned together (memory stays bounded)."),
    policy: Path = POLICY_OPT,
    patterns: Path = PATTERNS_OPT,
    allow: Path = ALLOW_OPT,
    output: Path = TABLE_OUTPUT_OPT,
    column: str = COLUMN_OPT,
    error_column: str = ERROR_COLUMN_OPT,
    source: ModelFlags = MODEL_FLAGS,
) -> None:
    run = Run(redacting=False, fields=tuple(fields or ("text",)), plain=plain, on_error=on_error,
              allow_missing=allow_missing, threshold=threshold, types=_types(types), batch_lines=batch_lines,
              rules=_rules(patterns, allow), policy=_policy(policy, fields), labels=_types(labels))
    _run(run, input_, source, _regions(regions), Table(output, column, error_column))


redact_cmd.__doc__ = (__doc__ or "") + EXAMPLES
detect_cmd.__doc__ = ("Find PII in JSONL (or plain) lines without changing them: each record gets its spans under "
                      f"`{SPANS_KEY}`.") + DETECT_EXAMPLES
