"""Presidio's REST contract (server/routes/presidio.py), field by field as its docs give them: `POST /analyze`
(text, language, entities, score_threshold, return_decision_process, ad_hoc_recognizers, context, allow_list,
regex_flags) and `POST /anonymize` (text, analyzer_results, anonymizers: replace, redact, mask, hash, keep), with
rampart-pii from ../shared/models. Errors are Presidio's `{"error": "..."}`."""

from __future__ import annotations

import functools
import hashlib

import httpx
import pytest

from rsinfer_cli.config import parse_config

from serverutil import ServerThread

pytestmark = pytest.mark.shared

TEXT = "Call 212-555-0199 or write to john@example.com; card 4111 1111 1111 1111, IBAN DE89 3704 0044 0532 0130 00."
RESULT_KEYS = {"entity_type", "start", "end", "score", "analysis_explanation"}   # Presidio's REST answer
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
    assert {("PHONE_NUMBER", "212-555-0199"), ("EMAIL_ADDRESS", "john@example.com"),
            ("CREDIT_CARD", "4111 1111 1111 1111"), ("IBAN_CODE", "DE89 3704 0044 0532 0130 00")} <= spans(results)
    card = next(r for r in results if r["entity_type"] == "CREDIT_CARD")
    assert card["score"] == 1.0
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
    digest = hashlib.sha256(b"john@example.com" + b"s").hexdigest()         # Presidio's order: value, then salt
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
    # Presidio's order: the operators ran from the last span to the first
    assert [(i["start"], i["end"], i["operator"]) for i in out["items"]] == [(18, 28, "replace"), (0, 8, "replace")]


@pytest.mark.parametrize(("route", "body", "says"), [
    ("/analyze", {"text": TEXT}, "`language` is required"),
    ("/analyze", {"text": TEXT, "language": "xx"}, "language 'xx' is not supported"),
    ("/analyze", {"text": TEXT, "language": "en", "regex_flags": 64,
                  "ad_hoc_recognizers": [{"supported_entity": "X", "patterns": [{"regex": "x", "score": 1}]}]},
     "regex_flags 64"),
    ("/anonymize", {"text": "abc", "analyzer_results": [{"start": 1, "end": 9, "entity_type": "X"}]},
     "analyzer_results[0]: start 1 and end 9"),
    ("/anonymize", {"text": "abc", "analyzer_results": [], "anonymizers": {"DEFAULT": {"type": "encrypt"}}},
     "key must be of length 128, 192 or 256 bits"),
    ("/anonymize", {"text": "abc", "analyzer_results": [], "anonymizers": {"X": {"type": "mask"}}},
     "mask needs `masking_char`"),
])
def test_errors_are_presidios_body(server, route, body, says):
    r = httpx.post(server.url + route, json=body)
    assert r.status_code in (400, 422) and set(r.json()) == {"error"} and says in r.json()["error"], r.text


# ---------------------------------------------------------------- Presidio's contract, point by point


def test_analyze_takes_a_list_of_texts_and_answers_each_as_alone(server):
    texts = [f"Ticket {i}: call 212-555-{i:04d}, mail user{i}@example.com, Jane Roe" for i in range(45)] + \
        ["", "nothing here", TEXT, "Please ask Jane Roe about it.", "IBAN DE89 3704 0044 0532 0130 00"]
    batch = analyze(server.url, text=texts)
    assert len(batch) == 50
    for text, got in zip(texts, batch, strict=True):
        assert got == analyze(server.url, text=text)


def test_decision_process_flag_entities_and_language(server):
    assert all(r["analysis_explanation"] is None for r in analyze(server.url, return_decision_process=0))
    assert all(r["analysis_explanation"] for r in analyze(server.url, return_decision_process=1))
    assert analyze(server.url, entities=[]) == analyze(server.url)                     # []: every entity
    assert spans(analyze(server.url, entities=["IBAN_CODE", "NOT_A_TYPE"])) == {
        ("IBAN_CODE", "DE89 3704 0044 0532 0130 00")}                                   # an unknown type is ignored
    for path in ("/supportedentities?language=xx", "/recognizers?language=xx"):
        r = httpx.get(server.url + path)
        assert r.status_code == 400 and "language 'xx' is not supported" in r.json()["error"]
    assert httpx.get(server.url + "/supportedentities?language=en").status_code == 200


def test_ad_hoc_patterns_flags_threshold_context_and_explanation(server):
    text = "order ab-12 and AB-34; Account number: acct-777"
    low = {"name": "order rec", "supported_entity": "ORDER-ID", "patterns": [
        {"name": "order pattern", "regex": r"ab-\d\d", "score": 0.05}]}
    got = analyze(server.url, text=text, ad_hoc_recognizers=[low], score_threshold=0, return_decision_process=True)
    orders = [r for r in got if r["entity_type"] == "ORDER-ID"]
    # below the model's threshold yet kept at score_threshold 0; IGNORECASE by default; a hyphen in the type
    assert [text[r["start"]:r["end"]] for r in orders] == ["ab-12", "AB-34"] and orders[0]["score"] == 0.05
    how = orders[0]["analysis_explanation"]
    assert how["pattern_name"] == "order rec" and how["pattern"] == r"ab-\d\d" and how["original_score"] == 0.05
    assert not [r for r in analyze(server.url, text=text, ad_hoc_recognizers=[low], score_threshold=0.1)
                if r["entity_type"] == "ORDER-ID"]
    ctx = {"name": "acct", "supported_entity": "ACCOUNT", "context": ["account"],
           "patterns": [{"name": "acct", "regex": r"acct-\d+", "score": 0.01}]}
    (acct,) = [r for r in analyze(server.url, text=text, ad_hoc_recognizers=[ctx], score_threshold=0,
                                  return_decision_process=True) if r["entity_type"] == "ACCOUNT"]
    assert acct["score"] == 0.4        # 0.01 + 0.35 raised to Presidio's floor for a context-supported result
    assert acct["analysis_explanation"]["supportive_context_word"] == "Account"
    assert acct["analysis_explanation"]["score_context_improvement"] == pytest.approx(0.39)
    allow = analyze(server.url, text=text, ad_hoc_recognizers=[low], score_threshold=0, allow_list=["AB-\\d+"],
                    allow_list_match="regex")
    assert not [r for r in allow if r["entity_type"] == "ORDER-ID"]    # a regex allow list ignores case too


@functools.cache
def presidio_engine():
    from presidio_anonymizer import AnonymizerEngine

    return AnonymizerEngine()


def presidio_anonymize(text, results, operators):
    from presidio_anonymizer.entities import OperatorConfig, RecognizerResult

    out = presidio_engine().anonymize(
        text, [RecognizerResult(r["entity_type"], r["start"], r["end"], r["score"]) for r in results],
        {k: OperatorConfig(v["type"], {p: q for p, q in v.items() if p != "type"}) for k, v in operators.items()})
    return {"text": out.text, "items": [{"start": i.start, "end": i.end, "entity_type": i.entity_type, "text": i.text,
                                         "operator": i.operator} for i in out.items]}


def test_anonymize_resolves_conflicts_as_presidio_does(server):
    """Overlapping, contained, equal and space-separated spans of mixed types, with keep among the operators: the
    answer is presidio-anonymizer's own, item for item (300 random cases and Presidio's documented ones)."""
    import random

    rnd = random.Random(7)
    text = "I'm George Washington Square Park and Jane  Roe, Jane Roe; call 212 555 0199 now."
    cases = [([(4, 21, "NAME", 0.8), (11, 33, "LOCATION", 0.8)], {"NAME": "keep"}),
             ([(4, 21, "NAME", 0.8), (11, 33, "LOCATION", 0.8)], {"LOCATION": "keep"}),
             ([(38, 42, "PERSON", 0.9), (44, 47, "PERSON", 0.9), (49, 53, "PERSON", 0.7), (54, 57, "PERSON", 0.7)], {})]
    for _ in range(300):
        spans_ = []
        for _ in range(rnd.randint(1, 5)):
            a = rnd.randint(0, len(text) - 1)
            spans_.append((a, rnd.randint(a, min(len(text), a + 25)), rnd.choice("ABC"), rnd.choice([0.5, 0.8])))
        cases.append((spans_, {t: rnd.choice(["keep", "replace", "redact"]) for t in "AB" if rnd.random() < 0.5}))
    with httpx.Client(base_url=server.url) as client:
        for spans_, ops in cases:
            results = [{"start": a, "end": b, "entity_type": t, "score": s} for a, b, t, s in spans_]
            operators = {k: {"type": v} for k, v in ops.items()}
            got = client.post("/anonymize", json={"text": text, "analyzer_results": results,
                                                  "anonymizers": operators}).json()
            assert got == presidio_anonymize(text, results, operators), (spans_, ops)


def test_encrypt_and_decrypt_interoperate_with_presidio(server):
    from presidio_anonymizer import AnonymizerEngine, DeanonymizeEngine
    from presidio_anonymizer.entities import OperatorConfig, OperatorResult, RecognizerResult

    text, key = "My name is Jane Roe, IBAN DE89 3704 0044 0532 0130 00.", "0123456789abcdef0123456789abcdef"
    theirs = AnonymizerEngine().anonymize(text, [RecognizerResult("PERSON", 11, 19, 0.9)],
                                          {"DEFAULT": OperatorConfig("encrypt", {"key": key})})
    (item,) = theirs.items
    back = httpx.post(server.url + "/deanonymize", json={
        "text": theirs.text, "deanonymizers": {"DEFAULT": {"type": "decrypt", "key": key}},
        "anonymizer_results": [{"start": item.start, "end": item.end, "entity_type": "PERSON"}]}).json()
    assert back["text"] == text and back["items"][0]["operator"] == "decrypt"
    ours = httpx.post(server.url + "/anonymize", json={
        "text": text, "analyzer_results": [{"start": 11, "end": 19, "entity_type": "PERSON", "score": 0.9}],
        "anonymizers": {"PERSON": {"type": "encrypt", "key": key}}}).json()
    assert "Jane" not in ours["text"]
    (mine,) = ours["items"]
    restored = DeanonymizeEngine().deanonymize(ours["text"], [OperatorResult(
        mine["start"], mine["end"], "PERSON", mine["text"], "encrypt")], {"DEFAULT": OperatorConfig(
            "decrypt", {"key": key})})
    assert restored.text == text
    wrong = httpx.post(server.url + "/deanonymize", json={
        "text": theirs.text, "deanonymizers": {"DEFAULT": {"type": "decrypt", "key": "1" * 16}},
        "anonymizer_results": [{"start": item.start, "end": item.end, "entity_type": "PERSON"}]})
    assert wrong.status_code == 400 and "Jane" not in wrong.text
    assert httpx.post(server.url + "/deanonymize", content=b"{ }").status_code == 400
    assert httpx.post(server.url + "/deanonymize", json={"key": "x"}).json() == {"text": "", "items": []}
    assert httpx.get(server.url + "/anonymizers").json() == ["hash", "mask", "redact", "replace", "encrypt", "custom"]
    assert httpx.get(server.url + "/deanonymizers").json() == ["decrypt"]


def test_hash_salt_and_replace_defaults(server):
    body = {"text": "mail a@b.co", "analyzer_results": [{"start": 5, "end": 11, "entity_type": "EMAIL", "score": 1}]}
    salted = httpx.post(server.url + "/anonymize", json={**body, "anonymizers": {
        "EMAIL": {"type": "hash", "salt": "0123456789abcdef"}}}).json()
    assert salted["text"] == "mail " + hashlib.sha256(b"a@b.co0123456789abcdef").hexdigest()
    short = httpx.post(server.url + "/anonymize", json={**body, "anonymizers": {"EMAIL": {"type": "hash",
                                                                                          "salt": "short"}}})
    assert short.status_code == 422 and "at least 16 bytes" in short.json()["error"]
    empty = httpx.post(server.url + "/anonymize", json={**body, "anonymizers": {"EMAIL": {"type": "replace",
                                                                                          "new_value": ""}}})
    assert empty.json()["text"] == "mail <EMAIL>"
