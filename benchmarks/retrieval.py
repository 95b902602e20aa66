"""Dense, sparse (SPLADE) and late-interaction (ColBERT) families against their raw ONNX Runtime pipelines, and the
memory a sparse model holds under load, in one run.

    .venv/bin/python benchmarks/retrieval.py            # its section of benchmarks/RESULTS.md

Throughput: one `rsinfer serve` with the default config (no thread or batching settings) serving all-MiniLM-L6-v2
(`/v1/embeddings`), tiny-splade (`/v1/embeddings/sparse`) and tiny-colbert (`/v1/embeddings/tokens`, documents),
under 64 clients x 1 short query and 8 clients x 16 mixed texts; each as a ratio to its ceiling: the same texts
in-process through the raw pipeline (tokenizers -> session.run -> the family's numpy post-processing) in
length-sorted batches of the best size, the best of two sessions x one thread and one x two. Every text is unique
(the row cache, on by default, never answers).

Memory: a server with tiny-splade alone (all-MiniLM's 30522-id vocabulary), 64 clients each sending one distinct
256-token text at once, four rounds; the server process's peak RSS (VmHWM) and its RSS before the load. Rows: the
defaults; `batching.max_tokens: 16384` (an accelerator's token budget on this CPU) with the default max_logits_mb;
the same with `max_logits_mb: 4096` (no cap in effect). The load generator is an asyncio client in this process on
127.0.0.1; every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import string
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
from _serve import Serve, peak_rss_bytes, write_results
from batching import ROOT, SHARED, Raw, drive, machine, mixed, queries

MINILM, SPLADE, COLBERT = SHARED / "all-minilm-l6-v2", SHARED / "tiny-splade", SHARED / "tiny-colbert"


# ---------------------------------------------------------------- the raw pipelines (the ceilings)


class RawSparse(Raw):
    """tokenizers -> session.run -> per text: max over its tokens' logits, log1p(relu) -> the non-zero ids."""

    def embed(self, sess, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        encs = self.tok.encode_batch(texts)
        ids, mask = _pad([e.ids for e in encs], 0)
        (logits,) = sess.run(["logits"], {"input_ids": ids, "attention_mask": mask,
                                          "token_type_ids": np.zeros_like(ids)})
        out = []
        for j, e in enumerate(encs):
            v = np.log1p(np.maximum(logits[j, :len(e.ids)].max(axis=0), 0))
            nz = np.flatnonzero(v)
            out.append((nz, v[nz]))
        return out


class RawColbert(Raw):
    """Documents as PyLate encodes them: [CLS] [D] text [SEP] cut to 180 tokens -> session.run -> the Dense
    projection of the non-punctuation tokens -> L2."""

    def __init__(self, model_dir: Path) -> None:
        from safetensors.numpy import load_file

        super().__init__(model_dir)
        self.tok.enable_truncation(179)
        self.prefix = self.tok.token_to_id("[D] ")
        self.skip = np.array([self.tok.token_to_id(c) for c in string.punctuation])
        self.w = load_file(str(model_dir / "1_Dense" / "model.safetensors"))["linear.weight"].T.copy()

    def embed(self, sess, texts: list[str]) -> list[np.ndarray]:
        rows = [[e.ids[0], self.prefix, *e.ids[1:]] for e in self.tok.encode_batch(texts)]
        ids, mask = _pad(rows, 103)
        (h,) = sess.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": mask,
                                                "token_type_ids": np.zeros_like(ids)})
        out = []
        for j, row in enumerate(rows):
            keep = np.flatnonzero(~np.isin(np.asarray(row), self.skip))
            v = h[j, keep] @ self.w
            out.append(v / np.linalg.norm(v, axis=1, keepdims=True))
        return out


def _pad(rows: list[list[int]], pad: int) -> tuple[np.ndarray, np.ndarray]:
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), pad, dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r
        mask[i, :len(r)] = 1
    return ids, mask


def best_ceiling(raw: Raw, texts: list[str]) -> tuple[float, int]:
    return max(raw.ceiling(texts, [1, 8, 16, 32, 64], s, t) for s, t in ((2, 1), (1, 2)))


# ---------------------------------------------------------------- throughput

FAMILIES: dict[str, tuple[str, str, Callable[[Path], Raw]]] = {   # name → (route, model, raw pipeline)
    "embedding (all-MiniLM-L6-v2)": ("/v1/embeddings", "mini", Raw),
    "sparse (tiny-splade)": ("/v1/embeddings/sparse", "splade", RawSparse),
    "late_interaction (tiny-colbert, documents)": ("/v1/embeddings/tokens", "colbert", RawColbert),
}
FOLDERS = {"mini": MINILM, "splade": SPLADE, "colbert": COLBERT}


def unique(texts: list[str]) -> list[str]:
    return [f"{t} {i}" for i, t in enumerate(texts)]


def throughput(tmp: Path, max_s: float) -> list[str]:
    short, long = unique(queries(6000, 1)), unique(mixed(1600, 2))
    models = "".join(f"  - {{name: {n}, kind: {k}, path: '{FOLDERS[n]}'}}\n"
                     for n, k in (("mini", "embedding"), ("splade", "sparse"), ("colbert", "late_interaction")))
    rows = []
    with Serve(models, tmp, "max_queue: 1024", name="retrieval") as srv:
        for label, (route, model, _) in FAMILIES.items():
            one = [{"model": model, "input": q} for q in short]
            groups = [{"model": model, "input": long[k:k + 16]} for k in range(0, len(long), 16)]
            asyncio.run(drive(srv.url, route, one[-200:], 8, 10))            # warm-up on texts not measured
            r64 = asyncio.run(drive(srv.url, route, one[:-200], 64, max_s))
            r8 = asyncio.run(drive(srv.url, route, groups, 8, max_s))
            rows.append((label, r64, r8))
    out = []
    for label, r64, r8 in rows:
        route, model, make = FAMILIES[label]
        raw = make(FOLDERS[model])
        c64, b64 = best_ceiling(raw, short[:min(r64["requests"], 2000)])     # the texts the server was sent
        c8, b8 = best_ceiling(raw, long[:min(r8["requests"] * 16, 800)])
        t64, t8 = r64["rps"], r8["rps"] * 16
        out.append(f"| {label} | `{route}` | {t64:.1f} | {c64:.1f} (batch {b64}) | {t64 / c64:.2f} | {t8:.1f} | "
                   f"{c8:.1f} (batch {b8}) | {t8 / c8:.2f} | {r64['p50_ms']:.1f} / {r8['p50_ms']:.1f} | "
                   f"{r64['errors'] + r8['errors']} |")
    return out


# ---------------------------------------------------------------- memory


def rss_kib(pid: int) -> int:
    """The process's resident memory now (VmRSS), KiB."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def memory(tmp: Path, rows: list[tuple[str, str]]) -> list[str]:
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(str(SPLADE / "tokenizer.json"))
    words = " ".join(mixed(400, 3)).split()
    texts = []
    for i in range(256):          # distinct texts of 254 word pieces (+ [CLS] and [SEP]: max_len)
        ids = tok.encode(f"{i} " + " ".join(words[i * 7:i * 7 + 400]), add_special_tokens=False).ids[:254]
        texts.append(tok.decode(ids))
    out = []
    for label, extra in rows:
        models = f"  - {{name: splade, kind: sparse, path: '{SPLADE}'{extra}}}\n"
        with Serve(models, tmp, "max_queue: 1024", name="splade-mem") as srv:
            pid = srv.proc.pid
            asyncio.run(drive(srv.url, "/v1/embeddings/sparse", [{"input": "warm up"}], 1, 5))
            before = rss_kib(pid)
            bodies = [{"input": t} for t in texts]
            res = asyncio.run(drive(srv.url, "/v1/embeddings/sparse", bodies, 64, 120))
            peak = peak_rss_bytes(pid) // 1024
            info = json.loads(_get(srv.url + "/v1/models"))["data"][0]["pipeline"]
        out.append(f"| {label} | {info['max_tokens_per_forward']} | "
                   f"{info['max_tokens_per_forward'] * 30522 * 4 / 2**20:.0f} | {before / 1024:.0f} | "
                   f"{peak / 1024:.0f} | {(peak - before) / 1024:.0f} | {res['requests']} | {res['errors']} |")
    return out


def _get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as r:    # noqa: S310 - 127.0.0.1 only
        return r.read().decode()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-seconds", type=float, default=15, help="per workload and family")
    ap.add_argument("--out", type=Path, default=ROOT / "RESULTS.md")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        mem = memory(tmp, [("the defaults", ""),
                           ("`batching: {max_tokens: 16384}`", ", batching: {max_tokens: 16384}"),
                           ("`batching: {max_tokens: 16384}`, `max_logits_mb: 4096`",
                            ", batching: {max_tokens: 16384}, max_logits_mb: 4096")])
        thr = throughput(tmp, args.max_seconds)
    lines = ["", "## Retrieval families: dense, sparse and late interaction against their raw pipelines "
             "(`retrieval.py`)", "",
             f"Machine: {machine()}. Reproduce: `.venv/bin/python "
             "benchmarks/retrieval.py`. One server, the default config, three models; every text unique (the row "
             "cache never answers). Ceiling: the same texts through the raw in-process pipeline of the family "
             "(tokenizers -> session.run -> its numpy post-processing) in length-sorted batches of the best size, "
             "the best of 2 sessions x 1 thread and 1 x 2.", "",
             "| family | route | 64x1 texts/s | 64x1 ceiling | / ceiling | 8x16 texts/s | 8x16 ceiling | / ceiling | "
             "p50 64x1 / 8x16 (ms) | errors |",
             "|---|---|---|---|---|---|---|---|---|---|", *thr, "",
             "Memory of a sparse model under load: tiny-splade (30522-id vocabulary) alone, 64 clients at once, each "
             "sending one distinct 256-token text (256 requests). Peak = the server process's VmHWM; logits per "
             "forward = the tokens one forward may hold x 30522 x 4 bytes (64 such texts in one forward would be "
             "64 x 256 x 30522 x 4 B = 1908 MiB).", "",
             "| config | tokens per forward | logits per forward (MiB) | RSS before (MiB) | peak RSS (MiB) | "
             "peak - before (MiB) | requests | errors |",
             "|---|---|---|---|---|---|---|---|", *mem, ""]
    return write_results(args.out, lines)


if __name__ == "__main__":
    sys.exit(main())
