"""PII: token-level parity with the rampart model's raw probabilities, spans against the vendor's decoder,
BIOES / threshold / overlap / window-stitch edge cases on synthetic data, redaction modes, routes, and the
`rsinfer redact` / `rsinfer detect` JSONL pipelines."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from rsinfer_cli.config import ModelConfig, parse_config
from rsinfer_cli.engine.model import load_model
from rsinfer_cli.errors import InputError
from rsinfer_cli.pipelines.pii import (
    Entity,
    PiiOptions,
    PiiPipeline,
    decode,
    plan_windows,
    redact,
    resolve_overlaps,
    stitch,
)
from test_server import assert_error

from serverutil import ServerThread

SERVE_MODES = ("single", "workers")  # every test here also runs against the front-end/engine split

PROB_ABS = 1e-4  # models README: measured 3.6e-6 between onnxruntime 1.32 and the 1.22.1 reference


@pytest.fixture(scope="module")
def ref(shared_models) -> dict:
    return json.loads((shared_models / "rampart-pii" / "reference.json").read_text())


@pytest.fixture(scope="module")
def pii(shared_models) -> PiiPipeline:
    return PiiPipeline(load_model(ModelConfig(name="pii", kind="pii", path=str(shared_models / "rampart-pii"),
                                              replicas=1, options=PiiOptions(pii_hash_salt="test-salt"))))


@pytest.fixture(scope="module")
def model_only(shared_models) -> PiiPipeline:
    """The model's spans alone (no pattern recognizers), to compare with the vendor's model spans."""
    return PiiPipeline(load_model(ModelConfig(name="pii", kind="pii", path=str(shared_models / "rampart-pii"),
                                              replicas=1, options=PiiOptions(pii_recognizers=(), pii_merge=()))))


# ---------------------------------------------------------------- model parity


@pytest.mark.shared
class TestRampartParity:
    def test_resolution_picks_q4(self, pii):
        assert pii.model.resolved.graph_file == "onnx/model_q4.onnx"
        assert len(pii.labels) == 35 and pii.prefix == [2] and pii.suffix == [3]

    def test_token_probabilities_match_every_reference_window(self, pii, ref):
        worst, tokens, label_diffs = 0.0, 0, 0
        for case in ref["cases"]:
            enc = pii.encoder.tokenizer.encode(case["text"], add_special_tokens=False)
            assert enc.ids == case["encoding"]["ids"]
            assert [list(o) for o in enc.offsets] == case["encoding"]["offsets"]
            rows = [pii.prefix + enc.ids[w["token_start"]:w["token_end"]] + pii.suffix for w in case["windows"]]
            probs = pii.forward(pii.model.sessions[0], [(r, [0] * len(r)) for r in rows])
            for w, p in zip(case["windows"], probs, strict=True):
                p = p[1:-1]  # [CLS]/[SEP] rows dropped, as in the reference
                worst = max(worst, float(np.abs(p - np.array(w["probs"])).max()))
                label_diffs += sum(pii.labels[i] != lab for i, lab in zip(p.argmax(-1), w["labels"], strict=True))
                tokens += len(w["labels"])
        assert worst <= PROB_ABS, worst
        assert label_diffs == 0 and tokens > 1000

    def test_spans_against_the_vendor_decoder(self, model_only, ref):
        """Every disagreement with the package's model spans must come from a documented rule difference:
        (1) word pieces labelled B- are one entity here, fragments there; (2) Arcjet renames PHONE to
        PHONE_NUMBER; (3) spans here are widened to whole words, so an address labelled in pieces is one span
        (the package gets there with its regex recognizers: its final `spans` agree); (4) the package scans long
        texts in 480-character windows, we in 512-token windows, so the model sees another context (checked:
        the reference's own token windows agree with us)."""
        pii = model_only
        det = pii.detect([c["text"] for c in ref["cases"]])
        exact = total = widened = 0
        for case, ents in zip(ref["cases"], det.entities, strict=True):
            theirs = merge_glued([(s["start"], s["end"], s["type"].replace("PHONE_NUMBER", "PHONE"))
                                  for s in case["model_spans"]])
            mine = {(e.start, e.end, e.entity_type) for e in ents}
            exact += len(mine & theirs)
            total += len(mine | theirs)
            for span in mine - theirs:
                inside = [t for t in theirs if t[2] == span[2] and span[0] <= t[0] and t[1] <= span[1]]
                if inside:
                    widened += 1
                    assert case["text"][span[0]:span[1]].strip() == case["text"][span[0]:span[1]]
                    continue
                assert not case["fits_one_window"] and token_windows_agree_with(pii, case, span, True), span
            for span in theirs - mine:
                if any(m[2] == span[2] and m[0] <= span[0] and span[1] <= m[1] for m in mine):
                    continue  # one of our widened spans covers it
                assert not case["fits_one_window"], (case["id"], span)
                assert token_windows_agree_with(pii, case, span, False), (case["id"], span)
        assert exact / total >= 0.75 and widened <= 5, (exact, total, widened)

    def test_emails_the_model_sees_match_the_vendors_final_spans(self, model_only, ref):
        """Where the model labels any piece of an address, our widened span is the whole address, as the
        package's final span (its regex recognizer) is. Addresses the model misses entirely are missed here too."""
        det = model_only.detect([c["text"] for c in ref["cases"]])
        checked = 0
        for case, ents in zip(ref["cases"], det.entities, strict=True):
            pieces = [(s["start"], s["end"]) for s in case["model_spans"] if s["type"] == "EMAIL"]
            mine = {(e.start, e.end) for e in ents if e.entity_type == "EMAIL"}
            for s in case["spans"]:
                if s["type"] == "EMAIL" and any(s["start"] <= a < s["end"] for a, _ in pieces):
                    assert (s["start"], s["end"]) in mine, (case["id"], s)
                    checked += 1
        assert checked >= 2


def merge_glued(spans: list[tuple[int, int, str]]) -> set[tuple[int, int, str]]:
    """The vendor's fragments of one word (`Amp` `hit` `hea` `tre Parkway`) joined back: same type, no gap."""
    out: list[list] = []
    for a, b, t in sorted(spans):
        if out and out[-1][2] == t and out[-1][1] == a:
            out[-1][1] = b
        else:
            out.append([a, b, t])
    return {tuple(x) for x in out}


def token_windows_agree_with(pii, case, span, ours: bool) -> bool:
    """Do the reference's own token windows (raw model output) label this span's first token as we decided?"""
    a, b, etype = span
    offsets = case["encoding"]["offsets"]
    idx = next(i for i, (s, e) in enumerate(offsets) if s <= a < e or s >= a)
    for w in case["windows"]:
        if w["token_start"] <= idx < w["token_end"]:
            label, score = w["labels"][idx - w["token_start"]], w["scores"][idx - w["token_start"]]
            tagged = label != "O" and label.split("-", 1)[-1] == etype and score >= 0.5
            return tagged == ours
    return False


VENDOR = ("email", "url", "ip_address", "ssn", "credit_card")   # the rampart package's own recognizers


class TestRecognizers:
    def test_match_the_vendors_recognizers_exactly(self, ref):
        from rsinfer_cli.pipelines.recognizers import recognize

        for case in ref["cases"]:
            mine = {(m.entity_type, m.start, m.end) for m in recognize(case["text"], VENDOR)}
            assert mine == {(s["type"], s["start"], s["end"]) for s in case["recognizer_spans"]}, case["id"]

    @pytest.mark.parametrize(("text", "expected"), [
        ("mail a.b@x.io.", [("EMAIL", "a.b@x.io")]),
        ("see https://x.com/a?b=1).", [("URL", "https://x.com/a?b=1")]),
        ("at https://x.com/u?mail=a@b.io now", [("URL", "https://x.com/u?mail=a@b.io")]),  # no email inside
        ("ip 10.0.0.1. not 256.1.1.1 or 1.2.3.4.5", [("IP_ADDRESS", "10.0.0.1")]),
        ("ssn 123-45-6789, not 000-12-3456, 666-12-3456 or 123-45-67890", [("SSN", "123-45-6789")]),
        ("card 4111-1111-1111-1111, not 4111 1111 1111 1112", [("CREDIT_CARD_NUMBER", "4111-1111-1111-1111")]),
        ("call 415-555-0198 or 2024-03-15", []),
    ])
    def test_patterns(self, text, expected):
        from rsinfer_cli.pipelines.recognizers import recognize

        assert [(m.entity_type, text[m.start:m.end]) for m in recognize(text, VENDOR)] == expected

    @pytest.mark.shared
    def test_pipeline_adds_what_the_model_misses(self, pii, model_only, ref):
        text = next(c["text"] for c in ref["cases"] if c["id"] == "public-pii-02")  # billing@acme-corp.io
        assert [e.entity_type for e in model_only.detect([text]).entities[0]] == []
        (found,) = pii.detect([text]).entities
        assert [(e.entity_type, e.text, e.score) for e in found] == [("EMAIL", "billing@acme-corp.io", 1.0)]
        assert "SSN" in pii.types and "SSN" not in model_only.types

    @pytest.mark.shared
    def test_final_spans_cover_the_vendors_recognized_ones(self, pii, ref):
        det = pii.detect([c["text"] for c in ref["cases"]])
        for case, ents in zip(ref["cases"], det.entities, strict=True):
            mine = {(e.entity_type, e.start, e.end) for e in ents}
            for s in case["recognizer_spans"]:
                assert (s["type"], s["start"], s["end"]) in mine, (case["id"], s)


# ---------------------------------------------------------------- decoding on synthetic data


LABELS = ["O", "B-person", "I-person", "B-location", "I-location", "E-location", "B-email", "I-email", "E-email",
          "S-id", "city", "L-zip"]


def tokens_of(text: str) -> list[tuple[int, int]]:
    out, pos = [], 0
    for word in text.split(" "):
        out.append((pos, pos + len(word)))
        pos += len(word) + 1
    return out


def run_decode(text, tags, probs=None, threshold=0.5, offsets=None):
    ids = np.array([LABELS.index(t) for t in tags])
    p = np.array(probs if probs is not None else [0.9] * len(tags))
    return [(e.entity_type, e.text, e.start, e.end) for e in
            decode(text, offsets or tokens_of(text), ids, p, LABELS, threshold)]


class TestDecode:
    def test_bio_person_and_location(self):
        assert run_decode("John Smith lives in Berlin", ["B-person", "I-person", "O", "O", "B-location"]) == \
            [("person", "John Smith", 0, 10), ("location", "Berlin", 20, 26)]

    def test_bioes_two_entities(self):
        text = "a b c d e"
        assert run_decode(text, ["B-email", "I-email", "E-email", "B-location", "E-location"]) == \
            [("email", "a b c", 0, 5), ("location", "d e", 6, 9)]

    def test_below_threshold_is_outside(self):
        assert run_decode("John", ["B-person"], [0.3]) == []
        assert run_decode("John", ["B-person"], [0.3], threshold=0.2) == [("person", "John", 0, 4)]

    def test_single_stray_inside_end_and_bare_labels(self):
        assert run_decode("x y", ["S-id", "S-id"]) == [("id", "x", 0, 1), ("id", "y", 2, 3)]
        assert run_decode("x y", ["I-person", "I-person"]) == [("person", "x y", 0, 3)]  # a stray I- starts one
        assert run_decode("x y", ["B-person", "E-location"]) == [("person", "x", 0, 1), ("location", "y", 2, 3)]
        assert run_decode("Paris France", ["city", "city"]) == [("city", "Paris France", 0, 12)]
        assert run_decode("12 34", ["L-zip", "L-zip"]) == [("zip", "12 34", 0, 5)]  # unknown prefix = inside

    def test_adjacent_b_b_are_two_entities_unless_glued(self):
        assert run_decode("Ann Bob", ["B-person", "B-person"]) == [("person", "Ann", 0, 3), ("person", "Bob", 4, 7)]
        text = "Amphitheatre Parkway"
        glued = [(0, 3), (3, 6), (6, 12), (13, 20)]  # Amp ##hit ##heatre Parkway
        assert run_decode(text, ["B-location", "B-location", "B-location", "I-location"], offsets=glued) == \
            [("location", "Amphitheatre Parkway", 0, 20)]

    def test_special_tokens_skipped_and_whitespace_trimmed(self):
        text = " John "
        offsets = [(0, 0), (0, 5), (0, 0)]  # [CLS] " John" [SEP]
        assert run_decode(text, ["B-person", "B-person", "B-person"], offsets=offsets) == [("person", "John", 1, 5)]

    def test_spans_widen_to_whole_words(self):
        text = "mail john.smith@example.com. now"
        offsets = [(0, 4), (5, 9), (9, 10), (10, 15), (15, 16), (16, 23), (23, 24), (24, 27), (27, 28), (29, 32)]
        tags = ["O", "B-email", "O", "B-email", "O", "O", "O", "I-email", "O", "O"]
        assert run_decode(text, tags, offsets=offsets) == [("email", "john.smith@example.com", 5, 27)]
        quoted = '"Alex" said'
        assert run_decode(quoted, ["B-person", "O"], offsets=[(1, 5), (7, 11)]) == [("person", "Alex", 1, 5)]
        cjk = "東京は首都"
        assert run_decode(cjk, ["B-location", "O"], offsets=[(0, 2), (2, 5)]) == [("location", "東京", 0, 2)]

    def test_same_range_keeps_the_most_probable_type(self):
        text = "ab"
        ids = np.array([LABELS.index("B-person"), LABELS.index("B-email")])
        (e,) = decode(text, [(0, 1), (1, 2)], ids, np.array([0.6, 0.9]), LABELS, 0.5)
        assert (e.entity_type, e.text) == ("email", "ab")

    def test_score_is_mean_token_probability(self):
        ids = np.array([1, 2])
        (e,) = decode("John Smith", [(0, 4), (5, 10)], ids, np.array([0.9, 0.7]), LABELS, 0.5)
        assert e.score == pytest.approx(0.8)


class TestWindows:
    @pytest.mark.parametrize("n", [1, 509, 510, 511, 900, 3001])
    def test_every_token_labelled_exactly_once(self, n):
        wins = plan_windows(n, 510, 128)
        assert wins[0][0] == 0 and wins[-1][1] == n
        assert all(e - s <= 510 for s, e in wins)
        assert all(b[0] < a[1] for a, b in zip(wins, wins[1:], strict=False))  # consecutive windows overlap
        rows = [np.arange(s, e) * 10 + k for k, (s, e) in enumerate(wins)]  # value encodes (token, window)
        got = stitch(wins, rows)
        assert (got // 10).tolist() == list(range(n))
        for k in range(len(wins) - 1):  # the overlap is split at its middle
            mid = (wins[k + 1][0] + wins[k][1]) // 2
            assert got[mid - 1] % 10 == k and got[mid] % 10 == k + 1

    @pytest.mark.shared
    def test_email_after_3000_words(self, pii):
        text = "lorem " * 3000 + "contact john.smith@example.com today"
        (ents,) = pii.detect([text]).entities
        emails = [e for e in ents if e.entity_type == "EMAIL"]
        assert [(e.text, e.start) for e in emails] == [("john.smith@example.com", len("lorem ") * 3000 + 8)]

    @pytest.mark.shared
    def test_entity_across_a_window_boundary_found_once(self, pii):
        # windows of 510 tokens overlapping by 128: the first overlap is tokens 382..509, split at 446
        tok = pii.encoder.tokenizer
        email = "john.smith@example.com"
        for cut in range(150, 450):  # grow the prefix word by word until the email straddles token 446
            text = "lorem " * cut + f"contact {email} today " + "lorem " * 100
            enc = tok.encode(text, add_special_tokens=False)
            start = text.index(email)
            toks = [i for i, (a, _) in enumerate(enc.offsets) if start <= a < start + len(email)]
            if toks[0] < 446 <= toks[-1]:
                break
        assert toks[0] < 446 <= toks[-1] and len(enc.ids) > 510, (toks, len(enc.ids))
        assert len(pii.windows_of(len(enc.ids))) == 2
        (ents,) = pii.detect([text]).entities
        assert [e.text for e in ents if e.entity_type == "EMAIL"] == [email]


# ---------------------------------------------------------------- redaction


def ent(t: str, start: int, end: int, text: str) -> Entity:
    return Entity(t, text[start:end], 0.9, start, end)


class TestRedact:
    text = "call John Smith now"

    def test_modes(self):
        e = [ent("PERSON", 5, 15, self.text)]
        assert redact(self.text, e, "mask") == "call ********** now"
        assert redact(self.text, e, "mask", "#") == "call ########## now"
        assert redact(self.text, e, "remove") == "call  now"
        assert redact(self.text, e, "replace") == "call <PERSON> now"
        assert redact(self.text, e, "replace", replacement="[{type}]") == "call [PERSON] now"

    def test_mask_is_unicode_safe(self):
        text = "héllo Wörld"
        assert redact(text, [ent("X", 6, 11, text)], "mask", "#") == "héllo #####"

    def test_hash_equal_values_equal_tokens(self):
        text = "a@b.io and a@b.io and c@d.io"
        es = [ent("EMAIL", 0, 6, text), ent("EMAIL", 11, 17, text), ent("EMAIL", 22, 28, text)]
        out = redact(text, es, "hash", salt=b"s1").split(" and ")
        assert out[0] == out[1] != out[2] and len(out[0]) == 16
        assert redact(text, es, "hash", salt=b"s2").split(" and ")[0] != out[0]

    def test_overlaps_contained_loses_else_first_wins(self):
        text = "abcd def"
        assert redact(text, [ent("A", 0, 3, text), ent("B", 0, 4, text)]) == "**** def"
        assert [e.entity_type for e in resolve_overlaps([ent("A", 1, 3, text), ent("B", 0, 4, text)])] == ["B"]
        assert [e.entity_type for e in resolve_overlaps([ent("A", 0, 5, text), ent("B", 2, 8, text)])] == ["A"]

    def test_bad_options(self):
        with pytest.raises(InputError, match="unknown redact mode 'zap'"):
            redact("x", [], "zap")
        with pytest.raises(InputError, match="single character"):
            redact("x", [], "mask", "**")

    @pytest.mark.shared
    def test_types_filter_applies_to_redaction(self, pii):
        text = "Email john.smith@example.com, call +44 20 7946 0958"
        (only_email,) = pii.redact([text], types=["EMAIL"]).texts
        assert "john.smith" not in only_email and "7946" in only_email

    @pytest.mark.shared
    def test_salt_from_config(self, pii):
        (a,) = pii.redact(["mail john.smith@example.com"], mode="hash").texts
        (b,) = pii.redact(["mail john.smith@example.com"], mode="hash", salt=b"other").texts
        assert a != b and pii.salt == b"test-salt"


# ---------------------------------------------------------------- routes


@pytest.fixture(scope="module")
def pii_server(shared_models, serve_mode):
    cfg = parse_config({"server": {"pii_hash_salt": "server-salt"}, "models": [
        {"name": "pii", "kind": "pii", "path": str(shared_models / "rampart-pii"), "replicas": 1},
        {"name": "r1", "kind": "rerank", "path": str(shared_models / "tiny-reranker-1"), "replicas": 1}]})
    with ServerThread(cfg, mode=serve_mode) as srv, httpx.Client(base_url=srv.url, timeout=60) as client:
        yield client


TEXT = "My name is Alex Rivera and my email is alex.rivera@example.com"


@pytest.mark.shared
class TestRoutes:
    @pytest.mark.parametrize("prefix", ["", "/v1"])
    def test_detect_shapes(self, pii_server, prefix):
        single = pii_server.post(f"{prefix}/pii/detect", json={"text": TEXT}).json()
        assert single["object"] == "pii.detection" and single["model"] == "pii"
        (result,) = single["results"]
        assert "text" not in result
        types = {e["entity_type"]: e for e in result["entities"]}
        assert types["EMAIL"]["text"] == "alex.rivera@example.com"
        assert TEXT[types["EMAIL"]["start"]:types["EMAIL"]["end"]] == "alex.rivera@example.com"
        assert set(types["EMAIL"]) == {"entity_type", "text", "score", "start", "end"}
        many = pii_server.post(f"{prefix}/pii/detect", json={"texts": [TEXT, "nothing here"]}).json()
        assert [r["text"] for r in many["results"]] == [TEXT, "nothing here"]
        assert many["results"][1]["entities"] == []
        assert many["usage"]["prompt_tokens"] > 0

    def test_threshold_and_types(self, pii_server):
        strict = pii_server.post("/pii/detect", json={"text": TEXT, "threshold": 1.0}).json()
        # no model token reaches probability 1; the address is still found by its pattern
        assert [(e["entity_type"], e["score"]) for e in strict["results"][0]["entities"]] == [("EMAIL", 1.0)]
        only = pii_server.post("/pii/detect", json={"text": TEXT, "types": ["EMAIL"]}).json()
        assert {e["entity_type"] for e in only["results"][0]["entities"]} == {"EMAIL"}

    @pytest.mark.parametrize("prefix", ["", "/v1"])
    def test_redact(self, pii_server, prefix):
        body = pii_server.post(f"{prefix}/pii/redact", json={"texts": [TEXT], "mode": "replace"}).json()
        assert body["object"] == "pii.redaction"
        assert body["results"][0]["text"] == "My name is <GIVEN_NAME> <SURNAME> and my email is <EMAIL>"
        masked = pii_server.post("/pii/redact", json={"text": TEXT, "mask_char": "#", "types": ["EMAIL"]}).json()
        assert masked["results"][0]["text"].endswith("#" * 23) and "Alex" in masked["results"][0]["text"]
        assert pii_server.post("/pii/redact", json={"text": TEXT, "mode": ""}).status_code == 200  # "" = mask
        hashed = pii_server.post("/pii/redact", json={"texts": [TEXT, TEXT], "mode": "hash"}).json()
        assert hashed["results"][0]["text"] == hashed["results"][1]["text"] != TEXT

    def test_errors(self, pii_server):
        assert_error(pii_server.post("/pii/detect", json={}), 422, "invalid_request_error", "text",
                     "`text` or `texts` is required")
        assert_error(pii_server.post("/pii/detect", json={"text": "a", "texts": ["b"]}), 400,
                     "invalid_request_error", "texts", "not both")
        assert_error(pii_server.post("/pii/detect", json={"texts": []}), 400, "invalid_request_error", "texts")
        assert_error(pii_server.post("/pii/redact", json={"text": "a", "mode": "zap"}), 400,
                     "invalid_request_error", "mode", "Invalid enum value 'zap'")
        assert_error(pii_server.post("/pii/redact", json={"text": "a", "mask_char": "**"}), 400,
                     "invalid_request_error", "mask_char")
        assert_error(pii_server.post("/pii/redact", json={"text": "a", "mode": "replace", "replacement": "X"}),
                     400, "invalid_request_error", "replacement")
        assert_error(pii_server.post("/pii/detect", json={"text": "a", "threshold": "high"}), 422,
                     "invalid_request_error", "threshold")
        assert_error(pii_server.post("/pii/detect", json={"model": "r1", "text": "a"}), 400,
                     "invalid_request_error", "model", "is a rerank model but was used for a pii request")


# ---------------------------------------------------------------- CLI


def cli(shared_models, *args, stdin: str = "", timeout: float = 120):
    return subprocess.run([sys.executable, "-m", "rsinfer_cli", *args, "--path", str(shared_models / "rampart-pii")],
                          input=stdin, capture_output=True, text=True, timeout=timeout)


RECORDS = [
    {"id": 1, "text": "Email alex.rivera@example.com please", "meta": {"body": "My name is Alex Rivera", "n": 3}},
    {"id": 2, "text": "nothing to see", "meta": {"body": "plain", "n": 4}},
    {"id": 3, "text": "Write to john.smith@example.com", "meta": {"body": "ok", "n": 5}},
]


def jsonl(records) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


@pytest.mark.shared
class TestRedactCli:
    def test_fields_order_and_untouched_fields(self, shared_models):
        proc = cli(shared_models, "redact", "--field", "text", "--field", "meta.body", "--mode", "replace",
                   stdin=jsonl(RECORDS))
        assert proc.returncode == 0, proc.stderr
        out = [json.loads(x) for x in proc.stdout.splitlines()]
        assert [o["id"] for o in out] == [1, 2, 3]
        assert out[0]["text"] == "Email <EMAIL> please"
        assert "Alex" not in out[0]["meta"]["body"] and out[0]["meta"]["n"] == 3
        assert out[1] == RECORDS[1]
        assert list(out[0]) == list(RECORDS[0])  # key order kept

    def test_spans_and_detect(self, shared_models):
        proc = cli(shared_models, "redact", "--spans", stdin=jsonl(RECORDS[:1]))
        rec = json.loads(proc.stdout)
        assert rec["pii_spans"]["text"][0]["entity_type"] == "EMAIL"
        det = cli(shared_models, "detect", "--types", "EMAIL", stdin=jsonl(RECORDS))
        outs = [json.loads(x) for x in det.stdout.splitlines()]
        assert [o["text"] for o in outs] == [r["text"] for r in RECORDS]  # unchanged
        assert [len(o["pii_spans"]["text"]) for o in outs] == [1, 0, 1]

    def test_malformed_lines(self, shared_models):
        lines = jsonl(RECORDS[:1]) + "{not json\n" + jsonl(RECORDS[2:])
        fail = cli(shared_models, "redact", stdin=lines)
        assert fail.returncode == 3
        assert "<stdin>: line 2: not valid JSON" in fail.stderr
        assert len(fail.stdout.splitlines()) == 1  # what came before the bad line, nothing after
        skip = cli(shared_models, "redact", "--on-error", "skip", stdin=lines)
        assert skip.returncode == 0 and len(skip.stdout.splitlines()) == 2
        assert "skipped 1 malformed line(s)" in skip.stderr
        keep = cli(shared_models, "redact", "--on-error", "keep", stdin=lines)
        assert keep.stdout.splitlines()[1] == "{not json" and "kept 1 malformed line(s) unchanged" in keep.stderr
        missing = cli(shared_models, "redact", "--field", "nope", stdin=jsonl(RECORDS[:1]))
        assert missing.returncode == 3 and "line 1: no field 'nope'" in missing.stderr

    def test_empty_input_and_plain(self, shared_models):
        empty = cli(shared_models, "redact", stdin="")
        assert empty.returncode == 0 and empty.stdout == ""
        plain = cli(shared_models, "redact", "--plain", "--mode", "remove",
                    stdin="mail alex.rivera@example.com now\n\nno pii\n")
        assert plain.stdout == "mail  now\n\nno pii\n"

    def test_plain_detect_missing_fields_and_kept_blank_lines(self, shared_models):
        """detect --plain writes each non-blank line's entities by line number; a record without its field stops the
        run after the records before it were written; --allow-missing passes such a record through unchanged; keep
        writes blank lines back too."""
        det = cli(shared_models, "detect", "--plain", stdin="mail alex.rivera@example.com now\n\nno pii\n")
        found = [json.loads(x) for x in det.stdout.splitlines()]
        assert [f["line"] for f in found] == [1, 3] and found[0]["entities"][0]["entity_type"] == "EMAIL"
        assert found[1]["entities"] == []
        lines = jsonl(RECORDS[:2]) + jsonl([{"id": 9}]) + jsonl(RECORDS[2:])
        stop = cli(shared_models, "redact", "--batch-lines", "8", stdin=lines)
        assert stop.returncode == 3 and "line 3: no field 'text'" in stop.stderr
        assert [json.loads(x)["id"] for x in stop.stdout.splitlines()] == [1, 2]
        through = cli(shared_models, "redact", "--allow-missing", "--batch-lines", "2", stdin=lines)
        assert [json.loads(x) for x in through.stdout.splitlines()][2] == {"id": 9}
        assert len(through.stdout.splitlines()) == 4 and "alex" not in through.stdout
        keep = cli(shared_models, "redact", "--on-error", "keep", stdin=jsonl(RECORDS[1:2]) + "\n" + "{x\n")
        assert keep.stdout.splitlines()[1:] == ["", "{x"]

    def test_bad_options_exit_2(self, shared_models):
        assert cli(shared_models, "redact", "--mode", "zap", stdin="").returncode == 2
        proc = cli(shared_models, "redact", "--types", "EMAIL,SHOE_SIZE", stdin="")
        assert proc.returncode == 2 and "no SHOE_SIZE" in proc.stderr

    def test_long_record_redacted_everywhere(self, shared_models):
        text = "lorem " * 2500 + "alex.rivera@example.com"
        proc = cli(shared_models, "redact", "--mode", "replace", stdin=json.dumps({"text": text}) + "\n")
        assert json.loads(proc.stdout)["text"].endswith("<EMAIL>")

    def test_streams_large_input_in_bounded_memory(self, shared_models):
        """Output for the first lines arrives while stdin is still open, so memory does not grow with input."""
        with subprocess.Popen([sys.executable, "-m", "rsinfer_cli", "redact", "--path",
                               str(shared_models / "rampart-pii"), "--batch-lines", "16"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True) as proc:
            assert proc.stdin and proc.stdout
            try:
                for i in range(32):
                    proc.stdin.write(json.dumps({"i": i, "text": f"record {i} from alex.rivera@example.com"}) + "\n")
                proc.stdin.flush()
                deadline = time.monotonic() + 60
                first = json.loads(proc.stdout.readline())
                assert time.monotonic() < deadline and first["i"] == 0 and "alex" not in first["text"]
                for i in range(32, 2000):
                    proc.stdin.write(json.dumps({"i": i, "text": f"record {i}"}) + "\n")
                proc.stdin.close()
                rest = proc.stdout.read().splitlines()
                assert [json.loads(x)["i"] for x in rest] == list(range(1, 2000))
                assert proc.wait(120) == 0
            finally:
                if proc.poll() is None:
                    proc.kill()


@pytest.mark.shared
def test_label_count_disagreeing_with_the_graph_is_a_load_error(shared_models, tmp_path):
    import shutil

    from rsinfer_cli.errors import ModelLoadError

    dst = tmp_path / "pii"
    shutil.copytree(shared_models / "rampart-pii", dst, ignore=shutil.ignore_patterns("reference.json"))
    cfg = json.loads((dst / "config.json").read_text())
    cfg["id2label"] = {str(i): label for i, label in enumerate(["O", "B-NAME", "I-NAME"])}
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="the graph has 35 labels but config.json id2label has 3"):
        PiiPipeline(load_model(ModelConfig(name="p", kind="pii", path=str(dst), replicas=1)))
    del cfg["id2label"]
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="config.json must contain id2label"):
        PiiPipeline(load_model(ModelConfig(name="p", kind="pii", path=str(dst), replicas=1)))
