"""The adversarial corpus: (name, method, route, body, status, what the answer must say). Bodies are built lazily
(some are megabytes). Each names the defect of the attack it reproduces."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Case:
    name: str
    route: str
    body: Callable[[], Any]
    status: int
    says: str = ""               # a substring of the error message
    method: str = "POST"


DEEP = "@DEEP@"      # where a body's deep value goes (json.dumps itself cannot write one that deep)


def deep(levels: int) -> str:
    return '{"x":' * levels + "1" + "}" * levels


def deep_list(levels: int) -> str:
    return "[" * levels + "1" + "]" * levels


def with_deep(body: dict[str, Any], value: str) -> bytes:
    """`body` as JSON with the string DEEP replaced by `value` (raw JSON)."""
    import json

    return json.dumps(body).replace(f'"{DEEP}"', value).encode()


LETTERS = " ".join("a" * 1 for _ in range(60_000))          # 60,000 one-letter words: a span each
TICKETS = "Ticket " + " ".join(f"T{i}" for i in range(20_000))


CASES = [
    # 1. answers of unbounded size: a template (or new_value) times the spans
    Case("anonymize: new_value past 200 characters", "/anonymize",
         lambda: {"text": "a b", "analyzer_results": [{"start": 0, "end": 1, "entity_type": "X"}],
                  "anonymizers": {"DEFAULT": {"type": "replace", "new_value": "N" * 1000}}}, 400, "at most 200"),
    # types alternate: Presidio's engine makes one span of same-type spans with only spaces between them
    Case("anonymize: 200-character new_value over 60,000 one-letter spans", "/anonymize",
         lambda: {"text": LETTERS, "analyzer_results": [{"start": 2 * i, "end": 2 * i + 1, "entity_type": "XY"[i % 2]}
                                                        for i in range(60_000)],
                  "anonymizers": {"DEFAULT": {"type": "replace", "new_value": "N" * 200}}}, 413, "4x its input"),
    Case("anonymize: sha512 of 60,000 one-letter spans", "/anonymize",
         lambda: {"text": LETTERS, "analyzer_results": [{"start": 2 * i, "end": 2 * i + 1, "entity_type": "XY"[i % 2]}
                                                        for i in range(60_000)],
                  "anonymizers": {"DEFAULT": {"type": "hash", "hash_type": "sha512"}}}, 413, "anonymizers"),
    Case("redact: replacement past 200 characters", "/pii/redact",
         lambda: {"text": "Jane", "mode": "replace", "replacement": "{type}" + "R" * 2000}, 400, "at most 200"),
    Case("redact: a 190-character template over 20,000 deny-list matches", "/pii/redact",
         lambda: {"text": LETTERS[:40_000], "mode": "replace", "replacement": "<{type}>" + "R" * 180,
                  "deny_list": {"LETTER": ["a"]}}, 413, "replacement"),
    # 4. a prompt is a text: it counts toward max_text_chars, and times the texts toward the body cap
    Case("embeddings: a prompt past max_text_chars with its text", "/v1/embeddings",
         lambda: {"model": "minilm", "input": ["x" * 10], "prompt": "p" * 200_000}, 413, "prompt"),
    Case("embeddings: a 19,000-character prompt on 2,000 texts", "/v1/embeddings",
         lambda: {"model": "minilm", "input": ["x"] * 2000, "prompt": "p" * 19_000}, 413, "max_body_mb"),
    Case("sparse: a prompt past max_text_chars", "/v1/embeddings/sparse",
         lambda: {"model": "splade", "input": ["x"], "prompt": "p" * 200_001}, 413, "prompt"),
    # 4. so are NLI hypotheses and assertions, paired with every text
    Case("zero-shot: a label past max_text_chars", "/classify/zero-shot",
         lambda: {"model": "nli", "input": "x", "candidate_labels": ["l" * 200_001]}, 413, "candidate_labels[0]"),
    Case("zero-shot: a 150,000-character label on 300 texts", "/classify/zero-shot",
         lambda: {"model": "nli", "input": ["x"] * 300, "candidate_labels": ["l" * 150_000, "b"]}, 413,
         "max_body_mb"),
    Case("zero-shot: a template past max_text_chars", "/classify/zero-shot",
         lambda: {"model": "nli", "input": "x", "candidate_labels": ["a", "b"],
                  "hypothesis_template": "{}" + "t" * 200_000}, 413, "hypothesis_template"),
    Case("true-false: a 150,000-character assertion on 300 texts", "/classify/true-false",
         lambda: {"model": "nli", "input": ["x"] * 300, "assertion": "a" * 150_000}, 413, "max_body_mb"),
    # 7. deep JSON in every free-form field
    Case("deep JSON: an unknown field", "/v1/embeddings",
         lambda: with_deep({"model": "minilm", "input": ["x"], "extra": DEEP}, deep(1000)), 400, "at most 64"),
    Case("deep JSON: HF parameters", "/models/minilm",
         lambda: with_deep({"inputs": "x", "parameters": DEEP}, deep(1000)), 400,
         "at most 64"),
    Case("deep JSON: an ad-hoc recognizer", "/analyze",
         lambda: with_deep({"text": "x", "language": "en", "ad_hoc_recognizers": [DEEP]}, deep(1000)),
         400, "at most 64"),
    Case("deep JSON: a rerank document", "/v1/rerank",
         lambda: with_deep({"model": "ce", "query": "q", "documents": [DEEP]}, deep(1000)), 400, "at most 64"),
    Case("deep JSON: KServe data", "/v2/models/adder/infer",
         lambda: with_deep({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 2], "data": DEEP}]},
                           deep_list(5000)),
         400, "depth"),
    Case("deep JSON: 300 levels (past orjson's 255, under msgspec's)", "/models/minilm",
         lambda: with_deep({"inputs": "x", "parameters": DEEP}, deep(300)), 400, "at most 64"),
    # 8. ad-hoc recognizers' context and score
    *[Case(f"analyze: context {kind}", "/analyze",
           lambda value=value: {"text": "ticket zx-1", "language": "en", "ad_hoc_recognizers": [
               {"supported_entity": "T", "patterns": [{"regex": "zx-\\d", "score": 0.5}], "context": value}]},
           400, "context")
      for kind, value in (("a number", 5), ("a string", "ticket"), ("a mapping", {"ticket": 1}))],
    Case("analyze: a pattern's score that is not a number", "/analyze",
         lambda: {"text": "zx-1", "language": "en", "ad_hoc_recognizers": [
             {"supported_entity": "T", "patterns": [{"regex": "zx-\\d", "score": "high"}]}]}, 400, "a number"),
    # 14. RE2 programs times the text
    Case("detect: a costly RE2 program over 100,000 characters", "/pii/detect",
         lambda: {"text": "a" * 100_000, "patterns": [
             {"entity_type": "Q", "regex": "(?:[a-z]{0,20}\\w{0,20}\\d?){0,40}Q"}]}, 400, "patterns[0].regex[0]"),
    # 15. a validator that raises is a match that fails it
    Case("detect: stdnum.be.vat over a 5,000-digit match", "/pii/detect",
         lambda: {"text": "vat " + "1" * 5000, "patterns": [
             {"entity_type": "VAT", "regex": "\\d+", "validator": "stdnum.be.vat"}]}, 200),
    Case("analyze: a raising validator in a Presidio pattern", "/pii/detect",
         lambda: {"text": "x " + "9" * 5000, "patterns": [
             {"entity_type": "IBAN_X", "regex": "\\d{10,}", "validator": "stdnum.iban"}]}, 200),
    # 16. the deny list's 1,000 values are all types together
    Case("detect: 10 types of 1,000 deny values", "/pii/detect",
         lambda: {"text": "x", "deny_list": {f"T{i}": [f"v{i}_{j}" for j in range(1000)] for i in range(10)}},
         400, "all types together"),
    Case("analyze: 33 ad-hoc recognizers", "/analyze",
         lambda: {"text": "x", "language": "en", "ad_hoc_recognizers": [
             {"supported_entity": "T", "patterns": [{"regex": "x", "score": 0.5}]}] * 33}, 400, "at most 32"),
    # 2. a text of matches: linear now; the answer comes (its cost is benchmarks/pii_linear.py's)
    Case("analyze: 20,000 one-letter deny-list matches", "/analyze",
         lambda: {"text": LETTERS[:40_000], "language": "en", "ad_hoc_recognizers": [
             {"supported_entity": "LETTER", "deny_list": ["a"]}]}, 200),
    Case("detect: 20,000 pattern matches", "/pii/detect",
         lambda: {"text": TICKETS, "patterns": [{"entity_type": "TICKET", "regex": "T\\d+"}]}, 200),
    # 13. a long query is tokenized once
    Case("rerank: a 200,000-character query with 32 documents", "/v1/rerank",
         lambda: {"model": "ce", "query": "query words " * 16_000, "documents": ["a document"] * 32}, 200),
]
