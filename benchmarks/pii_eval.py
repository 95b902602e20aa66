"""Precision and recall of the pattern recognizers (pipelines/recognizers.py) on a labelled set written for them.

    .venv/bin/python benchmarks/pii_eval.py               # evaluates benchmarks/data/pii_eval.jsonl, appends to
                                                          # RESULTS.md
    .venv/bin/python benchmarks/pii_eval.py --regenerate  # writes the set again (seeded: the same file)

The set: phone numbers of six regions in their national and international spellings, IBANs of twelve countries
with and without spaces, credit cards of five issuers, IPv4 and IPv6 (compressed, IPv4-mapped), and national ids
(US SSN, GB NHS, DE IdNr, FR NIR, ES DNI and NIE, IN Aadhaar, NL BSN, IT codice fiscale, PL PESEL) - each alone
and inside running text - plus decoys that must not be found: the same numbers with a wrong check digit, dates,
times, prices, order and version numbers, postcodes. A span counts as found when a recognizer returns the same
type over the same characters; precision and recall are per type. Valid values are made with the check-digit
functions of python-stdnum and phonenumbers' metadata, so the set tests finding and delimiting them in text. A decoy
that is a valid phone number of an evaluated region is left out (a GB NHS number with a wrong check digit can be a
real US number).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from pathlib import Path

from _serve import write_results

ROOT = Path(__file__).resolve().parent
DATA = ROOT / "data" / "pii_eval.jsonl"
REGIONS = ("US", "GB", "DE", "FR", "ES", "IN", "NL", "IT", "PL")

SENTENCES = [
    "Please call {} before noon.", "You can reach the office at {}, ask for the desk.", "Transfer it to {} today.",
    "My number is {} if anything changes.", "The form lists {} under identification.", "Ref: {}.",
    "It was logged from {} at the time of the incident.", "Charge the card {} for the deposit.",
    "({}) was on the invoice.", "Send details to the account {} please", "ID {} belongs to the applicant.",
]
DECOY_SENTENCES = [
    "The meeting is on {} in room 4.", "Order #{} shipped yesterday.", "Upgrade to version {} first.",
    "It costs {} including tax.", "See page {} of the report.", "The build {} failed twice.",
    "Deliver to postcode {} only.", "The reading was {} at noon.",
]


def _digits(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789") for _ in range(n))


def _valid(rng: random.Random, make, check, tries: int = 10_000) -> str:
    for _ in range(tries):
        value = make()
        if check(value):
            return value
    raise RuntimeError("no valid value found")


def _invalid(rng: random.Random, value: str, check) -> str | None:
    """The value with one digit changed so that it fails its check (None if every change still passes)."""
    spots = [i for i, ch in enumerate(value) if ch.isdigit()]
    rng.shuffle(spots)
    for i in spots:
        for d in "0123456789":
            if d != value[i]:
                bad = value[:i] + d + value[i + 1:]
                if not check(bad):
                    return bad
    return None


def phones(rng: random.Random) -> list[tuple[str, str, str, bool]]:
    """(value, type, scheme, valid) per phone: four numbers per region (two mobile, two fixed), three spellings."""
    import phonenumbers
    from phonenumbers import PhoneNumberFormat as F
    from phonenumbers import PhoneNumberType as T

    out = []
    for region in ("US", "GB", "DE", "FR", "ES", "IN", "NL", "IT", "PL"):
        for kind in (T.MOBILE, T.FIXED_LINE, T.MOBILE, T.FIXED_LINE):
            e164 = phonenumbers.format_number(phonenumbers.example_number_for_type(region, kind), F.E164)

            def make(e164: str = e164) -> phonenumbers.PhoneNumber:
                return phonenumbers.parse(e164[:-3] + _digits(rng, 3), None)

            num = _valid(rng, make, phonenumbers.is_valid_number)
            for fmt in (F.NATIONAL, F.INTERNATIONAL, F.E164):
                out.append((phonenumbers.format_number(num, fmt), "PHONE", region, True))
    return out


def ibans(rng: random.Random) -> list[tuple[str, str, str, bool]]:
    from stdnum import iban

    bban = {"DE": "370400440532013000", "GB": "NWBK60161331926819", "FR": "20041010050500013M02606",
            "ES": "21000418450200051332", "NL": "ABNA0417164300", "IT": "X0542811101000000123456",
            "BE": "539007547034", "CH": "0076201162385295 7"[:17].replace(" ", ""), "AT": "1904300234573201",
            "PL": "109010140000071219812874", "PT": "000201231234567890154", "IE": "AIBK93115212345678"}
    out = []
    for cc, base in bban.items():
        for _ in range(5):
            digits = [i for i, ch in enumerate(base) if ch.isdigit()]
            chars = list(base)
            for i in rng.sample(digits, min(4, len(digits))):
                chars[i] = rng.choice("0123456789")
            body = "".join(chars)
            value = cc + iban.calc_check_digits(cc + "00" + body) + body
            if not iban.is_valid(value):        # a national check digit inside the BBAN (FR, ES, IT, BE, …)
                continue
            spaced = iban.format(value)
            out.append((spaced if rng.random() < 0.6 else value, "IBAN", cc, True))
            bad = _invalid(rng, value, iban.is_valid)
            if bad is not None:
                out.append((iban.format(bad), "IBAN", cc, False))
    return out


def cards(rng: random.Random) -> list[tuple[str, str, str, bool]]:
    from stdnum import luhn

    out = []
    for prefix, length in (("4", 16), ("51", 16), ("55", 16), ("2221", 16), ("34", 15), ("37", 15), ("6011", 16),
                           ("65", 16), ("4", 13)):
        for _ in range(4):
            body = prefix + _digits(rng, length - len(prefix) - 1)
            value = body + luhn.calc_check_digit(body)
            if length == 15:
                shown = f"{value[:4]} {value[4:10]} {value[10:]}"
            elif length == 16:
                sep = rng.choice([" ", "-", ""])
                shown = sep.join(value[i:i + 4] for i in range(0, 16, 4))
            else:
                shown = value
            out.append((shown, "CREDIT_CARD_NUMBER", prefix, True))
            bad = _invalid(rng, value, luhn.is_valid)
            if bad is not None:
                out.append((bad, "CREDIT_CARD_NUMBER", prefix, False))
    return out


def ips(rng: random.Random) -> list[tuple[str, str, str, bool]]:
    import ipaddress

    out = []
    for _ in range(14):
        out.append((str(ipaddress.IPv4Address(rng.getrandbits(32))), "IP_ADDRESS", "v4", True))
    for _ in range(6):
        addr = ipaddress.IPv6Address(rng.getrandbits(128))
        out.append((addr.exploded if rng.random() < 0.5 else str(addr), "IP_ADDRESS", "v6", True))
    for text in ("2001:db8::1", "fe80::1ff:fe23:4567:890a", "::ffff:192.0.2.128", "2001:db8:85a3::8a2e:370:7334",
                 "::1", "2001:0db8:0000:0000:0000:ff00:0042:8329"):
        out.append((text, "IP_ADDRESS", "v6", True))
    out.append(("10.0.0.1", "IP_ADDRESS", "v4", True))
    return out


def national_ids(rng: random.Random) -> list[tuple[str, str, str, bool]]:
    from stdnum.de import idnr
    from stdnum.es import dni, nie
    from stdnum.fr import nir
    from stdnum.gb import nhs
    from stdnum.in_ import aadhaar
    from stdnum.it import codicefiscale
    from stdnum.nl import bsn
    from stdnum.pl import pesel
    from stdnum.us import ssn

    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    schemes = {
        "US_SSN": (lambda: f"{rng.randint(100, 665)}-{rng.randint(10, 99)}-{rng.randint(1000, 9999)}", ssn.is_valid),
        "GB_NHS": (lambda: (lambda d: f"{d[:3]} {d[3:6]} {d[6:]}")(_digits(rng, 10)), nhs.is_valid),
        "DE_IDNR": (lambda: (lambda d: f"{d[:2]} {d[2:5]} {d[5:8]} {d[8:]}")(str(rng.randint(1, 9)) + _digits(rng, 10)),
                    idnr.is_valid),
        "FR_NIR": (lambda: (lambda b: b + nir.calc_check_digits(b))(
            f"{rng.randint(1, 2)}{rng.randint(40, 99):02d}{rng.randint(1, 12):02d}{rng.randint(1, 95):02d}"
            f"{_digits(rng, 6)}"), nir.is_valid),
        "ES_DNI": (lambda: (lambda b: b + dni.calc_check_digit(b))(_digits(rng, 8)), dni.is_valid),
        "ES_NIE": (lambda: (lambda b: b + nie.calc_check_digit(b))(rng.choice("XYZ") + _digits(rng, 7)), nie.is_valid),
        "IN_AADHAAR": (lambda: (lambda d: f"{d[:4]} {d[4:8]} {d[8:]}")(str(rng.randint(2, 9)) + _digits(rng, 11)),
                       aadhaar.is_valid),
        "NL_BSN": (lambda: _digits(rng, 9), bsn.is_valid),
        "IT_CF": (lambda: (lambda b: b + codicefiscale.calc_check_digit(b))(
            "".join(rng.choice(letters) for _ in range(6)) + f"{rng.randint(40, 99):02d}"
            + rng.choice("ABCDEHLMPRST") + f"{rng.randint(1, 28):02d}" + rng.choice("ABCDEFGHILM")
            + _digits(rng, 3)), codicefiscale.is_valid),
        "PL_PESEL": (lambda: (lambda b: b + pesel.calc_check_digit(b))(
            f"{rng.randint(40, 99):02d}{rng.randint(1, 12):02d}{rng.randint(1, 28):02d}{_digits(rng, 4)}"),
            pesel.is_valid),
    }
    out = []
    for scheme, (make, check) in schemes.items():
        for _ in range(10):
            value = _valid(rng, make, check)
            out.append((value, "SSN" if scheme == "US_SSN" else "NATIONAL_ID", scheme, True))
            if scheme != "US_SSN":            # an SSN has no check digit: nothing to get wrong
                bad = _invalid(rng, value, check)
                if bad is not None:
                    out.append((bad, "NATIONAL_ID", scheme, False))
    return out


def decoys(rng: random.Random) -> list[str]:
    values = ["2024-01-15", "15.01.2024", "01/15/2024", "10:30", "$1,234.56", "94105", "12345678", "1.2.3",
              "3.11.7", "2.0.0-rc1", "SW1A 1AA", "75008", "4242", "1234-5678", "0.5", "99.9%", "20 kg", "A4",
              "ISO 9001", "X-123"]
    return [rng.choice(DECOY_SENTENCES).format(v) for v in values]


def _a_phone(value: str) -> bool:
    """Whether the value is a valid phone number in one of the evaluated regions (a decoy must not be one: a GB NHS
    number with a wrong check digit can be a real US number)."""
    import phonenumbers

    return any(True for region in (*REGIONS, "ZZ")
               for _ in phonenumbers.PhoneNumberMatcher(value, region, leniency=phonenumbers.Leniency.VALID))


def generate(seed: int = 2026) -> list[dict]:
    rng = random.Random(seed)
    records: list[dict] = []
    for value, etype, scheme, valid in phones(rng) + ibans(rng) + cards(rng) + ips(rng) + national_ids(rng):
        if not valid and _a_phone(value):
            continue
        inside = rng.random() < 0.5
        text = rng.choice(SENTENCES).format(value) if inside else value
        start = text.index(value)
        spans = [{"type": etype, "scheme": scheme, "start": start, "end": start + len(value)}] if valid else []
        records.append({"text": text, "spans": spans, "decoy_of": None if valid else etype})
    records += [{"text": t, "spans": [], "decoy_of": "other"} for t in decoys(rng)]
    return records


def evaluate(records: list[dict], names: tuple[str, ...], regions: tuple[str, ...]) -> dict[str, dict[str, float]]:
    sys.path.insert(0, str(ROOT.parent / "src"))
    from rsinfer_cli.pipelines.recognizers import recognize

    return score(records, [[(m.entity_type, m.start, m.end) for m in recognize(r["text"], names, regions)]
                           for r in records])


GLINER_LABELS = {"phone number": "PHONE", "iban": "IBAN", "credit card number": "CREDIT_CARD_NUMBER",
                 "ip address": "IP_ADDRESS", "national id number": "NATIONAL_ID", "social security number": "SSN",
                 "email": "EMAIL"}


def detect(records: list[dict], names: tuple[str, ...], regions: tuple[str, ...], folder: str = "rampart-pii",
           **keys: object) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """What `/pii/detect` answers: a PII model of ../shared/models (rampart-pii, or a GLiNER folder asked for
    GLINER_LABELS) with the recognizers, every region at once; scored on the types of the set (the model's other
    types, such as TAX_ID on a decoy id, are not in it). Also the recognizers' part: the spans a recognizer gave."""
    import os

    sys.path.insert(0, str(ROOT.parent / "src"))
    from rsinfer_cli.config import parse_config
    from rsinfer_cli.engine.model import load_model
    from rsinfer_cli.pipelines import build_pipeline

    shared = Path(os.environ.get("RSINFER_SHARED_MODELS", ROOT.parent.parent / "shared" / "models"))
    cfg = parse_config({"models": [{"name": "pii", "kind": "pii", "path": str(shared / folder),
                                    "pii_recognizers": list(names), "pii_regions": list(regions), **keys}]})
    pipe = build_pipeline(load_model(cfg.models[0]))
    found = pipe.detect([r["text"] for r in records]).entities
    types = {s["type"] for r in records for s in r["spans"]}
    every = score(records, [[(e.entity_type, e.start, e.end) for e in ents if e.entity_type in types]
                            for ents in found])
    recognized = score(records, [[(e.entity_type, e.start, e.end) for e in ents
                                  if e.entity_type in types and e.source != "model"] for ents in found])
    return every, recognized


def score(records: list[dict], found: list[list[tuple[str, int, int]]]) -> dict[str, dict[str, float]]:
    tp: Counter[str] = Counter()
    fp: Counter[str] = Counter()
    fn: Counter[str] = Counter()
    for r, spans in zip(records, found, strict=True):
        want = {(s["type"], s["start"], s["end"]) for s in r["spans"]}
        got = set(spans)
        for t, *_ in want & got:
            tp[t] += 1
        for t, *_ in got - want:
            fp[t] += 1
        for t, *_ in want - got:
            fn[t] += 1
    out = {}
    for t in sorted(set(tp) | set(fp) | set(fn)):
        out[t] = {"spans": tp[t] + fn[t], "found": tp[t], "false": fp[t],
                  "precision": tp[t] / (tp[t] + fp[t]) if tp[t] + fp[t] else 1.0,
                  "recall": tp[t] / (tp[t] + fn[t]) if tp[t] + fn[t] else 1.0}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--regenerate", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "RESULTS.md")
    args = ap.parse_args()
    if args.regenerate or not DATA.exists():
        DATA.parent.mkdir(exist_ok=True)
        DATA.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in generate()), encoding="utf-8")
    records = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines()]
    names = ("email", "url", "ip_address", "ssn", "credit_card", "phone", "iban", "national_id")
    scores = evaluate(records, names, REGIONS)
    spans = sum(len(r["spans"]) for r in records)
    inside = sum(1 for r in records for s in r["spans"] if len(r["text"]) > s["end"] - s["start"])
    lines = ["", "## PII pattern recognizers: precision and recall on a labelled set (`pii_eval.py`)", "",
             f"`benchmarks/pii_eval.py` on `benchmarks/data/pii_eval.jsonl`: {len(records)} texts, {spans} spans "
             f"({inside} inside running text), {sum(1 for r in records if r['decoy_of'])} decoys (wrong check "
             f"digits, dates, prices, order and version numbers, postcodes); recognizers "
             f"{', '.join(names)}; regions {', '.join(REGIONS)}.", "", *table(scores)]
    model, _ = detect(records, names, REGIONS)
    lines += ["", "`/pii/detect` on the same set: rampart-pii with those recognizers, every region enabled at once "
              "(the model's spans of the set's types scored with the recognizers' matches; a model span inside a "
              "number whose check failed, or a model phone number that is one, is dropped).", "", *table(model)]
    gliner, recognized = detect(records, names, REGIONS, "tiny-gliner", pii_labels=GLINER_LABELS)
    lines += ["", "The same with a GLiNER model: tiny-gliner asked for "
              f"{', '.join(repr(k) for k in GLINER_LABELS)}, and the same recognizers. **tiny-gliner has random "
              "weights**: its own spans are noise, so its precision says nothing of GLiNER; the table shows the "
              "mechanics: every span typed, recognizers and checksums on top, no entity inside another. The "
              "second table is the recognizers' part of that answer: a checked match wins over a model span it "
              "overlaps, so even beside random spans it is what the recognizers find alone.", "",
              "All spans:", "", *table(gliner), "", "The recognizers' spans in that answer:", "", *table(recognized),
              ""]
    return write_results(args.out, lines)


def table(scores: dict[str, dict[str, float]]) -> list[str]:
    lines = ["| type | spans | found | false positives | precision | recall |", "|---|---|---|---|---|---|"]
    for t, s in scores.items():
        lines.append(f"| {t} | {s['spans']} | {s['found']} | {s['false']} | {s['precision']:.3f} | {s['recall']:.3f} |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
