"""Redact PII in JSONL (or plain) lines for shell pipelines: every other field and the record order are kept."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer

from .common import CONFIG_OPT, DTYPE_OPT, HF_OPT, MODEL_OPT, PATH_OPT, REVISION_OPT

EXAMPLES = """

Examples:

  cat records.jsonl | rsinfer redact --config cfg.yaml --model pii --field text > clean.jsonl

  rsinfer redact --path models/rampart-pii --field message.body --field subject --mode replace < in.jsonl

  kubectl logs app | rsinfer redact --path models/rampart-pii --plain --mode mask
"""

DETECT_EXAMPLES = """

Examples:

  cat records.jsonl | rsinfer detect --config cfg.yaml --model pii --field text --types EMAIL,PHONE
"""

SPANS_KEY = "pii_spans"
ON_ERROR = ("fail", "skip", "keep")
# the options `redact` and `detect` share
INPUT_LINES_OPT = typer.Option(None, "--input", "-i", help="JSONL (or --plain) file; default stdin ('-').")
PLAIN_OPT = typer.Option(False, "--plain", help="Lines are plain text, not JSONL.")
THRESHOLD_OPT = typer.Option(None, "--threshold", help="Minimum token probability (model default 0.5).")
TYPES_OPT = typer.Option(None, "--types", help="Only these entity types, comma-separated.")
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


def _run(*, redacting: bool, input_: Path | None, fields: list[str], plain: bool, on_error: str,
         allow_missing: bool, mode: str,
         mask_char: str, replacement: str | None, threshold: float | None, types: str | None, spans: bool,
         hash_salt: str | None, batch_lines: int, pipe_args: dict[str, Any]) -> None:
    from ..errors import ConfigError, InputError
    from ..pipelines.pii import MODES
    from .common import load_pipeline
    from .io import parse_json_line, read_lines, set_field, write_jsonl

    if on_error not in ON_ERROR:
        raise ConfigError(f"--on-error must be one of {', '.join(ON_ERROR)}, got '{on_error}'")
    if redacting and mode not in MODES:
        raise ConfigError(f"--mode must be one of {', '.join(MODES)}, got '{mode}'")
    if len(mask_char) != 1:
        raise ConfigError(f"--mask-char must be exactly one character, got {mask_char!r}")
    if replacement is not None and "{type}" not in replacement:
        raise ConfigError("--replacement must contain {type}, e.g. '<{type}>'")
    if plain and spans and redacting:
        raise ConfigError("--spans needs JSONL records; with --plain use `rsinfer detect --plain`")
    if batch_lines < 1:
        raise ConfigError(f"--batch-lines must be >= 1, got {batch_lines}")
    if threshold is not None and not 0.0 <= threshold <= 1.0:
        raise ConfigError(f"--threshold must be between 0 and 1, got {threshold}")
    wanted = [t.strip() for t in types.split(",") if t.strip()] if types else None
    fields = fields or ["text"]
    lines = read_lines(input_)
    pipe = load_pipeline("pii", flags={"pii_regions": "--regions"}, **pipe_args)
    if wanted:
        unknown = sorted(set(wanted) - set(pipe.types))
        if unknown:
            raise ConfigError(f"--types: the model has no {', '.join(unknown)} (it has {', '.join(pipe.types)})")
    salt = hash_salt.encode("utf-8") if hash_salt else None
    if redacting and mode == "hash" and salt is None and pipe.salt_source.startswith("random"):
        print("rsinfer: note: no hash salt configured (--hash-salt or pii_hash_salt); hashes differ between runs",
              file=sys.stderr)
    skipped: list[int] = []
    kept = 0
    pending: list[Item] = []

    def flush() -> None:
        texts = [t for it in pending for _, t in it.texts]
        shown: list[list[dict[str, Any]]] = []
        if texts:
            if redacting:  # --spans shows where each value was and what replaced it, never the value
                res = pipe.redact(texts, mode=mode, mask_char=mask_char, replacement=replacement,
                                  threshold=threshold, types=wanted, salt=salt)
                new = res.texts
                shown = [[e.to_json() for e in found] for found in res.spans]
            else:
                det = pipe.detect(texts, threshold, wanted)
                new = texts
                shown = [[e.to_json() for e in found] for found in det.entities]
        k = 0
        out = sys.stdout
        for it in pending:
            if it.passthrough:
                out.write(it.raw)
                continue
            found = {}
            for f, _ in it.texts:
                if it.record is None:
                    if redacting:
                        out.write(new[k] + "\n")
                    else:
                        write_jsonl({"line": it.lineno, "entities": shown[k]})
                else:
                    set_field(it.record, f, new[k])
                    found[f] = shown[k]
                k += 1
            if it.record is None and not it.texts:
                out.write(it.line + "\n" if redacting else "")
            if it.record is not None:
                if spans or not redacting:
                    it.record[SPANS_KEY] = found
                write_jsonl(it.record)
        out.flush()
        pending.clear()

    for lineno, line, name, raw in lines:
        if plain:
            pending.append(Item(lineno, line, None, [("", line)] if line.strip() else []))
        elif not line.strip():
            if on_error == "keep":  # keep means every line, blank ones too, byte for byte
                pending.append(Item(lineno, line, passthrough=True, raw=raw))
            # otherwise blank lines between JSON records carry nothing
        else:
            try:
                record = parse_json_line(line, lineno, name)
            except InputError as exc:  # malformed: not JSON, or not an object
                if on_error == "fail":
                    flush()  # everything before the bad line is written, in order
                    raise
                if on_error == "skip":
                    skipped.append(lineno)
                    print(f"rsinfer: skipped {exc}", file=sys.stderr)
                else:
                    kept += 1
                    pending.append(Item(lineno, line, passthrough=True, raw=raw))
                continue
            try:  # a record without the field, or with a non-string there: --allow-missing, else an error
                texts = _field_texts(record, fields, f"{name}: line {lineno}", allow_missing)
            except InputError:
                flush()
                raise
            pending.append(Item(lineno, line, record, texts))
        if len(pending) >= batch_lines:
            flush()
    flush()
    if skipped:
        shown = ", ".join(map(str, skipped[:20])) + (" …" if len(skipped) > 20 else "")
        print(f"rsinfer: skipped {len(skipped)} malformed line(s): {shown}", file=sys.stderr)
    if kept:
        print(f"rsinfer: kept {kept} malformed line(s) unchanged", file=sys.stderr)


def _regions(value: str | None) -> tuple[str, ...] | None:
    return tuple(r.strip().upper() for r in value.split(",") if r.strip()) if value else None


def redact_cmd(
    input_: Path = INPUT_LINES_OPT,
    fields: list[str] = typer.Option(None, "--field", "-f", help="Field to redact (dotted path; repeatable)."),
    plain: bool = PLAIN_OPT,
    mode: str = typer.Option("mask", "--mode", help="mask, remove, replace (<TYPE>) or hash (salted sha256)."),
    mask_char: str = typer.Option("*", "--mask-char", help="The character that replaces each masked one."),
    replacement: str = typer.Option(None, "--replacement", help="Template for --mode replace, e.g. '[{type}]'."),
    threshold: float = THRESHOLD_OPT,
    types: str = TYPES_OPT,
    regions: str = REGIONS_OPT,
    spans: bool = typer.Option(False, "--spans", help=f"Add the redacted spans under `{SPANS_KEY}`: type, score, "
                               "offsets and replacement, never the removed value."),
    on_error: str = ON_ERROR_OPT,
    allow_missing: bool = ALLOW_MISSING_OPT,
    hash_salt: str = typer.Option(None, "--hash-salt", envvar="RSINFER_PII_HASH_SALT", show_envvar=False,
                                  help="Salt for --mode hash (also $RSINFER_PII_HASH_SALT)."),
    batch_lines: int = typer.Option(256, "--batch-lines", help="Lines redacted together (memory stays bounded)."),
    model: str = MODEL_OPT,
    config: Path = CONFIG_OPT,
    path: Path = PATH_OPT,
    hf: str = HF_OPT,
    revision: str = REVISION_OPT,
    dtype: str = DTYPE_OPT,
) -> None:
    _run(redacting=True, input_=input_, fields=list(fields or []), plain=plain, on_error=on_error,
         allow_missing=allow_missing, mode=mode,
         mask_char=mask_char, replacement=replacement, threshold=threshold, types=types, spans=spans,
         hash_salt=hash_salt, batch_lines=batch_lines,
         pipe_args={"name": model, "config": config, "path": path, "hf": hf, "revision": revision, "dtype": dtype,
                    "pii_regions": _regions(regions)})


def detect_cmd(
    input_: Path = INPUT_LINES_OPT,
    fields: list[str] = typer.Option(None, "--field", "-f", help="Field to scan (dotted path; repeatable)."),
    plain: bool = PLAIN_OPT,
    threshold: float = THRESHOLD_OPT,
    types: str = TYPES_OPT,
    regions: str = REGIONS_OPT,
    on_error: str = ON_ERROR_OPT,
    allow_missing: bool = ALLOW_MISSING_OPT,
    batch_lines: int = typer.Option(256, "--batch-lines", help="Lines scanned together (memory stays bounded)."),
    model: str = MODEL_OPT,
    config: Path = CONFIG_OPT,
    path: Path = PATH_OPT,
    hf: str = HF_OPT,
    revision: str = REVISION_OPT,
    dtype: str = DTYPE_OPT,
) -> None:
    _run(redacting=False, input_=input_, fields=list(fields or []), plain=plain, on_error=on_error,
         allow_missing=allow_missing, mode="mask",
         mask_char="*", replacement=None, threshold=threshold, types=types, spans=True, hash_salt=None,
         batch_lines=batch_lines,
         pipe_args={"name": model, "config": config, "path": path, "hf": hf, "revision": revision, "dtype": dtype,
                    "pii_regions": _regions(regions)})


redact_cmd.__doc__ = (__doc__ or "") + EXAMPLES
detect_cmd.__doc__ = ("Find PII in JSONL (or plain) lines without changing them: each record gets its spans under "
                      f"`{SPANS_KEY}`.") + DETECT_EXAMPLES
