"""The family contract is not only for text: a toy family whose rows are byte strings, declared in this file alone
(its pipeline, its input kind and one `register` line; no edit of src/), is served on OpenAI's /v1/embeddings, TEI's
/embed and Cohere's /v2/embed through `serves=("embedding",)`: its pipeline implements the `Embedder` protocol the
embedding routes call, its input kind (base64 items, measured in bytes) is decoded and bounded in the one place the
routes check inputs, and the row cache keys its rows by the family's own row identity (`row_bytes`)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import Any

import httpx
import numpy as np
import pytest

from rsinfer_cli import families
from rsinfer_cli.config import parse_config
from rsinfer_cli.engine.session import Session
from rsinfer_cli.errors import InputError
from rsinfer_cli.pipelines.base import Timing, Work
from rsinfer_cli.pipelines.embedding import Embedder, EmbedResult

from serverutil import ServerThread

WIDTH = 8
MAX_BYTES = 64


def weights() -> np.ndarray:
    return np.random.default_rng(7).standard_normal((256, WIDTH)).astype(np.float32)


def histogram(data: bytes) -> np.ndarray:
    return np.bincount(np.frombuffer(data, np.uint8), minlength=256).astype(np.float32)


def reference(items: Sequence[bytes], normalize: bool = True) -> np.ndarray:
    v = np.stack([histogram(b) for b in items]) @ weights()
    return v / np.linalg.norm(v, axis=1, keepdims=True) if normalize else v


# ---------------------------------------------------------------- the family: a byte histogram through a matmul


def decode_b64(item: Any, where: str) -> bytes:
    """A request item (a base64 string) → the bytes it encodes."""
    if not isinstance(item, str):
        raise InputError(f"`{where}` must be a base64 string", param=where)
    try:
        return base64.b64decode(item, validate=True)
    except (binascii.Error, ValueError):
        raise InputError(f"`{where}` is not valid base64", param=where) from None


class BytesEmbedder(Embedder):
    """Rows are byte strings; a forward stacks their byte histograms and runs the graph (X [n, 256] → Y [n, 8])."""

    kind = "bytes"

    def forward(self, session: Session, rows: Sequence[Any]) -> list[Any]:
        out = self.model.run(session, {"X": np.stack([histogram(r) for r in rows])})["Y"]
        return list(out)

    def row_bytes(self, row: Any) -> bytes:
        return bytes(row)

    def plan(self, texts: Sequence[Any] | None = None, ids: Sequence[Sequence[int]] | None = None, *,
             dimensions: int | None = None, normalize: bool | None = None, truncate: bool | None = None,
             direction: str = "right", param: str = "input", prompt_name: str | None = None,
             prompt: str | None = None) -> Work[EmbedResult]:
        if ids is not None or texts is None:
            raise InputError("a bytes model embeds base64 byte strings, not token ids", param=param)
        if prompt_name is not None or prompt is not None or dimensions is not None:
            raise InputError("a bytes model has no prompts or dimensions", param=param)
        rows = list(texts)
        timing = Timing()

        def finish(outputs: list[Any]) -> EmbedResult:
            v = np.stack(outputs).astype(np.float32) if outputs else np.zeros((0, WIDTH), np.float32)
            if normalize is not False:
                v = v / np.linalg.norm(v, axis=1, keepdims=True)
            return EmbedResult(vectors=v, timing=timing)

        return Work(rows, [1] * len(rows), finish, timing)


BYTES = families.Family(kind="bytes", summary="byte strings embedded by their histogram", pipeline=BytesEmbedder,
                        needs_tokenizer=False, serves=("embedding",),
                        inputs=families.InputKind(name="bytes", unit="bytes", decode=decode_b64, max_size=MAX_BYTES))


# ---------------------------------------------------------------- the tests


@pytest.fixture
def bytes_family():
    families.register(BYTES)
    yield BYTES
    families.unregister("bytes")


def bytes_model(folder) -> str:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    folder.mkdir()
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])], "histogram",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", 256])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n", WIDTH])],
        [numpy_helper.from_array(weights(), "W")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "model.onnx")
    return str(folder)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def test_a_bytes_family_answers_the_embedding_routes(bytes_family, tmp_path):
    items = [b"\x00\x01\x02hello", b"\xff" * 40, bytes(range(60))]
    cfg = parse_config({"server": {"cache": {"backend": "memory"}, "max_texts": 4},
                        "models": [{"name": "bytes", "kind": "bytes", "path": bytes_model(tmp_path / "b")}]})
    with ServerThread(cfg) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        openai = c.post("/v1/embeddings", json={"model": "bytes", "input": [b64(b) for b in items]})
        assert openai.status_code == 200, openai.text
        got = np.array([d["embedding"] for d in openai.json()["data"]], dtype=np.float32)
        np.testing.assert_allclose(got, reference(items), rtol=1e-5, atol=1e-6)
        assert openai.headers["x-rsinfer-cache"] == "miss"
        again = c.post("/v1/embeddings", json={"model": "bytes", "input": [b64(items[1])]})
        assert again.headers["x-rsinfer-cache"] == "hit"          # keyed by the family's own row identity
        assert np.array_equal(np.asarray(again.json()["data"][0]["embedding"], dtype=np.float32), got[1])

        tei = c.post("/embed", json={"inputs": b64(items[0]), "normalize": False})   # the default embedding model
        np.testing.assert_allclose(tei.json()[0], reference(items[:1], normalize=False)[0], rtol=1e-5)
        cohere = c.post("/v2/embed", json={"model": "bytes", "texts": [b64(items[2])], "embedding_types": ["float"]})
        np.testing.assert_allclose(cohere.json()["embeddings"]["float"][0], got[2], rtol=1e-6)

        big = c.post("/v1/embeddings", json={"model": "bytes", "input": [b64(b"a"), b64(b"b" * (MAX_BYTES + 1))]})
        assert big.status_code == 413 and "`input[1]` has 65 bytes; at most 64" in big.text
        bad = c.post("/v1/embeddings", json={"model": "bytes", "input": ["not base64!"]})
        assert bad.status_code == 400 and "`input[0]` is not valid base64" in bad.text
        many = c.post("/v1/embeddings", json={"model": "bytes", "input": [b64(b"x")] * 5})
        assert many.status_code == 413 and "server.max_texts" in many.text
        tokenize = c.post("/tokenize", json={"inputs": "abc"})            # a text-only route: refused, not a 500
        assert tokenize.status_code == 400 and "is a bytes model; this route needs an embedding model" in tokenize.text
