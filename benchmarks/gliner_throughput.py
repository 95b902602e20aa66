"""GLiNER throughput: `rsinfer serve` answering `/pii/detect` with a GLiNER model, against the gliner package's own
ONNX path on the same texts and labels, and the raw pipeline in-process.

    python3 -m venv /tmp/glv && /tmp/glv/bin/pip install torch==2.13.0 gliner==0.2.29 onnxruntime   # once
    .venv/bin/python benchmarks/gliner_throughput.py --gliner-python /tmp/glv/bin/python

The model is `tiny-gliner` (../shared/models: the package's own ONNX export, random weights, BERT hidden 32): its
forward costs little, so the numbers compare what is around the forward (words, prompt, tensors, decoding,
serving). The texts are sentences of 8 to 60 words with names, e-mail addresses, phone numbers and companies (within
the model's 64-word window, so every side does the same work); the labels person, email, phone number,
organization; threshold 0.5.

- One client: the package's `predict_entities` one text at a time, the raw pipeline at batch 1 (tokenizers →
  session.run → numpy decoding, pipelines/gliner.py), and rsinfer answering one request at a time.
- Under 8 clients: the package as teams serve it by hand (8 threads, each calling `predict_entities` on its
  request's text), its own `batch_predict_entities` over all the texts at once (a ceiling no server of single
  requests reaches: it knows every text in advance), the raw pipeline's length-sorted batches of the best size, and
  rsinfer with 8 keep-alive clients, each sending its next text when its answer is in.

Both sides run ONNX Runtime with their own defaults on this machine's CPUs. The entities of every text are compared
between the package and rsinfer (types mapped back to labels); the section says how many agree.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _serve import Serve, write_results
from batching import ROOT, SHARED, drive, machine

MODEL = SHARED / "tiny-gliner"
LABELS = ["person", "email", "phone number", "organization"]
TYPES = {"person": "PERSON", "email": "EMAIL", "phone number": "PHONE", "organization": "ORGANIZATION"}
CLIENTS = 8

PACKAGE = r"""
import json, sys, time, warnings
from concurrent.futures import ThreadPoolExecutor
warnings.filterwarnings("ignore")
from gliner import GLiNER

folder, labels = sys.argv[1], json.loads(sys.argv[2])
texts = json.loads(sys.stdin.readline())
model = GLiNER.from_pretrained(folder, load_onnx_model=True, onnx_model_file="onnx/model.onnx",
                               local_files_only=True)
pool = ThreadPoolExecutor(8)
for t in texts[:20]:
    model.predict_entities(t, labels)
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:                      # one measurement a line: [what, seconds or batch size]
    what, arg = json.loads(line)
    out = {}
    t0 = time.perf_counter()
    if what == "single":
        n = 0
        while time.perf_counter() - t0 < arg and n < len(texts):
            model.predict_entities(texts[n], labels, threshold=0.5)
            n += 1
    elif what == "threads":
        n = len(list(pool.map(lambda t: model.predict_entities(t, labels, threshold=0.5), texts)))
    else:
        found = model.batch_predict_entities(texts, labels, threshold=0.5, batch_size=arg)
        n = len(texts)
        out["entities"] = [[[e["start"], e["end"], e["label"]] for e in ents] for ents in found]
    out["rate"] = n / (time.perf_counter() - t0)
    print(json.dumps(out), flush=True)
"""

FIRST = ["Maria", "James", "Aiko", "Olu", "Priya", "Lars", "Chen", "Fatima", "Diego", "Anna"]
LAST = ["Lopez", "Okafor", "Tanaka", "Smith", "Nair", "Berg", "Wei", "Haddad", "Silva", "Novak"]
ORGS = ["Acme Corp", "Globex", "Initech", "Umbrella Health", "Stark Logistics", "Wayne Foods"]
FILLER = ("please review the attached notes before the meeting and reply with any changes you would like us to "
          "make to the schedule for next week as soon as you can").split()


def texts(n: int, seed: int = 58) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        first, last, org = rng.choice(FIRST), rng.choice(LAST), rng.choice(ORGS)
        parts = [f"{first} {last} from {org} wrote:", f"call {rng.randint(200, 999)}-555-{rng.randint(1000, 9999)}",
                 f"or mail {first.lower()}.{last.lower()}@example.com;"]
        rng.shuffle(parts)
        words = " ".join(parts).split() + FILLER[:rng.randint(0, 44)]
        out.append(" ".join(words[:60]))
    return out


class Package:
    """The gliner package in its own venv, a process that measures what it is asked, one line at a time."""

    def __init__(self, python: str, items: list[str]) -> None:
        self.proc = subprocess.Popen([python, "-c", PACKAGE, str(MODEL), json.dumps(LABELS)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.ask(items)

    def ask(self, message: object) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the gliner process ended (exit {self.proc.wait(60)})")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(60)


class Raw:
    """The raw pipeline in-process: pipelines/gliner.py's predict on one ONNX Runtime session with its default
    threads (tokenizers → session.run → numpy decoding)."""

    def __init__(self, items: list[str]) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        sys.path.insert(0, str(ROOT.parent / "src"))
        from rsinfer_cli.pipelines import gliner

        self.g, self.items = gliner, items
        self.tok = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
        self.tok.no_truncation()
        self.tok.no_padding()
        self.sess = ort.InferenceSession(str(MODEL / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
        self.cfg = gliner.GlinerConfig.load(MODEL)
        self.feeds = [gliner.feeds([gliner.encode(self.tok, self.cfg, LABELS, gliner.split_words(t).words)],
                                   self.cfg.max_width) for t in items[:2000]]
        for t in items[:20]:
            self.predict([t])

    def run(self, feeds: dict) -> object:
        return self.sess.run(["logits"], feeds)[0]

    def predict(self, texts: list[str], batch_size: int = 8) -> list:
        return self.g.predict(self.run, self.tok, self.cfg, texts, LABELS, batch_size=batch_size)

    def single(self, seconds: float) -> float:
        """Texts/s one at a time."""
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds and n < len(self.items):
            self.predict([self.items[n]])
            n += 1
        return n / (time.perf_counter() - t0)

    def forward(self, seconds: float) -> float:
        """Forwards/s at batch 1 alone: the floor of any one-client latency."""
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds and n < len(self.feeds):
            self.run(self.feeds[n])
            n += 1
        return n / (time.perf_counter() - t0)

    def batched(self, size: int) -> float:
        """Texts/s of length-sorted batches of `size`."""
        ordered = sorted(self.items, key=len)
        t0 = time.perf_counter()
        self.predict(ordered, size)
        return len(ordered) / (time.perf_counter() - t0)


SIZES = (8, 32, 64)


def median(values: list[float]) -> float:
    return statistics.median(values)


def rounds(pkg: Package, raw: Raw, url: str, items: list[str], count: int, seconds: float) -> dict[str, list[float]]:
    """Every measurement once a round, `count` rounds, so that a slower spell of the machine falls on all of them."""
    bodies = [{"model": "gl", "text": t} for t in items]
    pkg_size = max(SIZES, key=lambda size: pkg.ask(["batch", size])["rate"])
    raw_size = max(SIZES, key=raw.batched)
    got: dict[str, list[float]] = {"pkg_size": [pkg_size], "raw_size": [raw_size]}
    for _ in range(count):
        one = asyncio.run(drive(url, "/pii/detect", bodies, 1, seconds))
        many = asyncio.run(drive(url, "/pii/detect", bodies, CLIENTS, seconds))
        for key, value in (("pkg1", pkg.ask(["single", seconds])["rate"]), ("raw1", raw.single(seconds)),
                           ("fwd", raw.forward(seconds)), ("rs1", one["rps"]), ("rs1_p50", one["p50_ms"]),
                           ("pkg8", pkg.ask(["threads", 0])["rate"]), ("pkgB", pkg.ask(["batch", pkg_size])["rate"]),
                           ("rawB", raw.batched(raw_size)), ("rs8", many["rps"]), ("rs8_p50", many["p50_ms"])):
            got.setdefault(key, []).append(value)
    return got


def ratio(got: dict[str, list[float]], a: str, b: str) -> str:
    """The median over rounds of a's rate over b's in the same round."""
    return f"{median([x / y for x, y in zip(got[a], got[b], strict=True)]):.2f}x"


def agreement(pkg: Package, url: str, items: list[str]) -> int:
    """Texts on which the package and rsinfer found the same entities (types mapped back to labels)."""
    import httpx

    theirs = pkg.ask(["batch", 32])["entities"]
    with httpx.Client(base_url=url, timeout=300) as c:
        r = c.post("/pii/detect", json={"model": "gl", "texts": items})
        r.raise_for_status()
        ours = [res["entities"] for res in r.json()["results"]]
    label_of = {v: k for k, v in TYPES.items()}
    return sum(1 for a, b in zip(theirs, ours, strict=True)
               if [tuple(e) for e in a] == [(e["start"], e["end"], label_of[e["entity_type"]]) for e in b])


def table(got: dict[str, list[float]]) -> list[str]:
    m = {k: median(v) for k, v in got.items()}
    return [
        "| clients | what | texts/s | vs the package | vs the raw pipeline | p50 ms |", "|---|---|---|---|---|---|",
        f"| 1 | gliner `predict_entities`, one text at a time | {m['pkg1']:.0f} | 1.00x | "
        f"{ratio(got, 'pkg1', 'raw1')} | {1000 / m['pkg1']:.2f} |",
        f"| 1 | raw pipeline, batch 1 | {m['raw1']:.0f} | {ratio(got, 'raw1', 'pkg1')} | 1.00x | "
        f"{1000 / m['raw1']:.2f} |",
        f"| 1 | **rsinfer** `/pii/detect` | {m['rs1']:.0f} | **{ratio(got, 'rs1', 'pkg1')}** | "
        f"{ratio(got, 'rs1', 'raw1')} | {m['rs1_p50']:.2f} |",
        f"| 1 | the forward alone, batch 1 (no words, prompt, decoding or HTTP: the floor) | {m['fwd']:.0f} | "
        f"{ratio(got, 'fwd', 'pkg1')} | {ratio(got, 'fwd', 'raw1')} | {1000 / m['fwd']:.2f} |",
        f"| 8 | gliner `predict_entities` on 8 threads (a hand-built server) | {m['pkg8']:.0f} | 1.00x | "
        f"{ratio(got, 'pkg8', 'rawB')} | - |",
        f"| all at once | gliner `batch_predict_entities`, batch {m['pkg_size']:.0f} | {m['pkgB']:.0f} | "
        f"{ratio(got, 'pkgB', 'pkg8')} | {ratio(got, 'pkgB', 'rawB')} | - |",
        f"| all at once | raw pipeline, length-sorted batches of {m['raw_size']:.0f} | {m['rawB']:.0f} | "
        f"{ratio(got, 'rawB', 'pkg8')} | 1.00x | - |",
        f"| 8 | **rsinfer** `/pii/detect` | {m['rs8']:.0f} | **{ratio(got, 'rs8', 'pkg8')}** "
        f"({ratio(got, 'rs8', 'pkgB')} its batch) | {ratio(got, 'rs8', 'rawB')} | {m['rs8_p50']:.2f} |"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gliner-python", required=True, help="a python with gliner (and torch) installed")
    ap.add_argument("--texts", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=4, help="per measurement")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "RESULTS.md")
    args = ap.parse_args()
    items = texts(args.texts)
    pkg = Package(args.gliner_python, items)
    raw = Raw(items)
    models = f"  - {{name: gl, kind: pii, path: '{MODEL}', pii_recognizers: [], pii_labels: {json.dumps(TYPES)}}}\n"
    try:
        with tempfile.TemporaryDirectory() as tmp, Serve(models, Path(tmp), name="gliner") as srv:
            agree = agreement(pkg, srv.url, items)
            asyncio.run(drive(srv.url, "/pii/detect", [{"model": "gl", "text": t} for t in items[:200]], 4, 3))
            got = rounds(pkg, raw, srv.url, items, args.rounds, args.seconds)
    finally:
        pkg.close()
    version = subprocess.run([args.gliner_python, "-c", "from importlib.metadata import version as v; "
                              "print(v('gliner'), v('torch'))"], capture_output=True, text=True,
                             timeout=120).stdout.split()
    lines = ["", "## GLiNER: rsinfer against the gliner package's ONNX path (`gliner_throughput.py`)", "",
             f"Machine: {machine()}; gliner {version[0]}, torch {version[1]}. Command: `.venv/bin/python "
             "benchmarks/gliner_throughput.py --gliner-python /tmp/glv/bin/python` (the venv as the script's "
             "docstring makes it). tiny-gliner (random weights, BERT hidden 32: the forward costs little, so this "
             f"compares what is around it), {len(items)} texts of 8-60 words, labels {', '.join(LABELS)}, threshold "
             "0.5; rsinfer with its defaults and the recognizers off (`pii_recognizers: []`: the package's work, no "
             f"more). Medians of {args.rounds} rounds of {args.seconds:g} s per measurement, every measurement once "
             "a round (ratios: the median of each round's own ratio). The package and rsinfer found the same "
             f"entities in {agree} of {len(items)} texts.", "", *table(got), ""]
    return write_results(args.out, lines)


if __name__ == "__main__":
    sys.exit(main())
