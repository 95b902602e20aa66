"""GLiNER inference (pipelines/gliner.py) against the gliner package's own outputs for tiny-gliner
(reference.json: 24 texts x label sets, thresholds 0.5/0.3/0.9, flat_ner, multi_label), a padded batch against one
text at a time, texts past the model's word window scored in overlapping windows, and the configs and graphs it
refuses."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rsinfer_cli.errors import ModelLoadError
from rsinfer_cli.pipelines import gliner as g

pytestmark = pytest.mark.shared


@pytest.fixture(scope="module")
def tiny(shared_models):
    import onnxruntime as ort
    from tokenizers import Tokenizer

    folder = shared_models / "tiny-gliner"
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    sess = ort.InferenceSession(str(folder / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    g.check_graph([i.name for i in sess.get_inputs()], sess.get_outputs()[0].shape)
    ref = json.loads((folder / "reference.json").read_text(encoding="utf-8"))
    return g.GlinerConfig.load(folder), tok, lambda feeds: sess.run(None, feeds)[0], ref


def _same(got, expected, where):
    assert [(e["start"], e["end"], e["text"], e["label"]) for e in got] == \
        [(e["start"], e["end"], e["text"], e["label"]) for e in expected], where
    assert all(abs(a["score"] - b["score"]) <= 1e-4 for a, b in zip(got, expected, strict=True)), where


def test_inputs_and_entities_are_the_packages(tiny):
    cfg, tok, run, ref = tiny
    checked = 0
    for case in ref["cases"]:
        words = g.split_words(case["text"])
        assert list(words.words) == case["words"], case["id"]
        assert [list(o) for o in words.offsets] == [list(o) for o in case["word_offsets"]], case["id"]
        if words.words:
            enc = g.encode(tok, cfg, g.unique_labels(case["labels"]), words.words)
            assert (enc.input_ids, enc.words_mask, enc.words_used) == \
                (case["input_ids"], case["words_mask"], case["words_used"]), case["id"]
            assert list(run(g.feeds([enc], cfg.max_width)).shape) == case["logits_shape"], case["id"]
        if case["truncated"]:
            continue                              # the package drops words past max_len; rsinfer scores them
        for r in case["results"]:
            got = g.predict(run, tok, cfg, [case["text"]], case["labels"], r["threshold"], r["flat_ner"],
                            r["multi_label"])[0]
            _same(got, r["entities"], (case["id"], r["threshold"], r["flat_ner"], r["multi_label"]))
            _same(got, r["entities_onnx"], case["id"])
            checked += 1
    assert checked == 21 * 12


def test_a_padded_batch_is_one_text_at_a_time(tiny):
    cfg, tok, run, ref = tiny
    for labels in ref["label_sets"].values():
        cases = [c for c in ref["cases"] if c["labels"] == labels and not c["truncated"]]
        for threshold, flat in ((0.3, True), (0.5, False)):
            batched = g.predict(run, tok, cfg, [c["text"] for c in cases], labels, threshold, flat, batch_size=8)
            for case, got in zip(cases, batched, strict=True):
                expected = next(r["entities"] for r in case["results"]
                                if (r["threshold"], r["flat_ner"], r["multi_label"]) == (threshold, flat, False))
                _same(got, expected, case["id"])


def test_windows_cover_a_long_text_with_overlap(tiny):
    cfg = tiny[0]
    assert g.windows(cfg.max_len, cfg) == [(0, cfg.max_len)]
    for n in (cfg.max_len + 1, 113, 300, 1000):
        wins = g.windows(n, cfg)
        assert wins[0][0] == 0 and wins[-1][1] == n and all(hi - lo == cfg.max_len for lo, hi in wins)
        assert all(b[0] < a[1] and a[1] - b[0] >= g.overlap_words(cfg) >= cfg.max_width
                   for a, b in zip(wins, wins[1:], strict=False))


def test_the_long_text_keeps_what_the_package_finds_away_from_the_window_edge(tiny):
    """The 113-word case: the package scores its first 64 words only; rsinfer scores all in windows. Every entity
    the package finds in the words the first window alone decides (before the second window starts) is found,
    with its offsets in the whole text."""
    cfg, tok, run, ref = tiny
    case = next(c for c in ref["cases"] if c["truncated"])
    second = g.windows(case["num_words"], cfg)[1][0]
    limit = case["word_offsets"][second][0]
    past_the_window = 0
    for r in case["results"]:
        got = g.predict(run, tok, cfg, [case["text"]], case["labels"], r["threshold"], r["flat_ner"],
                        r["multi_label"])[0]
        for e in (e for e in r["entities"] if e["end"] <= limit):
            assert any((x["start"], x["end"], x["label"]) == (e["start"], e["end"], e["label"]) for x in got), e
        assert all(case["text"][e["start"]:e["end"]] == e["text"] for e in got)
        past_the_window += sum(e["start"] > case["word_offsets"][cfg.max_len - 1][1] for e in got)
    assert past_the_window > 0           # words the package never scores


def _planted_run(tok, cfg):
    """A stand-in graph that scores the two-word span "zebra crossing" (label 0) high and everything else low, from
    the tokens it is given: what a window sees decides what it finds."""
    zebra, crossing = tok.token_to_id("zebra"), tok.token_to_id("crossing")

    def run(feeds):
        ids, words_mask = feeds["input_ids"], feeds["words_mask"]
        n_words = feeds["span_idx"].shape[1] // cfg.max_width
        logits = np.full((ids.shape[0], n_words, cfg.max_width, 2), -10.0, dtype=np.float32)
        for b in range(ids.shape[0]):
            first = {int(words_mask[b, t]) - 1: int(ids[b, t]) for t in range(ids.shape[1]) if words_mask[b, t]}
            for w, token in first.items():
                if token == zebra and first.get(w + 1) == crossing:
                    logits[b, w, 1, 0] = 5.0
        return logits

    return run


def test_an_entity_across_each_window_boundary_is_found_once(tiny):
    cfg, tok, _, _ = tiny
    run = _planted_run(tok, cfg)
    n = 300
    for lo, hi in g.windows(n, cfg)[:-1]:
        for first in (hi - 2, hi - 1, hi):          # inside the window's end, across it, just after it
            words = ["word"] * n
            words[first], words[first + 1] = "zebra", "crossing"
            text = " ".join(words)
            found = g.predict(run, tok, cfg, [text], ["thing", "other"], 0.5)[0]
            start = 5 * first
            assert found == [{"start": start, "end": start + len("zebra crossing"), "text": "zebra crossing",
                              "label": "thing", "score": pytest.approx(1 / (1 + np.exp(-5.0)))}], (lo, hi, first)


def test_empty_texts_run_nothing(tiny):
    cfg, tok, _, _ = tiny

    def never(_feeds):
        raise AssertionError("the graph ran for an empty text")

    assert g.predict(never, tok, cfg, ["", "   \n"], ["person"]) == [[], []]


@pytest.mark.parametrize(("change", "said"), [
    ({"span_mode": "token_level"}, "span_mode 'token_level' is not supported"),
    ({"words_splitter_type": "spacy"}, "words_splitter_type 'spacy' is not supported"),
    ({"subtoken_pooling": "mean"}, "subtoken_pooling 'mean' is not supported"),
    ({"labels_encoder": "BAAI/bge-small-en-v1.5"}, "bi-encoder GLiNER"),
    ({"max_width": None}, "missing or invalid"),
])
def test_configs_it_cannot_serve_are_refused(shared_models, change, said):
    raw = json.loads((shared_models / "tiny-gliner" / "gliner_config.json").read_text(encoding="utf-8"))
    with pytest.raises(ModelLoadError, match=said):
        g.GlinerConfig.of({**raw, **change})


def test_a_folder_or_graph_that_is_not_gliner_is_refused(shared_models, tmp_path):
    with pytest.raises(ModelLoadError, match="not a GLiNER folder"):
        g.GlinerConfig.load(shared_models / "all-minilm-l6-v2")
    with pytest.raises(ModelLoadError, match="lacks input.*words_mask"):
        g.check_graph(["input_ids", "attention_mask", "token_type_ids"])
    with pytest.raises(ModelLoadError, match="logits of rank 3"):
        g.check_graph(list(g.GRAPH_INPUTS), ["b", "w", "l"])


# ---------------------------------------------------------------- as the pii family's model

TYPES = {"person": "PERSON", "email": "EMAIL", "phone number": "PHONE", "organization": "ORGANIZATION",
         "date": "DATE", "location": "LOCATION", "medical record number": "MEDICAL_RECORD", "date of birth": "DOB"}


@pytest.fixture(scope="module")
def gliner_server(shared_models):
    import httpx

    from rsinfer_cli.config import parse_config

    from serverutil import ServerThread

    folder = str(shared_models / "tiny-gliner")
    models = [{"name": f"gl-{name}", "kind": "pii", "path": folder, "pii_recognizers": [], "replicas": 1,
               "default": name == "pii",
               "pii_labels": {label: TYPES[label] for label in labels}}
              for name, labels in json.loads((shared_models / "tiny-gliner" / "reference.json").read_text(
                  encoding="utf-8"))["label_sets"].items()]
    models.append({"name": "tokens", "kind": "pii", "path": str(shared_models / "rampart-pii"), "replicas": 1})
    with ServerThread(parse_config({"models": models})) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        yield c


def test_the_routes_answer_what_the_package_finds(tiny, gliner_server):
    """/pii/detect, Presidio's /analyze and /pii/redact over a GLiNER model: the package's spans (flat, one label a
    span) as entity types, scores within 1e-4, at every threshold the reference has."""
    ref = tiny[3]
    for name, labels in ref["label_sets"].items():
        cases = [c for c in ref["cases"] if c["labels"] == labels and not c["truncated"] and c["words"]]
        for threshold in (0.3, 0.5, 0.9):
            expected = [next(r["entities"] for r in c["results"]
                             if (r["threshold"], r["flat_ner"], r["multi_label"]) == (threshold, True, False))
                        for c in cases]
            r = gliner_server.post("/pii/detect", json={"model": f"gl-{name}", "texts": [c["text"] for c in cases],
                                                        "threshold": threshold})
            assert r.status_code == 200, r.text
            for case, got, exp in zip(cases, [x["entities"] for x in r.json()["results"]], expected, strict=True):
                assert [(e["start"], e["end"], e["entity_type"], e["text"]) for e in got] == \
                    [(e["start"], e["end"], TYPES[e["label"]], e["text"]) for e in exp], (name, threshold, case["id"])
                assert all(abs(a["score"] - b["score"]) <= 1e-4 for a, b in zip(got, exp, strict=True))
        case, exp = cases[1], expected[1]            # the contact-details text at 0.9 has none: take 0.5's
        exp = next(r["entities"] for r in case["results"]
                   if (r["threshold"], r["flat_ner"], r["multi_label"]) == (0.5, True, False))
        analyzed = gliner_server.post("/analyze", json={"text": case["text"], "language": "en",
                                                        "score_threshold": 0.5})
        redacted = gliner_server.post("/pii/redact", json={"model": f"gl-{name}", "text": case["text"],
                                                           "mode": "replace", "threshold": 0.5})
        if name != "pii":
            continue          # /analyze answers with the default model: gl-pii
        assert analyzed.status_code == 200, analyzed.text
        assert exp, case["id"]
        assert sorted((e["start"], e["end"]) for e in analyzed.json()) == sorted((e["start"], e["end"]) for e in exp)
        text = case["text"]
        for e in sorted(exp, key=lambda e: -e["start"]):
            text = text[:e["start"]] + f"<{TYPES[e['label']]}>" + text[e["end"]:]
        assert redacted.json()["results"][0]["text"] == text


def test_bad_labels_are_refused_at_load(shared_models):
    from rsinfer_cli.config import parse_config
    from rsinfer_cli.errors import ConfigError

    folder = str(shared_models / "tiny-gliner")
    for labels, said in (({}, "pii_labels: empty"), ({f"l{i}": "X" for i in range(65)}, "65 labels; at most 64"),
                         ({"x" * 101: "X"}, "a label is 1 to 100 characters"),
                         ({"person": "person"}, "must be UPPER_SNAKE_CASE")):
        with pytest.raises(ConfigError, match=said):
            parse_config({"models": [{"name": "g", "kind": "pii", "path": folder, "pii_labels": labels}]})


def test_labels_per_request(tiny, gliner_server):
    """`labels` asks a GLiNER model for other labels than its configured ones: the package's spans for those
    labels, each typed as pii_labels says or as itself in UPPER_SNAKE."""
    ref = tiny[3]
    labels = ref["label_sets"]["date_location"]
    cases = [c for c in ref["cases"] if c["labels"] == labels and not c["truncated"] and c["words"]]
    r = gliner_server.post("/pii/detect", json={"model": "gl-pii", "texts": [c["text"] for c in cases],
                                                "labels": labels, "threshold": 0.3})
    assert r.status_code == 200, r.text
    for case, got in zip(cases, [x["entities"] for x in r.json()["results"]], strict=True):
        exp = next(x["entities"] for x in case["results"]
                   if (x["threshold"], x["flat_ner"], x["multi_label"]) == (0.3, True, False))
        assert [(e["start"], e["end"], e["entity_type"]) for e in got] == \
            [(e["start"], e["end"], e["label"].upper()) for e in exp], case["id"]
    typed = gliner_server.post("/pii/detect", json={"model": "gl-pii", "text": "x", "labels": ["employee id"],
                                                    "types": ["EMPLOYEE_ID"]})
    assert typed.status_code == 200, typed.text


@pytest.mark.parametrize(("body", "said"), [
    ({"labels": [f"label {i}" for i in range(1000)]}, "`labels` has 1000 labels; at most 64"),
    ({"labels": ["x" * 10_000]}, "labels[0]: a label is 1 to 100 characters"),
    ({"labels": []}, "`labels` is empty"),
    ({"labels": ["person"], "model": "tokens"}, "`labels` needs an open-label (GLiNER) model"),
    ({"labels": ["person"], "records": [{"a": "b"}], "policy": {"default": "scan"}}, "`labels` applies to"),
])
def test_bad_labels_are_a_400(gliner_server, body, said):
    route = "/pii/redact" if "records" in body else "/pii/detect"
    text = {} if "records" in body else {"text": "Maria Lopez works at Acme Corp."}
    r = gliner_server.post(route, json={"model": "gl-pii", **text, **body})
    assert r.status_code == 400, r.text
    assert said in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "labels"
