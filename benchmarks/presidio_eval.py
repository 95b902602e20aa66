"""Presidio's analyzer and rsinfer side by side on the labelled PII set (benchmarks/data/pii_eval.jsonl): precision and
recall per entity type both find.

    python3 -m venv /tmp/pv && /tmp/pv/bin/pip install presidio-analyzer      # once: Presidio and spaCy
    .venv/bin/python benchmarks/presidio_eval.py --presidio-python /tmp/pv/bin/python

Presidio runs its pattern recognizers only: a blank spaCy English pipeline (no NER model), its predefined
recognizers plus the national-id ones of the set's countries (ES NIF/NIE, IT fiscal code, PL PESEL) registered for
English, and its phone recognizer with the set's regions; score_threshold 0 (its default). rsinfer runs what
`/pii/detect` runs: rampart-pii with every recognizer and every region enabled at once. A span counts as found when
the same type covers the same characters; Presidio's names are mapped onto the set's types (PHONE_NUMBER → PHONE,
IBAN_CODE → IBAN, CREDIT_CARD → CREDIT_CARD_NUMBER, US_SSN → SSN, the national ids → NATIONAL_ID).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pii_eval
from _serve import write_results
from batching import machine

ROOT = Path(__file__).resolve().parent
TO_SET = {"PHONE_NUMBER": "PHONE", "IBAN_CODE": "IBAN", "CREDIT_CARD": "CREDIT_CARD_NUMBER", "IP_ADDRESS": "IP_ADDRESS",
          "US_SSN": "SSN", "UK_NHS": "NATIONAL_ID", "ES_NIF": "NATIONAL_ID", "ES_NIE": "NATIONAL_ID",
          "IT_FISCAL_CODE": "NATIONAL_ID", "PL_PESEL": "NATIONAL_ID", "IN_AADHAAR": "NATIONAL_ID"}

PRESIDIO = r"""
import json, sys, spacy
from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
from presidio_analyzer.nlp_engine import SpacyNlpEngine
from presidio_analyzer.predefined_recognizers import (EsNieRecognizer, EsNifRecognizer, ItFiscalCodeRecognizer,
                                                      PhoneRecognizer, PlPeselRecognizer)

class Blank(SpacyNlpEngine):
    def load(self):
        self.nlp = {"en": spacy.blank("en")}

regions = sys.argv[1].split(",")
engine = Blank(models=[{"lang_code": "en", "model_name": "blank"}])
engine.load()
registry = RecognizerRegistry()
registry.load_predefined_recognizers(languages=["en"], nlp_engine=engine)
registry.remove_recognizer("PhoneRecognizer")
registry.add_recognizer(PhoneRecognizer(supported_regions=regions))
for cls in (EsNifRecognizer, EsNieRecognizer, ItFiscalCodeRecognizer, PlPeselRecognizer):
    registry.add_recognizer(cls(supported_language="en"))
analyzer = AnalyzerEngine(registry=registry, nlp_engine=engine, supported_languages=["en"])
for line in sys.stdin:
    text = json.loads(line)["text"]
    print(json.dumps([[r.entity_type, r.start, r.end] for r in analyzer.analyze(text=text, language="en")]))
"""


def presidio(python: str, records: list[dict]) -> list[list[tuple[str, int, int]]]:
    stdin = "".join(json.dumps({"text": r["text"]}) + "\n" for r in records)
    out = subprocess.run([python, "-c", PRESIDIO, ",".join(pii_eval.REGIONS)], input=stdin, capture_output=True,
                         text=True, timeout=1800, check=True)
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    return [[(TO_SET[t], a, b) for t, a, b in row if t in TO_SET] for row in rows]


def version(python: str) -> str:
    out = subprocess.run([python, "-c", "from importlib.metadata import version as v; "
                          "print(v('presidio-analyzer'), v('spacy'))"], capture_output=True, text=True, timeout=120)
    return out.stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presidio-python", required=True, help="a python with presidio-analyzer installed")
    ap.add_argument("--out", type=Path, default=ROOT / "RESULTS.md")
    args = ap.parse_args()
    records = [json.loads(line) for line in pii_eval.DATA.read_text(encoding="utf-8").splitlines()]
    names = ("email", "url", "ip_address", "ssn", "credit_card", "phone", "iban", "national_id")
    ours, _ = pii_eval.detect(records, names, pii_eval.REGIONS)
    theirs = pii_eval.score(records, presidio(args.presidio_python, records))
    presidio_v, spacy_v = (version(args.presidio_python).split() + ["?", "?"])[:2]
    lines = ["", "## PII: Presidio's analyzer and rsinfer on the labelled set (`presidio_eval.py`)", "",
             f"Machine: {machine()}; presidio-analyzer {presidio_v}, spaCy {spacy_v} (a blank English pipeline: "
             "its pattern recognizers, no NER model). Reproduce: `python3 -m venv /tmp/pv && /tmp/pv/bin/pip "
             "install presidio-analyzer`, then `.venv/bin/python benchmarks/presidio_eval.py --presidio-python "
             "/tmp/pv/bin/python`. "
             f"`benchmarks/data/pii_eval.jsonl` ({len(records)} texts), every region enabled at once "
             f"({', '.join(pii_eval.REGIONS)}); rsinfer: rampart-pii with every recognizer, as `/pii/detect`.", "",
             "| type | spans | Presidio precision | Presidio recall | rsinfer precision | rsinfer recall |",
             "|---|---|---|---|---|---|"]
    for t in sorted(set(ours) | set(theirs)):
        o, p = ours.get(t), theirs.get(t)
        spans = (o or p or {}).get("spans", 0)
        cell = (lambda s, k: f"{s[k]:.3f}" if s else "-")  # noqa: E731
        lines.append(f"| {t} | {spans} | {cell(p, 'precision')} | {cell(p, 'recall')} | {cell(o, 'precision')} | "
                     f"{cell(o, 'recall')} |")
    lines.append("")
    return write_results(args.out, lines)


if __name__ == "__main__":
    sys.exit(main())
