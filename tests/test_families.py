"""The family registry: a toy family declared in this file alone (no edit of src/) is validated by the config,
loaded, and served over HTTP through the scheduler, batched and unbatched; and what the registry decides for the
built-in families (served kinds, kind-specific config keys, recognising a folder)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import httpx
import msgspec
import numpy as np
import pytest
from aiohttp import web

from rsinfer_cli import families
from rsinfer_cli.config import parse_config
from rsinfer_cli.engine.session import Session
from rsinfer_cli.errors import ConfigError
from rsinfer_cli.pipelines.base import RowPipeline, Work
from rsinfer_cli.server.routes.common import begin, json_response

from serverutil import ServerThread, forwards

SERVE_MODES = ("single", "workers")  # every test here also runs against the front-end/engine split

# ---------------------------------------------------------------- the toy family: "add one" over 4-vectors


class ToyPipeline(RowPipeline):
    """Rows are 4-float vectors; a forward stacks them, runs the graph, and hands each row its output row."""

    kind = "toy"

    def forward(self, session: Session, rows: Sequence[Any]) -> list[Any]:
        out = self.model.run(session, {"INPUT0": np.asarray(rows, dtype=np.float32)})["OUTPUT0"]
        return [row.tolist() for row in out]

    def plan(self, vectors: list[list[float]]) -> Work[list[list[float]]]:
        return Work(rows=vectors, costs=[1] * len(vectors), finish=lambda outputs: outputs)


toy_routes = web.RouteTableDef()


class ToyRequest(msgspec.Struct, kw_only=True):
    rows: list[list[float]]
    model: str | None = None


@toy_routes.post("/toy/add-one")
async def add_one(request: web.Request) -> web.Response:
    call = await begin(request, "toy", ToyRequest)
    out = await call.infer(call.pipeline(ToyPipeline).plan, call.req.rows)
    return json_response({"rows": out, "model": call.model.name})


async def toy_hf_task(call, inputs, params):
    """The toy family's Hugging Face task: `inputs` a row of numbers as text ("1 2 3 4"), each plus one."""
    out = await call.infer(call.pipeline(ToyPipeline).plan, [[float(x) for x in inputs.split()]])
    return json_response(out)


TOY = families.Family(kind="toy", summary="adds one", pipeline=ToyPipeline, routes=toy_routes,
                      needs_tokenizer=False, bench={"/toy/add-one": lambda texts: {"rows": [[0.0] * 4] * len(texts)}},
                      hf_task=toy_hf_task, info_type="toy-adder")


@pytest.fixture
def toy():
    families.register(TOY)
    yield TOY
    families.unregister("toy")


def toy_config(shared_models, batching: bool):
    return parse_config({"models": [{"name": "adder", "kind": "toy", "replicas": 1,
                                     "path": str(shared_models / "tensor-models" / "add_one"),
                                     "batching": {"enabled": batching, "max_rows": 64}}]})


def test_unknown_until_registered(shared_models):
    with pytest.raises(ConfigError, match="models\\[0\\].kind: must be one of .*got 'toy'"):
        toy_config(shared_models, True)


@pytest.mark.shared
@pytest.mark.parametrize("batching", [True, False])
def test_toy_family_served_through_the_scheduler(toy, shared_models, batching, serve_mode):
    cfg = toy_config(shared_models, batching)
    requests = [[[float(i), float(i) + 0.5, -1.0, 2.0]] * (1 + i % 3) for i in range(24)]
    with ServerThread(cfg, mode=serve_mode) as srv:
        scheduler = srv.schedulers["adder"]
        assert scheduler.batching is batching

        async def main():
            async with httpx.AsyncClient(base_url=srv.url, timeout=30) as c:
                return await asyncio.gather(*(c.post("/toy/add-one", json={"rows": r}) for r in requests))

        answers = asyncio.run(main())
        n_forwards, n_rows = forwards(srv.url, "adder")
    for rows, resp in zip(requests, answers, strict=True):
        assert resp.status_code == 200, resp.text
        assert resp.json()["rows"] == (np.asarray(rows, dtype=np.float32) + 1).tolist()  # each caller's own rows
    assert n_rows == sum(len(r) for r in requests)  # every row went through the scheduler's forwards
    if batching:
        assert n_forwards < len(requests)  # rows of concurrent requests shared forwards
    else:
        assert n_forwards == len(requests)  # one forward per request (each fits max_rows)


@pytest.mark.shared
def test_a_family_answers_the_routes_it_serves(toy, shared_models):
    """`serves`: a model of another family whose pipeline implements the toy protocol answers the toy routes, and is
    their default when no toy model is configured; a model of a family that does not serve them is refused."""
    served = families.Family(kind="toy-server", summary="serves toy", pipeline=ToyPipeline,
                             routes=web.RouteTableDef(), needs_tokenizer=False, serves=("toy",))
    families.register(served)
    try:
        path = str(shared_models / "tensor-models" / "add_one")
        cfg = parse_config({"models": [{"name": "helper", "kind": "toy-server", "path": path},
                                       {"name": "raw", "kind": "tensor", "path": path}]})
        with ServerThread(cfg) as srv:
            default = httpx.post(f"{srv.url}/toy/add-one", json={"rows": [[1, 2, 3, 4]]}, timeout=30)
            named = httpx.post(f"{srv.url}/toy/add-one", json={"rows": [[0, 0, 0, 0]], "model": "helper"},
                               timeout=30)
            refused = httpx.post(f"{srv.url}/toy/add-one", json={"rows": [[0, 0, 0, 0]], "model": "raw"},
                                 timeout=30)
        assert default.status_code == 200 and default.json() == {"rows": [[2, 3, 4, 5]], "model": "helper"}
        assert named.json()["rows"] == [[1, 1, 1, 1]]
        assert refused.status_code == 400 and "is a tensor model but was used for a toy request" in refused.text
        assert families.answers("toy-server", "toy") and not families.answers("tensor", "toy")
    finally:
        families.unregister("toy-server")


def test_a_key_may_be_the_own_key_of_several_families():
    """Two families may each own a key (`prompts` is embedding's and sparse's): each of them takes it, any other
    kind is told which families it applies to."""
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Opts:
        pooling: str = "max"

    families.register(families.Family(kind="toy-opts", summary="pools", pipeline=ToyPipeline, options=Opts,
                                      needs_tokenizer=False))
    try:
        cfg = parse_config({"models": [{"name": "m", "kind": "toy-opts", "path": "x", "pooling": "sum"}]})
        assert cfg.models[0].options.pooling == "sum"
        assert "toy-opts" in families.specific_fields()["pooling"]
        with pytest.raises(ConfigError, match=r"models\[0\]\.pooling: applies to kind embedding and toy-opts only"):
            parse_config({"models": [{"name": "m", "kind": "rerank", "hf": "a/b", "pooling": "cls"}]})
    finally:
        families.unregister("toy-opts")


def test_served_kinds_and_bench_bodies_come_from_the_registry(toy):
    from rsinfer_cli.cli.bench import request_body

    assert {"toy", "tensor", "embedding"} <= set(families.served_kinds())
    assert request_body("/toy/add-one", "adder", ["a", "b"]) == {"rows": [[0.0] * 4] * 2, "model": "adder"}
    assert request_body("/v1/embeddings", None, ["a"]) == {"input": ["a"]}


# ---------------------------------------------------------------- built-in families


def test_every_builtin_family_is_complete():
    """Every part a family names by string resolves to what its type in `Family` says (mypy checks the parts given
    as objects; strings are checked here)."""
    import asyncio
    import dataclasses

    from aiohttp import web

    from rsinfer_cli.pipelines.base import RowPipeline
    from rsinfer_cli.server.schemas import Op

    for fam in families.all_families():
        factory = fam.pipeline_factory()     # a pipeline class, or a function choosing one (pii: GLiNER or not)
        assert callable(factory) and (not isinstance(factory, type) or issubclass(factory, RowPipeline)), fam.kind
        for _name, fn in fam.command_functions():
            assert callable(fn)
        options = fam.options_type()
        assert options is None or dataclasses.is_dataclass(options), fam.kind
        assert all(isinstance(op, Op) for op in fam.route_ops()), fam.kind
        recognise = fam.recogniser()
        assert recognise is None or callable(recognise)
        task = fam.hf_handler()
        assert task is None or asyncio.iscoroutinefunction(task), fam.kind
        routes = fam.route_table()
        if routes is not None:
            assert isinstance(routes, web.RouteTableDef)
            paths = {r.path for r in routes}
            bench = fam.bench_bodies()
            assert set(bench) <= paths, fam.kind  # every bench body is for a route of the family
            assert all(isinstance(make(["x"]), dict) for make in bench.values()), fam.kind


def test_a_part_is_a_module_attribute_or_the_object():
    assert families.load("rsinfer_cli.server.schemas:Op").__name__ == "Op"
    assert families.load(len) is len
    with pytest.raises(ValueError, match="'no colon' is not 'module:attribute'"):
        families.resolve_ref("no colon")


@pytest.mark.parametrize(("key", "kind", "owner"), [("pooling", "rerank", "embedding"),
                                                     ("threshold", "embedding", "pii"),
                                                     ("hypothesis_template", "pii", "zeroshot"),
                                                     ("scoring", "zeroshot", "rerank")])
def test_a_key_of_another_family_is_a_config_error(key, kind, owner):
    value = {"pooling": "cls", "threshold": 0.5, "hypothesis_template": "about {}", "scoring": "logit"}[key]
    with pytest.raises(ConfigError, match=rf"models\[0\]\.{key}: applies to kind {owner} only; model 'm' is "
                                          rf"kind {kind}"):
        parse_config({"models": [{"name": "m", "kind": kind, "hf": "a/b", key: value}]})


def test_text_keys_are_refused_on_a_tensor_model():
    with pytest.raises(ConfigError, match=r"models\[0\]\.max_len: applies to text models only"):
        parse_config({"models": [{"name": "t", "kind": "tensor", "path": "x", "max_len": 8}]})


@pytest.mark.parametrize(("hf_config", "has_tokenizer", "kind"), [
    ({"architectures": ["BertForTokenClassification"]}, True, "pii"),
    ({"architectures": ["DebertaV2ForSequenceClassification"], "id2label": {"0": "ENTAILMENT", "1": "x"}}, True,
     "zeroshot"),
    ({"architectures": ["BertForSequenceClassification"], "id2label": {"0": "LABEL_0"}}, True, "rerank"),
    ({"architectures": ["BertModel"]}, True, "embedding"),
    ({}, False, "tensor"),
])
def test_guess_kind(hf_config, has_tokenizer, kind):
    assert families.guess_kind(families.Folder(hf_config, has_tokenizer))[0] == kind


def test_serve_refuses_a_kind_without_routes_before_loading(tmp_path):
    """`serve` checks the kinds first: a family without routes is refused naming the model, before any load."""
    from rsinfer_cli.server.app import check_served

    families.register(families.Family(kind="routeless", summary="no routes", pipeline=ToyPipeline,
                                      needs_tokenizer=False))
    try:
        cfg = parse_config({"models": [{"name": "t", "kind": "routeless", "path": str(tmp_path / "missing")}]})
        with pytest.raises(ConfigError, match=r"models\[0\] 't' \(routeless\)"):
            check_served(cfg)
    finally:
        families.unregister("routeless")


@pytest.mark.shared
def test_the_hugging_face_route_and_info_come_from_the_registry(toy, shared_models, serve_mode):
    """A family declared outside the package (here, in this test) answers POST /models/{name} with its own task
    and names its /info type: hf.py and ops.py know no kind."""
    with ServerThread(toy_config(shared_models, True),
                      mode=serve_mode) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        r = c.post("/models/adder", json={"inputs": "1 2 3 4"})
        assert r.status_code == 200 and r.json() == [[2.0, 3.0, 4.0, 5.0]]
        assert "toy-adder" in c.get("/info").json()["model_type"]
        tags = [t["name"] for t in c.get("/openapi.json").json()["tags"]]
        assert "toy" in tags
    families.unregister("toy")
    families.register(families.Family(kind="toy", summary="no task", pipeline=ToyPipeline, routes=toy_routes,
                                      needs_tokenizer=False))
    with ServerThread(toy_config(shared_models, True),
                      mode=serve_mode) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        r = c.post("/models/adder", json={"inputs": "1 2 3 4"})
        served = ", ".join(f.kind for f in families.all_families() if f.hf_task is not None)
        assert r.status_code == 400 and f"serve {served} models" in r.json()["error"]["message"]
