"""The Runtime: the engine as one object that every front door builds and uses (serve, the worker processes, the
one-shot CLI), and the core's synchronous path with its cache."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from rsinfer_cli.config import parse_config
from rsinfer_cli.engine.model import load_model
from rsinfer_cli.engine.registry import Registry
from rsinfer_cli.runtime import Runtime
from rsinfer_cli.runtime.record import RequestRecord

import synth


def _config(tmp_path, cache: dict | None):
    root = synth.write_model_dir(tmp_path / "m")
    server = {"cache": cache} if cache is not None else {}
    return parse_config({"server": server, "models": [{"name": "m", "kind": "embedding", "path": str(root),
                                                       "replicas": 1}]})


def _counting(runtime: Runtime) -> list[int]:
    """Rows each forward of the model ran, from now on."""
    pipe = runtime.pipelines["m"]
    seen: list[int] = []
    forward = pipe.forward

    def counted(session, rows):
        seen.append(len(rows))
        return forward(session, rows)

    pipe.forward = counted  # type: ignore[method-assign]
    return seen


def test_one_shot_runs_through_the_core_and_its_cache(tmp_path):
    cfg = _config(tmp_path, {"backend": "memory"})
    model = load_model(cfg.models[0], cfg.server)
    rt = Runtime.one_shot(model, cfg.server).start()
    assert rt.queues == {}                     # no queue: the rows run here, on the first replica
    seen = _counting(rt)
    pipe = rt.pipelines["m"]
    first = rt.core.run(RequestRecord(), model, pipe.plan, ["hello world", "cat", "hello world"])
    assert sum(seen) == 2                      # a text repeated within a request runs once
    again = rt.core.run(RequestRecord(), model, pipe.plan, ["cat", "hello world", "dog"])
    assert sum(seen) == 3                      # only "dog" was not in the cache
    np.testing.assert_allclose(again.vectors[0], first.vectors[1], rtol=0, atol=0)
    np.testing.assert_allclose(again.vectors[1], first.vectors[0], rtol=0, atol=0)
    fresh = rt.pipelines["m"].run(pipe.plan(["dog"]))    # the uncached direct path computes the same vector
    np.testing.assert_allclose(again.vectors[2], fresh.vectors[0], rtol=1e-6, atol=1e-6)


def test_one_shot_without_a_cache_runs_every_row(tmp_path):
    cfg = _config(tmp_path, None)
    model = load_model(cfg.models[0], cfg.server)
    rt = Runtime.one_shot(model, cfg.server).start()
    assert rt.cache is None
    seen = _counting(rt)
    rt.core.run(RequestRecord(), model, rt.pipelines["m"].plan, ["a"])
    rt.core.run(RequestRecord(), model, rt.pipelines["m"].plan, ["a"])
    assert sum(seen) == 2


def test_lifecycle(tmp_path):
    cfg = _config(tmp_path, {"backend": "memory"})
    rt = Runtime(cfg, Registry.load(cfg))
    with pytest.raises(RuntimeError, match=r"start\(\) was not called"):
        _ = rt.core
    assert rt.cache is None                    # opened by start, not by building
    assert rt.start() is rt.start()            # once
    core, cache = rt.core, rt.cache
    assert cache is not None and rt.start().core is core

    async def serve_and_close() -> list[float]:
        model = rt.registry.models["m"]
        res = await rt.core.infer(RequestRecord(), model, rt.pipelines["m"].plan, ["x y"])
        drained = asyncio.get_running_loop().create_future()
        rt.draining.append(drained)
        asyncio.get_running_loop().call_later(0.05, drained.set_result, None)
        await rt.drain()                       # waits for the front doors' drains
        assert drained.done()
        await rt.close()
        return res.vectors[0].tolist()

    vec = asyncio.run(serve_and_close())
    assert len(vec) == synth.DIM
    assert rt.infer_executor._shutdown and rt.prep_executor._shutdown
