"""Record policies (pipelines/records.py) and the pseudonym and numbered modes (pseudonym.py, replacer.py): path
grammar and policy errors, which node each rule reaches, and a nested JSONL corpus redacted through the CLI, the
Python API and `/pii/redact` alike - declared fields as declared, every other byte as it was, the order kept; the
same value written differently becoming one token across records, runs and keys."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import httpx
import pytest

from rsinfer_cli.config import parse_config
from rsinfer_cli.errors import ConfigError, InputError
from rsinfer_cli.pipelines.pii import Entity
from rsinfer_cli.pipelines.pseudonym import Pseudonyms, normalise, parse_key
from rsinfer_cli.pipelines.records import Policy, parse_path
from rsinfer_cli.pipelines.replacer import Replacer

from serverutil import ServerThread

KEY = bytes(range(32))
OTHER = bytes(range(1, 33))
POLICY = {"default": "keep", "fields": {
    "id": "keep",
    "user.email": {"action": "redact", "type": "EMAIL"},
    "customer.phone": {"action": "redact", "type": "PHONE"},
    "customer.name": {"action": "redact", "type": "PERSON"},
    "messages[*].content": "scan",
    "tickets[*].body": {"action": "scan", "types": ["EMAIL", "PHONE"], "threshold": 0.6},
    "internal_notes": "drop",
    "attachments[*].*.secret": "drop"}}
HANDLED = ("user.email", "customer.phone", "customer.name", "messages", "tickets", "internal_notes", "attachments")

# ---------------------------------------------------------------- the policy itself


@pytest.mark.parametrize(("path", "why"), [
    ("a..b", "not a path"), ("[*]", "not a path"), ("a[*", "not a path"), ("a.", "not a path"), ("a[x]", "not a path"),
    ("", "not a path")])
def test_a_bad_path_names_its_key(path, why):
    with pytest.raises(ConfigError, match=why):
        Policy.of({"fields": {path: "keep"}})


def test_path_steps():
    steps = parse_path('a.*[*][2]."x.y"', "w")
    assert steps[0] == "a" and steps[3] == 2 and steps[4] == "x.y" and len(steps) == 5


@pytest.mark.parametrize(("policy", "says"), [
    ({"default": "redact"}, "policy: default: keep or scan"),
    ({"fields": {"a": "hide"}}, "policy: fields.a.action: one of keep, scan, redact, drop, got 'hide'"),
    ({"fields": {"a": {"action": "redact"}}}, "fields.a.type: a redact rule names the entity type"),
    ({"fields": {"a": {"action": "scan", "threshold": 2}}}, "fields.a.threshold: a number between 0 and 1"),
    ({"fields": {"a": {"action": "scan", "types": "EMAIL"}}}, "fields.a.types: a list of entity types"),
    ({"fields": {"a": {"action": "keep", "type": "EMAIL"}}}, "fields.a.type: not a key of a `keep` rule"),
    ({"fields": {"a": {"action": "drop", "required": "yes"}}}, "fields.a.required: true or false"),
    ({"fields": ["a"]}, "fields: a mapping"), ({"field": {}}, "field: not a policy key"), ([], "a mapping")])
def test_a_malformed_policy_names_the_key_path(policy, says):
    with pytest.raises(ConfigError) as err:
        Policy.of(policy, "policy")
    assert err.value.message.startswith(says if says.startswith("policy") else f"policy: {says}")


def plan_of(policy: dict, record: dict):
    planned = Policy.of(policy).plan([record], lambda i: f"line {i + 1}")
    return planned, {s.path: s.action for s in planned.records[0][1]}


def test_a_rule_holds_below_its_node_unless_a_deeper_path_names_one():
    record = {"a": {"b": "x", "c": {"d": "y"}, "n": 5}, "e": ["p", "q"], "f": "z", "g": None}
    _, acts = plan_of({"default": "keep", "fields": {"a": "scan", "a.c": "keep", "e[1]": "scan"}}, record)
    assert acts == {"a.b": "scan", "e[1]": "scan"}            # numbers and kept subtrees are not scanned
    _, acts = plan_of({"default": "scan", "fields": {"a.*": "keep", "a.b": "drop"}}, record)
    assert acts == {"a.b": "drop", "e[0]": "scan", "e[1]": "scan", "f": "scan"}   # a literal step beats *
    _, acts = plan_of({"fields": {"g": {"action": "redact", "type": "X"}, "f": "drop", "f2": "drop"}}, record)
    assert acts == {"f": "drop"}          # a null has nothing to redact; a path matching nothing passes


def test_a_required_path_missing_is_an_error_naming_the_record():
    with pytest.raises(InputError, match=r"^line 1: required path 'x\[\*\]\.y' matches nothing"):
        plan_of({"fields": {"x[*].y": {"action": "scan", "required": True}}}, {"x": [{"z": "a"}]})


def test_drops_and_whole_values():
    planned, _ = plan_of(POLICY, {"user": {"email": "A@B.co"}, "customer": {"phone": 4155550100, "name": ["J", "D"]},
                                  "attachments": [{"f": {"secret": 1, "ok": 2}}, {"g": {"secret": 3}}],
                                  "internal_notes": {"deep": True}})
    ((record, spans),) = planned.redact({}, Replacer("replace"))
    assert record == {"user": {"email": "<EMAIL>"}, "customer": {"phone": "<PHONE>", "name": "<PERSON>"},
                      "attachments": [{"f": {"ok": 2}}, {"g": {}}]}
    assert [s.to_json()["end"] for s in spans["customer.phone"]] == [10]      # 4155550100, whole
    assert "A@B.co" not in json.dumps([record, {k: [s.to_json() for s in v] for k, v in spans.items()}])


# ---------------------------------------------------------------- pseudonyms and numbering


def test_key_formats_and_refusals():
    assert parse_key(KEY.hex(), "k") == KEY == parse_key("  " + __import__("base64").b64encode(KEY).decode(), "k")
    with pytest.raises(ConfigError, match="has 64 bits; at least 128"):
        parse_key("00" * 8, "--key-file k")
    with pytest.raises(ConfigError, match="hex or base64"):
        parse_key("not a key!", "k")
    assert KEY.hex() not in repr(Pseudonyms(KEY)) and "key_id" in repr(Pseudonyms(KEY))


@pytest.mark.parametrize(("etype", "ways"), [
    ("EMAIL", ["Jane.Doe@Example.COM", " jane.doe@example.com", "JANE.DOE@EXAMPLE.COM"]),
    ("PHONE", ["(415) 555-0100", "+1 415-555-0100", "415.555.0100", "4155550100", "+14155550100"]),
    ("PERSON", ["Jane Doe", "JANE  DOE", "Jane\u00a0Doe", "jane doe\n"]),
    ("IBAN", ["DE89 3704 0044 0532 0130 00", "de89370400440532013000"]),
    ("NATIONAL_ID", ["123-45-6789", "123456789", "123.45.6789"])])
def test_one_value_written_differently_is_one_pseudonym(etype, ways):
    one, other = Pseudonyms(KEY), Pseudonyms(OTHER)
    assert len({one.token(etype, w) for w in ways}) == 1
    assert {one.token(etype, w) for w in ways}.isdisjoint({other.token(etype, w) for w in ways})
    assert one.token(etype, ways[0]).startswith(f"<{etype}_") and len(one.digest(etype, ways[0])) == 8


def test_pseudonyms_keep_types_and_values_apart():
    p = Pseudonyms(KEY, "<{type}:{key_id}:{hash}>", width=12)
    # one kind, one hash: rsinfer's and Presidio's names of a type, a given name and a surname
    assert p.digest("GIVEN_NAME", "Jordan") == p.digest("SURNAME", "jordan") == p.digest("PERSON", "JORDAN")
    assert p.digest("PHONE", "(415) 555-0100") == p.digest("PHONE_NUMBER", "+14155550100")
    assert p.digest("EMAIL", "a@b.co") == p.digest("EMAIL_ADDRESS", "A@B.CO") != p.digest("URL", "a@b.co")
    assert p.token("EMAIL", "a@b.co") != p.token("EMAIL", "a@b.com")
    assert p.token("X", "v").split(":")[1] == p.key_id and len(p.digest("X", "v")) == 12
    assert normalise("PHONE", "020 7946 0018", "GB") == "+442079460018"
    with pytest.raises(ConfigError, match=r"\{hash\}"):
        Pseudonyms(KEY, "<{type}>")


def test_numbered_counts_per_record_in_order_of_first_appearance():
    r = Replacer("numbered")
    got = [r("PERSON", v) for v in ("Jane Doe", "John Roe", "jane  doe")] + [r("EMAIL", "a@b.co")]
    assert got == ["<PERSON_1>", "<PERSON_2>", "<PERSON_1>", "<EMAIL_1>"]
    assert r.record()("PERSON", "John Roe") == "<PERSON_1>"
    with pytest.raises(InputError, match="needs a key"):
        Replacer("pseudonym")


# ---------------------------------------------------------------- a nested corpus through every front


def corpus(n: int = 40) -> list[dict]:
    emails = ["Jane.Doe@Example.com", "jane.doe@example.com ", "JANE.DOE@EXAMPLE.COM"]
    phones = [4155550100, "(415) 555-0100", "+1 415-555-0100"]
    out = []
    for i in range(n):
        rec: dict = {"id": i, "ünïcode": "é☃\u2028", "score": i / 3, "flag": i % 2 == 0, "none": None}
        if i % 5 != 4:                                    # some records lack the paths
            rec["user"] = {"email": emails[i % 3], "plan": "pro"}
            rec["customer"] = {"phone": phones[i % 3], "name": "Jane  Doe" if i % 2 else "jane doe", "tier": i}
        rec["messages"] = [{"role": "user", "content": f"Mail me at jane.doe@example.com or call (415) 555-0100, "
                                                       f"ticket {i}"},
                           {"role": "agent", "content": None}, {"role": "agent", "n": 1}][: 1 + i % 3]
        rec["tickets"] = [{"body": "Write to JANE.DOE@example.com", "tags": ["a", {"b": [1, 2]}]}] if i % 4 else []
        if i % 3 == 0:
            rec["internal_notes"] = "VIP, knows the CEO"
        if i % 7 == 0:
            rec["attachments"] = [{"f": {"secret": "s3cr3t", "size": 10}}]
        out.append(rec)
    return out


def untouched(record: dict) -> dict:
    """The record without the paths the policy handles (and the spans the CLI adds)."""
    rec = copy.deepcopy(record)
    for key in (*HANDLED, "pii_spans"):
        head, _, rest = key.partition(".")
        if rest and isinstance(rec.get(head), dict):
            rec[head].pop(rest, None)
        elif not rest:
            rec.pop(head, None)
    return rec


def check_corpus(records: list[dict], got: list[dict]) -> None:
    assert len(got) == len(records)
    tokens: dict[str, set[str]] = {"EMAIL": set(), "PHONE": set(), "PERSON": set()}
    for want, out in zip(records, got, strict=True):
        assert out["id"] == want["id"]                                   # the order kept
        assert json.dumps(untouched(want), sort_keys=True) == json.dumps(untouched(out), sort_keys=True)
        assert "internal_notes" not in out
        if "user" in want:
            tokens["EMAIL"].add(out["user"]["email"])
            tokens["PHONE"].add(out["customer"]["phone"])
            tokens["PERSON"].add(out["customer"]["name"])
            assert out["user"]["plan"] == "pro" and out["customer"]["tier"] == want["customer"]["tier"]
        first = out["messages"][0]["content"]
        tokens["EMAIL"].update(w.strip(",") for w in first.split() if w.startswith("<EMAIL"))
        for t in out["tickets"]:
            assert t["body"].startswith("Write to <EMAIL_") and t["tags"] == ["a", {"b": [1, 2]}]
        for a in out.get("attachments", []):
            assert a == {"f": {"size": 10}}
        text = json.dumps(out, ensure_ascii=False)
        for secret in ("jane.doe", "JANE.DOE", "555-0100", "4155550100", "Jane", "s3cr3t", "VIP", KEY.hex()):
            assert secret not in text
    assert all(len(v) == 1 for v in tokens.values()), tokens            # one token each, however written


def cli(shared_models, *args, stdin: str, env: dict | None = None):
    return subprocess.run([sys.executable, "-m", "rsinfer_cli", *args, "--path", str(shared_models / "rampart-pii")],
                          input=stdin, capture_output=True, text=True, timeout=180,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("records")
    import yaml

    (d / "policy.yaml").write_text(yaml.safe_dump(POLICY))
    (d / "k.key").write_text(KEY.hex() + "\n")
    (d / "other.key").write_text(__import__("base64").b64encode(OTHER).decode())
    return d


@pytest.mark.shared
def test_cli_api_and_server_redact_the_corpus_alike(shared_models, files):
    from rsinfer_cli import load

    records = corpus()
    stdin = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    run = cli(shared_models, "redact", "--policy", str(files / "policy.yaml"), "--mode", "pseudonym",
              "--key-file", str(files / "k.key"), "--batch-lines", "7", stdin=stdin)
    assert run.returncode == 0, run.stderr
    by_cli = [json.loads(line) for line in run.stdout.split("\n") if line]
    check_corpus(records, by_cli)
    assert KEY.hex() not in run.stderr and "jane" not in run.stderr.lower()
    with load(path=str(shared_models / "rampart-pii")) as model:
        by_api = [r.record for r in model.redact_records(records, POLICY, mode="pseudonym", key=KEY)]
        assert records == corpus()                                      # the records given are not changed
        found = model.detect_records(records[:2], files / "policy.yaml")
    assert by_api == by_cli
    assert found[0]["user.email"][0].text == "Jane.Doe@Example.com" and "messages[0].content" in found[0]
    cfg = parse_config({"models": [{"name": "pii", "kind": "pii", "path": str(shared_models / "rampart-pii"),
                                    "replicas": 1, "pii_pseudonym_key_file": str(files / "k.key")}]})
    with ServerThread(cfg) as srv:
        r = httpx.post(srv.url + "/pii/redact", json={"records": records, "policy": POLICY, "mode": "pseudonym"},
                       timeout=120)
        assert r.status_code == 200, r.text
        body = r.json()
        metrics = httpx.get(srv.url + "/metrics").text
        op = httpx.post(srv.url + "/anonymize", json={"text": "jane.doe@example.com", "analyzer_results": [
            {"start": 0, "end": 20, "entity_type": "EMAIL", "score": 1}], "anonymizers": {
                "DEFAULT": {"type": "pseudonym"}}}).json()
        bad = httpx.post(srv.url + "/pii/redact", json={"records": [{}], "policy": {"fields": {"a": "zap"}}})
        missing = httpx.post(srv.url + "/pii/redact", json={
            "records": [{"a": "x"}, {}], "policy": {"fields": {"a": {"action": "scan", "required": True}}}})
    assert [x["record"] for x in body["records"]] == by_cli and body["results"] == []
    assert body["records"][0]["entities"]["user.email"][0]["replacement"].startswith("<EMAIL_")
    assert op["text"] == by_cli[0]["user"]["email"]           # /anonymize's pseudonym operator: the same token
    assert "jane" not in metrics.lower() and KEY.hex() not in metrics
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "policy"
    assert "fields.a.action" in bad.json()["error"]["message"]
    assert missing.status_code == 400 and "records[1]: required path 'a'" in missing.json()["error"]["message"]


@pytest.mark.shared
def test_pseudonyms_hold_across_runs_and_change_with_the_key(shared_models, files):
    """1,000 records, the same person, e-mail and phone written differently: one token each; a second run with the
    key from $RSINFER_PSEUDONYM_KEY gives identical output, another key disjoint tokens."""
    policy = {"fields": {"email": {"action": "redact", "type": "EMAIL"}, "phone": {"action": "redact", "type": "PHONE"},
                         "name": {"action": "redact", "type": "PERSON"}}}
    (files / "flat.yaml").write_text(json.dumps(policy))
    ways = (["Jane.Doe@Example.com", "jane.doe@example.com"], [4155550100, "(415) 555-0100", "+1 415 555 0100"],
            ["Jane Doe", "JANE DOE", " jane\u00a0doe"])
    stdin = "".join(json.dumps({"i": i, "email": ways[0][i % 2], "phone": ways[1][i % 3], "name": ways[2][i % 3]})
                    + "\n" for i in range(1000))
    args = ("redact", "--policy", str(files / "flat.yaml"), "--mode", "pseudonym")
    first = cli(shared_models, *args, "--key-file", str(files / "k.key"), stdin=stdin)
    again = cli(shared_models, *args, stdin=stdin, env={"RSINFER_PSEUDONYM_KEY": KEY.hex()})
    other = cli(shared_models, *args, "--key-file", str(files / "other.key"), stdin=stdin)
    assert first.returncode == again.returncode == other.returncode == 0, first.stderr
    assert first.stdout == again.stdout
    rows, rows2 = ([json.loads(x) for x in r.stdout.splitlines()] for r in (first, other))
    assert [r["i"] for r in rows] == list(range(1000))
    for field in ("email", "phone", "name"):
        assert len({r[field] for r in rows}) == 1 and {r[field] for r in rows}.isdisjoint({r[field] for r in rows2})
    assert "jane" not in first.stdout.lower() and "555 0100" not in first.stdout and KEY.hex() not in first.stdout
    assert "4155550100" not in first.stdout and "555-0100" not in first.stdout


@pytest.mark.shared
def test_cli_policy_errors(shared_models, files):
    (files / "bad.yaml").write_text("fields:\n  user.email: {action: redact}\n")
    bad = cli(shared_models, "redact", "--policy", str(files / "bad.yaml"), stdin="not json at all\n")
    assert bad.returncode != 0 and "fields.user.email.type" in bad.stderr and "Traceback" not in bad.stderr
    (files / "types.yaml").write_text("fields:\n  a: {action: scan, types: [NOPE]}\n")
    unknown = cli(shared_models, "detect", "--policy", str(files / "types.yaml"), stdin="{}\n")
    assert unknown.returncode != 0 and "fields.a.types: the model has no NOPE" in unknown.stderr
    (files / "req.yaml").write_text("fields:\n  a: {action: scan, required: true}\n")
    req = cli(shared_models, "redact", "--policy", str(files / "req.yaml"), "--mode", "replace",
              stdin='{"a": "mail x@y.co"}\n{"b": 1}\n')
    assert req.returncode != 0 and "<stdin>: line 2: required path 'a' matches nothing" in req.stderr
    assert req.stdout == '{"a":"mail <EMAIL>"}\n'                     # everything before the bad line written
    nokey = cli(shared_models, "redact", "--policy", str(files / "req.yaml"), "--mode", "pseudonym",
                stdin='{"a": "x"}\n', env={"RSINFER_PSEUDONYM_KEY": ""})
    assert nokey.returncode != 0 and "needs a key" in nokey.stderr
    both = cli(shared_models, "redact", "--policy", str(files / "req.yaml"), "--field", "a", stdin="{}\n")
    assert both.returncode != 0 and "drop --field" in both.stderr


def test_entity_never_carries_the_key():
    e = Entity("EMAIL", "a@b.co", 1.0, 0, 6)
    assert Replacer("pseudonym", pseudonyms=Pseudonyms(KEY))(e.entity_type, e.text) != "a@b.co"


@pytest.mark.shared
def test_numbers_no_float_holds_go_back_as_written(shared_models, files):
    """A 30-digit id, 1e400 and NaN pass through `redact` as written (they were an internal error and a silent
    null), with --field as with --policy."""
    line = '{"id": 123456789012345678901234567890, "big": 1e400, "n": NaN, "f": 0.1, "text": "mail x@y.co"}\n'
    (files / "scan.yaml").write_text("fields:\n  text: scan\n")
    for args in (("--field", "text"), ("--policy", str(files / "scan.yaml"))):
        run = cli(shared_models, "redact", *args, "--mode", "replace", stdin=line)
        assert run.returncode == 0, run.stderr
        assert run.stdout == ('{"id":123456789012345678901234567890,"big":1e400,"n":NaN,"f":0.1,'
                              '"text":"mail <EMAIL>"}\n')
