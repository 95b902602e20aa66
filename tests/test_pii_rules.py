"""What a data team adds to PII detection (pipelines/pii_rules.py): pattern recognizers of its own (validated, with
context), allow and deny lists - in the model entry, per request (`/pii/detect`, `/pii/redact`) and in `rsinfer
redact` (`--patterns`, `--allow`) - with rampart-pii from ../shared/models; RE2 bounds a pathological pattern."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
import yaml
from stdnum import luhn

from rsinfer_cli.config import parse_config
from rsinfer_cli.errors import ConfigError, InputError
from rsinfer_cli.pipelines.pii_rules import request_rules

from serverutil import ServerThread

pytestmark = pytest.mark.shared

EMP_OK = "E123456" + luhn.calc_check_digit("123456")             # passes its Luhn check
EMP_BAD = "E123456" + str((int(luhn.calc_check_digit("123456")) + 1) % 10)
PATTERNS = [{"entity_type": "EMPLOYEE_ID", "regex": r"\bE\d{7}\b", "validator": "luhn"},
            {"entity_type": "TICKET", "regex": [r"\bT-\d{4}\b", r"\bTCK\d{6}\b"], "score": 0.4,
             "context": ["ticket"]}]
ALLOWED = "support@acme.com"
MODES = ("mask", "remove", "replace", "hash")


def entry(shared_models, **more) -> dict:
    return {"name": "pii", "kind": "pii", "path": str(shared_models / "rampart-pii"), "replicas": 1,
            "pii_patterns": PATTERNS, "allow_list": [ALLOWED], "deny_list": {"CODENAME": ["Bluebird"]}, **more}


@pytest.fixture(scope="module")
def server(shared_models):
    with ServerThread(parse_config({"models": [entry(shared_models)]})) as srv:
        yield srv


def detect(url: str, text: str, **body) -> list[tuple[str, str]]:
    r = httpx.post(url + "/pii/detect", json={"text": text, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return [(e["entity_type"], e["text"]) for e in r.json()["results"][0]["entities"]]


def redact(url: str, text: str, mode: str = "replace", **body) -> str:
    r = httpx.post(url + "/pii/redact", json={"text": text, "mode": mode, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["results"][0]["text"]


def test_a_custom_id_is_found_only_when_its_validator_passes(server):
    found = detect(server.url, f"Employees {EMP_OK} and {EMP_BAD} signed.")
    assert ("EMPLOYEE_ID", EMP_OK) in found and ("EMPLOYEE_ID", EMP_BAD) not in found
    assert "<EMPLOYEE_ID>" in redact(server.url, f"Employee {EMP_OK} signed.")


def test_context_words_raise_a_weak_pattern_over_the_threshold(server):
    """TICKET scores 0.4 (below the threshold 0.5) unless "ticket" stands among the five words before it."""
    assert ("TICKET", "T-9876") in detect(server.url, "The ticket we opened, T-9876, is about billing.")
    assert ("TICKET", "T-9876") not in detect(server.url, "Reference T-9876 is about billing.")
    assert ("TICKET", "TCK123456") in detect(server.url, "ticket TCK123456 closed")      # its second regex


@pytest.mark.parametrize("mode", MODES)
def test_an_allowed_value_is_kept_in_every_mode(server, mode):
    """The allow list keeps the company's support address readable (any case: NFKC and case folding), while
    another address in the same text is redacted."""
    text = f"Write to {ALLOWED} or SUPPORT@ACME.COM, not to jane.roe@example.org."
    out = redact(server.url, text, mode)
    assert ALLOWED in out and "SUPPORT@ACME.COM" in out and "jane.roe@example.org" not in out
    assert ("EMAIL", ALLOWED) not in detect(server.url, text)


@pytest.mark.parametrize("mode", MODES)
def test_a_denied_term_is_redacted_as_its_type(server, mode):
    text = "The Bluebird launch and the BLUEBIRD budget; bluebirds sing."
    out = redact(server.url, text, mode)
    assert "Bluebird " not in out and "BLUEBIRD" not in out and "bluebirds" in out   # whole words only
    found = detect(server.url, text)
    assert ("CODENAME", "Bluebird") in found and ("CODENAME", "BLUEBIRD") in found


def test_a_request_pattern_and_lists_apply_to_that_request_only(server):
    text = "Order #12345 from jane.roe@example.org about Falcon."
    body = {"patterns": [{"entity_type": "ORDER_ID", "regex": r"#\d{5}"}], "allow_list": ["jane.roe@example.org"],
            "deny_list": {"CODENAME": ["Falcon"]}}
    assert redact(server.url, text, **body) == "Order <ORDER_ID> from jane.roe@example.org about <CODENAME>."
    alone = redact(server.url, text)                                  # the next request: none of them
    assert alone.startswith("Order #12345 from <EMAIL> about ") and "<CODENAME>" not in alone
    # Presidio's ad-hoc recognizer shape, and a regex allow list that must match the whole value
    presidio = {"patterns": [{"name": "orders", "supported_entity": "ORDER_ID",
                              "patterns": [{"name": "o", "regex": r"#\d{5}", "score": 0.9}]}],
                "allow_list": [r"[a-z.]+@example\.org"], "allow_list_match": "regex"}
    assert redact(server.url, text, **presidio).startswith("Order <ORDER_ID> from jane.roe@example.org about ")
    assert detect(server.url, text, types=["ORDER_ID"], **presidio) == [("ORDER_ID", "#12345")]


def test_a_pathological_regex_is_bounded(server):
    """`(a+)+$` backtracks exponentially in Python's re (2^n steps on n a's and a b); on RE2 it is linear, so the
    request answers (well inside the client's 60 s). A backreference, which RE2 cannot run, is a 400 that says so."""
    text = "a" * 20000 + "b"
    assert detect(server.url, text, patterns=[{"entity_type": "BAD", "regex": "(a+)+$"}]) == []
    r = httpx.post(server.url + "/pii/detect", json={"text": "abab", "patterns": [
        {"entity_type": "BAD", "regex": r"(ab)\1"}]})
    assert r.status_code == 400 and "patterns[0].regex[0]" in r.json()["error"]["message"]
    assert "not an RE2 regular expression" in r.json()["error"]["message"]


@pytest.mark.parametrize(("body", "says"), [
    ({"patterns": [{"entity_type": "two words", "regex": "x"}]}, "patterns[0].entity_type"),
    ({"patterns": [{"entity_type": "X", "regex": "x", "validator": "stdnum.nope"}]}, "no module 'stdnum.nope'"),
    ({"patterns": [{"entity_type": "X", "regex": "x"}] * 33}, "at most 32"),
    ({"deny_list": {"CODENAME": ["x" * 201]}}, "deny_list.CODENAME: at most 1000 values"),
    ({"allow_list": ["("], "allow_list_match": "regex"}, "allow_list[0]"),
    ({"types": ["NOPE"]}, "unknown entity type"),
])
def test_bad_rules_are_a_400_naming_the_field(server, body, says):
    r = httpx.post(server.url + "/pii/redact", json={"text": "x", **body})
    assert r.status_code in (400, 422) and says in r.json()["error"]["message"], r.text


def test_config_rules_are_checked_at_start_with_their_key_path(shared_models):
    def error(**keys) -> str:
        with pytest.raises(ConfigError) as exc:
            parse_config({"models": [{**entry(shared_models), **keys}]})
        return str(exc.value)

    assert "models[0].pii_patterns[1].regex[0]: '(?<=a)b' is not an RE2 regular expression" in error(
        pii_patterns=[PATTERNS[0], {"entity_type": "X", "regex": "(?<=a)b"}])
    assert "models[0].pii_patterns[0].validator" in error(pii_patterns=[{"entity_type": "X", "regex": "x",
                                                                          "validator": "md5"}])
    assert "models[0].allow_list_match: must be one of exact, regex" in error(allow_list_match="glob")
    with pytest.raises(InputError, match="allow_list_match"):
        request_rules(None, ["x"], "glob", None)


def test_rsinfer_redact_takes_patterns_and_an_allow_file(shared_models, tmp_path):
    """`rsinfer redact --patterns FILE --allow FILE` on JSONL: every line out in order, the custom id redacted,
    the allowed value kept; a bad pattern file is an error naming the file and the entry."""
    lines = [{"id": i, "text": t} for i, t in enumerate([
        f"Employee {EMP_OK} wrote to {ALLOWED}.", "Ticket TCK123456 from jane.roe@example.org.", "Nothing here."])]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    patterns = tmp_path / "patterns.yaml"
    patterns.write_text(yaml.safe_dump(PATTERNS))
    allow = tmp_path / "allow.txt"
    allow.write_text(f"{ALLOWED}\n")
    run = [sys.executable, "-m", "rsinfer_cli", "redact", "--path", str(shared_models / "rampart-pii"),
           "--mode", "replace", "--input", str(src)]
    proc = subprocess.run([*run, "--patterns", str(patterns), "--allow", str(allow)], capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(x) for x in proc.stdout.splitlines()]
    assert [x["id"] for x in out] == [0, 1, 2]
    assert out[0]["text"] == f"Employee <EMPLOYEE_ID> wrote to {ALLOWED}."
    assert "<TICKET>" in out[1]["text"] and "<EMAIL>" in out[1]["text"] and out[2]["text"] == "Nothing here."
    plain = subprocess.run(run, capture_output=True, text=True, timeout=180)          # without them
    assert plain.returncode == 0 and "<EMPLOYEE_ID>" not in plain.stdout and "<TICKET>" not in plain.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump([{"entity_type": "X", "regex": "(a)\\1"}]))
    proc = subprocess.run([*run, "--patterns", str(bad)], capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0 and f"--patterns {bad}: [0].regex[0]" in proc.stderr, proc.stderr
