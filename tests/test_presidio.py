"""Presidio's REST contract (server/routes/presidio.py), field by field as its docs give them: `POST /analyze`
(text, language, entities, score_threshold, return_decision_process, ad_hoc_recognizers, context, allow_list,
regex_flags) and `POST /anonymize` (text, analyzer_results, anonymizers: replace, redact, mask, hash, keep), with
rampart-pii from ../shared/models. Errors are Presidio's `{"error": "..."}`."""

from __future__ import annotations

import hashlib

import httpx
import pytest

from rsinfer_cli.config import parse_config

from serverutil import ServerThread

pytestmark = pytest.mark.shared

TEXT = "Call 212-555-0199 or write to john@example.com; card 4111 1111 1111 1111, IBAN DE89 3704 0044 0532 0130 00."
RESULT_KEYS = {"entity_type", "start", "end", "score", "analysis_explanation", "recognition_metadata"}
EXPLANATION_KEYS = {"recognizer", "pattern_name", "pattern", "original_score", "score", "textual_explanation",
                    "score_context_improvement", "supportive_context_word", "validation_result", "regex_flags"}


@pytest.fixture(scope="module")
def server(shared_models):
    cfg = parse_config({"models": [{"name": "pii", "kind": "pii", "path": str(shared_models / "rampart-pii"),
                                    "replicas": 1, "pii_hash_salt": "s"}]})
    with ServerThread(cfg) as srv:
        yield srv


def analyze(url: str, **body) -> list[dict]:
    r = httpx.post(url + "/analyze", json={"text": TEXT, "language": "en", **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def spans(results: list[dict], text: str = TEXT) -> set[tuple[str, str]]:
    return {(r["entity_type"], text[r["start"]:r["end"]]) for r in results}


def test_analyze_answers_presidios_result_fields_and_names(server):
    results = analyze(server.url)
    assert all(set(r) == RESULT_KEYS for r in results)
    assert all(r["analysis_explanation"] is None for r in results)       # only with return_decision_process
    assert all(set(r["recognition_metadata"]) == {"recognizer_name", "recognizer_identifier"} for r in results)
    assert {("PHONE_NUMBER", "212-555-0199"), ("EMAIL_ADDRESS", "john@example.com"),
            ("CREDIT_CARD", "4111 1111 1111 1111"), ("IBAN_CODE", "DE89 3704 0044 0532 0130 00")} <= spans(results)
    card = next(r for r in results if r["entity_type"] == "CREDIT_CARD")
    assert card["score"] == 1.0 and card["recognition_metadata"]["recognizer_name"] == "credit_card"
    explained = analyze(server.url, return_decision_process=True)
    assert all(set(r["analysis_explanation"]) == EXPLANATION_KEYS for r in explained)
    assert next(r for r in explained if r["entity_type"] == "IBAN_CODE")["analysis_explanation"]["recognizer"] == "iban"


def test_a_given_name_and_surname_are_one_person(server):
    """rampart-pii labels GIVEN_NAME and SURNAME; Presidio answers one PERSON for "Jane Roe"."""
    text = "Please ask Jane Roe about it."
    people = [r for r in analyze(server.url, text=text) if r["entity_type"] == "PERSON"]
    assert [text[r["start"]:r["end"]] for r in people] == ["Jane Roe"]


def test_entities_and_score_threshold_filter(server):
    assert spans(analyze(server.url, entities=["IBAN_CODE", "EMAIL_ADDRESS"])) == {
        ("EMAIL_ADDRESS", "john@example.com"), ("IBAN_CODE", "DE89 3704 0044 0532 0130 00")}
    assert all(r["score"] >= 0.99 for r in analyze(server.url, score_threshold=0.99))
    supported = httpx.get(server.url + "/supportedentities").json()
    assert {"PHONE_NUMBER", "EMAIL_ADDRESS", "CREDIT_CARD", "IBAN_CODE", "LOCATION", "PERSON"} <= set(supported)
    assert httpx.get(server.url + "/recognizers").json()[:2] == ["model", "email"]


def test_ad_hoc_recognizers_context_flags_and_allow_list(server):
    text = "Ticket zx-4411 was filed by ops. Reference ZX-9000 too."
    recognizer = {"name": "Ticket recognizer", "supported_language": "en", "supported_entity": "TICKET",
                  "patterns": [{"name": "ticket", "regex": r"zx-\d{4}", "score": 0.3}], "context": ["ticket"]}
    # 0.3 + 0.35 for the context word "Ticket" just before; ZX-9000 has no context and needs IGNORECASE
    got = spans(analyze(server.url, text=text, ad_hoc_recognizers=[recognizer], score_threshold=0.5), text)
    assert ("TICKET", "zx-4411") in got and ("TICKET", "ZX-9000") not in got
    loud = spans(analyze(server.url, text=text, ad_hoc_recognizers=[recognizer], regex_flags=2,
                         context=["reference"], score_threshold=0.5), text)
    assert {("TICKET", "zx-4411"), ("TICKET", "ZX-9000")} <= loud
    titles = {"supported_entity": "TITLE", "deny_list": ["Mr", "Mrs"]}          # Presidio's deny-list recognizer
    assert spans(analyze(server.url, text="Mr and Mrs Roe, Mrsa", ad_hoc_recognizers=[titles], entities=["TITLE"]),
                 "Mr and Mrs Roe, Mrsa") == {("TITLE", "Mr"), ("TITLE", "Mrs")}
    allowed = spans(analyze(server.url, allow_list=["JOHN@EXAMPLE.COM"]))
    assert ("EMAIL_ADDRESS", "john@example.com") not in allowed and ("CREDIT_CARD", "4111 1111 1111 1111") in allowed
    by_regex = spans(analyze(server.url, allow_list=[r".*@example\.com"], allow_list_match="regex"))
    assert ("EMAIL_ADDRESS", "john@example.com") not in by_regex


def test_anonymize_applies_each_operator_and_says_where(server):
    results = analyze(server.url)
    body = {"text": TEXT, "analyzer_results": results, "anonymizers": {
        "DEFAULT": {"type": "replace", "new_value": "<PII>"},
        "PHONE_NUMBER": {"type": "mask", "masking_char": "*", "chars_to_mask": 4, "from_end": True},
        "EMAIL_ADDRESS": {"type": "hash", "hash_type": "sha256"},
        "CREDIT_CARD": {"type": "redact"},
        "IBAN_CODE": {"type": "keep"}}}
    r = httpx.post(server.url + "/anonymize", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert set(out) == {"text", "items"}
    digest = hashlib.sha256(b"s" + b"john@example.com").hexdigest()
    assert out["text"] == f"Call 212-555-**** or write to {digest}; card , IBAN DE89 3704 0044 0532 0130 00."
    for item in out["items"]:                 # each item says what stands where in the anonymised text
        assert set(item) == {"start", "end", "entity_type", "text", "operator"}
        assert out["text"][item["start"]:item["end"]] == item["text"]
    ops = {i["entity_type"]: i["operator"] for i in out["items"]}
    assert ops == {"PHONE_NUMBER": "mask", "EMAIL_ADDRESS": "hash", "CREDIT_CARD": "redact", "IBAN_CODE": "keep"}
    # no removed value anywhere in the answer but where the operator keeps it
    assert "john@example.com" not in r.text and "4111 1111" not in r.text and "0199" not in r.text


def test_anonymize_defaults_and_overlaps(server):
    text = "Jane Roe lives at 1 Main St."
    results = [{"start": 0, "end": 8, "entity_type": "PERSON", "score": 0.9},
               {"start": 5, "end": 8, "entity_type": "PERSON", "score": 0.8},      # inside the first: covered
               {"start": 18, "end": 27, "entity_type": "LOCATION", "score": 0.7}]
    out = httpx.post(server.url + "/anonymize", json={"text": text, "analyzer_results": results}).json()
    assert out["text"] == "<PERSON> lives at <LOCATION>."          # Presidio's default: replace with <TYPE>
    assert [(i["start"], i["end"], i["operator"]) for i in out["items"]] == [(0, 8, "replace"), (18, 28, "replace")]


@pytest.mark.parametrize(("route", "body", "says"), [
    ("/analyze", {"text": TEXT}, "`language` is required"),
    ("/analyze", {"text": TEXT, "language": "en", "entities": ["NOPE"]}, "unknown entities NOPE"),
    ("/analyze", {"text": TEXT, "language": "en", "regex_flags": 64,
                  "ad_hoc_recognizers": [{"supported_entity": "X", "patterns": [{"regex": "x", "score": 1}]}]},
     "regex_flags 64"),
    ("/anonymize", {"text": "abc", "analyzer_results": [{"start": 1, "end": 9, "entity_type": "X"}]},
     "analyzer_results[0]: start 1 and end 9"),
    ("/anonymize", {"text": "abc", "analyzer_results": [], "anonymizers": {"DEFAULT": {"type": "encrypt"}}},
     "encrypt and decrypt need a key store"),
    ("/anonymize", {"text": "abc", "analyzer_results": [], "anonymizers": {"X": {"type": "mask"}}},
     "mask needs `masking_char`"),
])
def test_errors_are_presidios_body(server, route, body, says):
    r = httpx.post(server.url + route, json=body)
    assert r.status_code in (400, 422) and set(r.json()) == {"error"} and says in r.json()["error"], r.text
