"""GLiNER inference (pipelines/gliner.py) against the gliner package's own outputs for tiny-gliner
(reference.json: 24 texts x label sets, thresholds 0.5/0.3/0.9, flat_ner, multi_label), a padded batch against one
text at a time, texts past the model's word window scored in overlapping windows, and the configs and graphs it
refuses."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from rsinfer_cli.errors import InputError, ModelLoadError
from rsinfer_cli.pipelines import gliner as g
from rsinfer_cli.pipelines.pii_gliner import DEFAULT_LABELS as DEFAULT_TYPES

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


def test_a_row_over_the_token_limit_is_split_not_truncated(tiny, shared_models):
    """Where the package's tokenizer would truncate a row at model_max_length (and the words past the cut get no
    token), the text is windowed by tokens too: every row within the limit, every word in a window, neighbours
    overlapping; a lone word over the budget keeps its first token. Within the limit nothing changes."""
    import dataclasses

    import rsinfer_cli

    cfg, tok, run, _ = tiny
    labels = ["person", "email address"]
    tight = dataclasses.replace(cfg, max_tokens=40)
    text = " ".join(f"Dr{i} Zyxwvut{i}" for i in range(40)) + " " + "qz" * 45 + " end"
    words = g.split_words(text).words
    planned = g.plan_text(tok, tight, labels, words)
    wins = [w for w, _ in planned]
    assert all(len(enc.input_ids) <= 40 and enc.words_used == hi - lo for (lo, hi), enc in planned)
    assert wins[0][0] == 0 and wins[-1][1] == len(words)
    assert all(a[0] < b[0] and a[1] < b[1] for a, b in zip(wins, wins[1:], strict=False))       # in order
    assert all(b[0] < a[1] or words[a[1]] == "qz" * 45 or words[a[0]] == "qz" * 45     # overlapping, but beside
               for a, b in zip(wins, wins[1:], strict=False))                           # the over-budget word
    lone = next(enc for (lo, hi), enc in planned if words[lo:hi] == ("qz" * 45,))
    assert max(lone.words_mask) == 1
    short = g.split_words("Maria Lopez wrote to maria@example.com").words
    assert g.plan_text(tok, tight, labels, short) == g.plan_text(tok, cfg, labels, short)
    assert g.predict(run, tok, tight, [text], labels, 0.5)[0]          # it runs: no row over the graph's limit
    with rsinfer_cli.load(shared_models / "tiny-gliner", max_len=40, pii_labels={"person": "PERSON"}) as model:
        assert model.pipeline.describe()["window_tokens"] == 40
        model.detect([text])
        with pytest.raises(InputError, match="a row holds at most 40"):
            model.detect(["x"], labels=[f"a much longer label number {i}" for i in range(8)])


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


def test_a_folder_named_as_gliner_that_is_not_is_a_load_error(shared_models, tmp_path):
    """pii_labels on a token classifier, and gliner_config.json beside a graph that is not GLiNER's: each refused
    as it loads, with the reason."""
    import rsinfer_cli

    with pytest.raises(ModelLoadError, match="this folder has no gliner_config.json: it is a token classifier"):
        rsinfer_cli.load(shared_models / "rampart-pii", pii_labels={"employee id": "EMPLOYEE_ID"})
    fake = tmp_path / "fake-gliner"
    (fake / "onnx").mkdir(parents=True)
    src = shared_models / "rampart-pii"
    for f in src.rglob("*"):
        if f.is_file() and f.name != "reference.json":
            (fake / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            (fake / f.relative_to(src)).symlink_to(f)
    (fake / "gliner_config.json").write_bytes((shared_models / "tiny-gliner" / "gliner_config.json").read_bytes())
    with pytest.raises(ModelLoadError, match="lacks input"):
        rsinfer_cli.load(fake, kind="pii")


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
    models.append({**models[0], "name": "gl-low", "default": False, "threshold": 0.05,
                   "pii_labels": {"person": "PERSON"}})
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
    ({"labels": [f"label {i}" for i in range(1000)]}, "`labels` asks for 1000 labels; at most 64"),
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


def test_analyze_entities_are_labels_on_an_open_label_model(gliner_server):
    """Presidio's GLiNERRecognizer rule: the model is asked for its configured labels and every requested entity
    none of them answers as, that entity being the label and the type; a covered entity only filters."""
    text = "Maria Lopez (maria@acme.example) joined Acme Corp on 3 May 2021 in Lisbon."

    def analyze(entities, text=text):
        r = gliner_server.post("/analyze", json={"text": text, "language": "en", "entities": entities,
                                                 "model": "gl-low"})
        assert r.status_code == 200, r.text
        return sorted((e["start"], e["end"], e["entity_type"]) for e in r.json())

    people = analyze(["PERSON"])              # `person` answers as PERSON: no label added, only a filter
    assert people and people == [e for e in analyze(None) if e[2] == "PERSON"]
    text = "Call 3 May 2021 date"           # with random weights, a text where `date` wins spans over `person`
    added = analyze(["date", "PERSON"], text)
    r = gliner_server.post("/pii/detect", json={"model": "gl-low", "text": text, "labels": ["person", "date"]})
    dates = sorted((e["start"], e["end"], "date") for e in r.json()["results"][0]["entities"]
                   if e["entity_type"] == "DATE")
    assert dates and [e for e in added if e[2] == "date"] == dates
    assert {t for _, _, t in added} <= {"date", "PERSON"}
    closed = gliner_server.post("/analyze", json={"text": text, "language": "en", "entities": ["date"],
                                                  "model": "tokens"})
    assert closed.status_code == 200 and closed.json() == []       # a closed model ignores what it cannot find


@pytest.mark.parametrize(("entities", "said"), [
    ([f"label {i}" for i in range(1000)], "`entities` adds 1000 labels to the model's 4; at most 64 in all"),
    (["x" * 10_000], "entities[0]: a label is 1 to 100 characters"),
])
def test_bad_analyze_entities_are_a_400(gliner_server, entities, said):
    r = gliner_server.post("/analyze", json={"text": "Maria Lopez", "language": "en", "entities": entities})
    assert r.status_code == 400, r.text
    assert said in r.json()["error"]


# ---------------------------------------------------------------- the CLI


def _cli(*args: str, stdin: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rsinfer_cli", *args], input=stdin, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture(scope="module")
def gliner_config(shared_models, tmp_path_factory):
    path = tmp_path_factory.mktemp("gliner") / "rsinfer.yaml"
    path.write_text(json.dumps({"models": [{"name": "gl", "kind": "pii", "path": str(shared_models / "tiny-gliner"),
                                            "pii_recognizers": []}]}), encoding="utf-8")
    return str(path)


def test_cli_detect_and_redact_answer_what_the_package_finds(tiny, gliner_config):
    """`rsinfer detect --labels` for each reference label set at each threshold (the package's spans, each label
    answering as its default type or as itself in UPPER_SNAKE), and `rsinfer redact` replacing exactly those."""
    from concurrent.futures import ThreadPoolExecutor

    ref = tiny[3]
    runs = []
    for labels in ref["label_sets"].values():
        cases = [c for c in ref["cases"] if c["labels"] == labels and not c["truncated"] and c["words"]]
        stdin = "".join(json.dumps({"text": c["text"]}) + "\n" for c in cases)
        for threshold in (0.3, 0.5, 0.9):
            runs.append((cases, threshold, ("detect", "--config", gliner_config, "--labels", ",".join(labels),
                                            "--threshold", str(threshold)), stdin))
    with ThreadPoolExecutor(3) as pool:
        procs = list(pool.map(lambda r: _cli(*r[2], stdin=r[3]), runs))
    for (cases, threshold, _, _), proc in zip(runs, procs, strict=True):
        assert proc.returncode == 0, proc.stderr
        for case, line in zip(cases, proc.stdout.splitlines(), strict=True):
            got = json.loads(line)["pii_spans"]["text"]
            exp = next(r["entities"] for r in case["results"]
                       if (r["threshold"], r["flat_ner"], r["multi_label"]) == (threshold, True, False))
            assert [(e["start"], e["end"], e["entity_type"]) for e in got] == \
                [(e["start"], e["end"], DEFAULT_TYPES.get(e["label"], e["label"].upper().replace(" ", "_")))
                 for e in exp], (case["id"], threshold)
            assert all(abs(a["score"] - b["score"]) <= 1e-4 for a, b in zip(got, exp, strict=True))
    case = next(c for c in ref["cases"] if c["id"] == "contact/pii")
    exp = next(r["entities"] for r in case["results"]
               if (r["threshold"], r["flat_ner"], r["multi_label"]) == (0.5, True, False))
    proc = _cli("redact", "--config", gliner_config, "--plain", "--mode", "replace", "--labels",
                ",".join(case["labels"]), stdin=case["text"] + "\n")
    assert proc.returncode == 0, proc.stderr
    text = case["text"]
    for e in sorted(exp, key=lambda e: -e["start"]):
        text = text[:e["start"]] + f"<{DEFAULT_TYPES[e['label']]}>" + text[e["end"]:]
    assert exp and proc.stdout == text + "\n"


@pytest.mark.parametrize(("args", "said"), [
    (("--labels", ",".join(f"l{i}" for i in range(1000))), "`--labels` asks for 1000 labels; at most 64"),
    (("--labels", "x" * 10_000), "--labels[0]: a label is 1 to 100 characters"),
    (("--labels", "person", "--types", "DATE"), "--types: the model has no DATE (it has "),
    (("--labels", "person", "--policy", "policy.yaml"), "--labels applies to --field texts"),
])
def test_cli_bad_labels_name_the_flag(gliner_config, args, said, tmp_path):
    (tmp_path / "policy.yaml").write_text("default: scan\n", encoding="utf-8")
    args = tuple(str(tmp_path / a) if a == "policy.yaml" else a for a in args)
    proc = _cli("detect", "--config", gliner_config, *args, stdin='{"text": "Maria"}\n')
    assert proc.returncode == 2, proc.stderr
    assert said in proc.stderr


def test_cli_labels_on_a_closed_model_is_refused(shared_models):
    proc = _cli("detect", "--path", str(shared_models / "rampart-pii"), "--labels", "employee id",
                stdin='{"text": "Maria"}\n')
    assert proc.returncode == 2, proc.stderr
    assert "`--labels` needs an open-label (GLiNER) model" in proc.stderr


def test_python_api_and_tables_take_labels(tiny, shared_models, tmp_path):
    """Model.detect / redact with `labels` (texts, or label → type), the same spans as the package, and a
    Parquet table scanned with --labels through api.arrow."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import rsinfer_cli

    ref = tiny[3]
    case = next(c for c in ref["cases"] if c["id"] == "contact/date_location")
    exp = next(r["entities"] for r in case["results"]
               if (r["threshold"], r["flat_ner"], r["multi_label"]) == (0.3, True, False))
    with rsinfer_cli.load(shared_models / "tiny-gliner", pii_recognizers=[], threshold=0.3) as model:
        got = model.detect([case["text"]], labels=["date", "location"])[0]
        assert [(e.start, e.end, e.entity_type) for e in got] == [(e["start"], e["end"], e["label"].upper())
                                                                  for e in exp]
        typed = model.detect([case["text"]], labels={"date": "WHEN", "location": "WHERE"})[0]
        assert [e.entity_type for e in typed] == [{"date": "WHEN", "location": "WHERE"}[e["label"]] for e in exp]
        red = model.redact([case["text"]], mode="replace", labels=["date", "location"])[0]
        assert all(case["text"][e["start"]:e["end"]] not in red.text for e in exp if len(e["text"]) > 3)
    src, out = tmp_path / "in.parquet", tmp_path / "out.parquet"
    pq.write_table(pa.table({"id": [1], "body": [case["text"]]}), src)
    config = tmp_path / "rsinfer.yaml"
    config.write_text(json.dumps({"models": [{"name": "gl", "kind": "pii", "threshold": 0.3, "pii_recognizers": [],
                                              "path": str(shared_models / "tiny-gliner")}]}), encoding="utf-8")
    proc = _cli("detect", "--config", str(config), "--input", str(src), "--column", "body", "--output", str(out),
                "--labels", "date,location", stdin="")
    assert proc.returncode == 0, proc.stderr
    spans = pq.read_table(out).column("pii_spans").to_pylist()[0]
    assert [(e["start"], e["end"], e["entity_type"]) for e in spans] == [(e["start"], e["end"], e["label"].upper())
                                                                         for e in exp]


def test_the_row_cache_answers_a_gliner_window_again(shared_models):
    """A window's row (token ids and words_mask, so its labels and words) is a cache key: the same text and labels
    hit, other labels miss, and a hit answers the same entities; the metrics name the model."""
    import httpx

    from rsinfer_cli.config import parse_config

    from serverutil import ServerThread

    model = {"name": "gl", "kind": "pii", "path": str(shared_models / "tiny-gliner"), "pii_recognizers": [],
             "threshold": 0.3}
    text = " ".join(["Maria Lopez of Acme Corp can be reached at maria@acme.example."] * 12)   # several windows
    cfg = parse_config({"server": {"cache": {"backend": "memory"}}, "models": [model]})
    with ServerThread(cfg) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        first = c.post("/pii/detect", json={"text": text})
        second = c.post("/pii/detect", json={"text": text})
        other = c.post("/pii/detect", json={"text": text, "labels": ["date"]})
        assert (first.headers["x-rsinfer-cache"], second.headers["x-rsinfer-cache"],
                other.headers["x-rsinfer-cache"]) == ("miss", "hit", "miss")
        assert first.json() == second.json() and first.json()["results"][0]["entities"]
        assert 'rsinfer_cache_hits_total{model="gl"}' in c.get("/metrics").text


def test_records_and_every_mode_on_a_gliner_model(tiny, gliner_server):
    """A record policy's scanned fields and each redaction mode over a GLiNER model: the package's spans replaced,
    the rest of the record kept, no removed value in the answer."""
    case = next(c for c in tiny[3]["cases"] if c["id"] == "contact/pii")
    exp = next(r["entities"] for r in case["results"]
               if (r["threshold"], r["flat_ner"], r["multi_label"]) == (0.5, True, False))
    assert exp
    r = gliner_server.post("/pii/redact", json={"model": "gl-pii", "mode": "replace", "records": [
        {"id": 7, "body": case["text"], "note": "keep me"}], "policy": {"default": "keep", "fields": {"body": "scan"}}})
    assert r.status_code == 200, r.text
    record = r.json()["records"][0]["record"]
    text = case["text"]
    for e in sorted(exp, key=lambda e: -e["start"]):
        text = text[:e["start"]] + f"<{TYPES[e['label']]}>" + text[e["end"]:]
    assert record == {"id": 7, "body": text, "note": "keep me"}
    for mode in ("mask", "remove", "hash", "numbered"):
        r = gliner_server.post("/pii/redact", json={"model": "gl-pii", "text": case["text"], "mode": mode})
        assert r.status_code == 200, (mode, r.text)
        out = r.json()["results"][0]
        assert len(out["entities"]) == len(exp), mode
        assert not any(e["text"] in out["text"] for e in exp if len(e["text"]) > 4), mode
        assert all(e["text"] not in json.dumps(r.json()) for e in exp if len(e["text"]) > 4), mode
