"""The scheduler's cross-request batching on a fake forward (deterministic, no model), and batched vs unbatched
results on the real models of all four families."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from rsinfer_cli.config import ModelConfig
from rsinfer_cli.engine.model import load_model
from rsinfer_cli.engine.scheduler import Scheduler
from rsinfer_cli.errors import InferenceError, PoolTimeout, Saturated
from rsinfer_cli.pipelines import build_pipeline

SERVE_MODES = ("single", "workers")  # every test here also runs against the front-end/engine split


class FakeForward:
    """Records each forward's row lengths; answers each row with the sum of its ids; can hold or fail."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Semaphore(0)
        self.poison: int | None = None

    def __call__(self, session, ids):
        self.calls.append([len(r) for r in ids])
        self.entered.release()
        assert self.hold.wait(10)
        if self.poison is not None and any(self.poison in r for r in ids):
            raise InferenceError("poisoned row")
        if any(-1 in r for r in ids):
            raise Saturated("typed error from the forward")
        return [sum(r) for r in ids]


def rows(*lengths: int, start: int = 1) -> list[list[int]]:
    return [[start + i] * n for i, n in enumerate(lengths)]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


class Recorder:
    """The scheduler's observer: every forward's (rows, padded tokens) and every request's wait."""

    def __init__(self) -> None:
        self.forwards: list[tuple[int, int]] = []
        self.waits: list[float] = []

    def forward(self, rows, padded, seconds):
        self.forwards.append((rows, padded))

    def waited(self, seconds):
        self.waits.append(seconds)


class Batcher(Scheduler):
    """A batching scheduler over `workers` fake sessions; `submit(rows)` → (outputs, seconds waited)."""

    def __init__(self, fake, *, workers=2, max_rows=64, max_tokens=8192, queue_rows=1024, queue_timeout_s=5):
        self.rec = Recorder()
        super().__init__("m", [f"s{i}" for i in range(workers)], fake, EXECUTOR, batching=True, max_rows=max_rows,
                         max_tokens=max_tokens, queue_rows=queue_rows, queue_timeout_s=queue_timeout_s,
                         max_queue=1024, observer=self.rec)

    async def submit(self, ids):
        out = await super().submit(ids, [len(r) for r in ids], list)
        return out, (self.rec.waits[-1] if self.rec.waits else 0.0)

    def hold_replicas(self):
        """No idle replica until `release_replicas`: requests build a backlog."""
        self._held, self.lanes.idle = self.lanes.idle, []

    def release_replicas(self):
        self.lanes.idle = self._held
        self._dispatch()


async def make(fake, **kw) -> Batcher:
    return Batcher(fake, **kw)


EXECUTOR = ThreadPoolExecutor(max_workers=4)


async def wait_entered(fake: FakeForward, n: int) -> None:
    for _ in range(n):
        assert await asyncio.get_running_loop().run_in_executor(None, fake.entered.acquire, True, 10)


def test_lone_row_is_dispatched_at_once():
    async def main():
        fake = FakeForward()
        b = await make(fake)
        out, waited = await b.submit(rows(5))
        b.stop()
        return fake.calls, out, waited

    calls, out, waited = run(main())
    assert calls == [[5]] and out == [5] and waited < 1  # nothing else arrived, and it did not wait for more


def test_outputs_come_back_in_each_requests_order():
    async def main():
        fake = FakeForward()
        b = await make(fake, max_rows=3)
        jobs = [rows(9, 1, 5, start=10), rows(2, 7, start=20), rows(4, start=30)]
        results = await asyncio.gather(*(b.submit(j) for j in jobs))
        b.stop()
        return [r[0] for r in results]

    assert run(main()) == [[90, 11, 60], [40, 147], [120]]


def test_backlog_is_sorted_and_split_per_idle_replica():
    """rs-infer's split: lengths [3,3,4,10,10] over 2 idle replicas (share 3) and 20 padded tokens → [3, 2]."""
    async def main():
        fake = FakeForward()
        b = Batcher(fake, workers=2, max_rows=64, max_tokens=20, queue_rows=64, queue_timeout_s=5)
        b.hold_replicas()  # no idle replica yet: build a backlog first
        tasks = [asyncio.create_task(b.submit(rows(n))) for n in (10, 3, 10, 4, 3)]
        await asyncio.sleep(0)
        assert b.queued_rows == 5
        b.release_replicas()
        results = await asyncio.gather(*tasks)
        return fake.calls, results

    calls, results = run(main())
    assert sorted(calls) == [[3, 3, 4], [10, 10]]
    assert [r[0] for r in results] == [[10], [3], [10], [4], [3]]


@pytest.mark.parametrize(("lengths", "idle", "max_rows", "budget", "expected"), [
    ([1, 1, 1, 1, 1], 3, 2, 100, [[1, 1], [1, 1], [1]]),   # share = min(ceil(5/3), max_rows) = 2
    ([2, 50], 2, 64, 20, [[2], [50]]),                     # a single over-budget row runs alone
])
def test_more_splits(lengths, idle, max_rows, budget, expected):
    async def main():
        fake = FakeForward()
        b = Batcher(fake, workers=idle, max_rows=max_rows, max_tokens=budget, queue_rows=64, queue_timeout_s=5)
        b.hold_replicas()
        tasks = [asyncio.create_task(b.submit(rows(n))) for n in lengths]
        await asyncio.sleep(0)
        b.release_replicas()
        await asyncio.gather(*tasks)
        return fake.calls

    assert sorted(run(main())) == sorted(expected)


def test_admission_is_all_or_none():
    async def main():
        fake = FakeForward()
        fake.hold.clear()
        b = await make(fake, workers=1, max_rows=1, queue_rows=3)
        first = asyncio.create_task(b.submit(rows(1)))       # runs (holds the only worker)
        await wait_entered(fake, 1)
        second = asyncio.create_task(b.submit(rows(1, 1)))   # queued: 2 of 3 rows
        await asyncio.sleep(0)
        with pytest.raises(Saturated, match="2 rows queued; 2 more do not fit"):
            await b.submit(rows(1, 1))
        assert b.queued_rows == 2  # none of the refused request's rows were queued
        fake.hold.set()
        await asyncio.gather(first, second)
        b.stop()

    run(main())


def test_failed_forward_fails_only_its_callers_with_their_error():
    async def main():
        fake = FakeForward()
        b = await make(fake, workers=2, max_rows=1)
        fake.poison = 99
        ok, bad, typed = await asyncio.gather(b.submit(rows(3)), b.submit([[99, 99]]), b.submit([[-1]]),
                                              return_exceptions=True)
        b.stop()
        return ok, bad, typed

    ok, bad, typed = run(main())
    assert ok[0] == [3]
    assert isinstance(bad, InferenceError) and "poisoned" in str(bad)
    assert isinstance(typed, Saturated)  # the error kind survives: it maps to its own status


def test_caller_that_goes_away_has_its_rows_dropped():
    async def main():
        fake = FakeForward()
        fake.hold.clear()
        b = await make(fake, workers=1, max_rows=8)
        holder = asyncio.create_task(b.submit(rows(1)))
        await wait_entered(fake, 1)
        gone = asyncio.create_task(b.submit(rows(7, 7)))
        stays = asyncio.create_task(b.submit(rows(5)))
        await asyncio.sleep(0)
        gone.cancel()
        fake.hold.set()
        result = await stays
        await holder
        b.stop()
        return fake.calls, result, gone.cancelled()

    calls, result, cancelled = run(main())
    assert cancelled and result[0] == [5]
    assert [7, 7] not in calls and all(7 not in c for c in calls)


def test_rows_waiting_too_long_get_a_timeout():
    async def main():
        fake = FakeForward()
        fake.hold.clear()
        b = await make(fake, workers=1, queue_timeout_s=0.05)
        holder = asyncio.create_task(b.submit(rows(1)))
        await wait_entered(fake, 1)
        with pytest.raises(PoolTimeout, match="timed out after 50 ms in the queue"):
            await b.submit(rows(2))
        fake.hold.set()
        await holder
        b.stop()
        return fake.calls

    assert run(main()) == [[1]]  # the expired row never ran


def test_request_larger_than_the_queue_runs_alone_in_slices():
    async def main():
        fake = FakeForward()
        fake.hold.clear()
        b = await make(fake, workers=1, max_rows=3, queue_rows=4)
        holder = asyncio.create_task(b.submit(rows(1, start=50)))  # the replica is busy: no shortcut
        await wait_entered(fake, 1)
        big = asyncio.create_task(b.submit(rows(5, 1, 4, 2, 3, 6, 7, 1, 2, 3)))  # 10 rows > the queue's 4
        await asyncio.sleep(0)
        assert b.queued_rows == 0 and b.waiting == 1  # queued as one direct job, not as rows
        fake.hold.set()
        await holder
        out, _ = await big
        b.stop()
        return fake.calls, out

    calls, out = run(main())
    assert out == [(1 + i) * n for i, n in enumerate([5, 1, 4, 2, 3, 6, 7, 1, 2, 3])]  # in the request's order
    assert calls == [[1], [1, 1, 2], [2, 3, 3], [4, 5, 6], [7]]  # max_rows slices, shortest first


def test_concurrent_requests_share_forwards():
    async def main():
        fake = FakeForward()
        fake.hold.clear()
        b = await make(fake, workers=1)
        first = asyncio.create_task(b.submit(rows(4)))
        await wait_entered(fake, 1)
        rest = [asyncio.create_task(b.submit(rows(4))) for _ in range(10)]
        await asyncio.sleep(0)
        fake.hold.set()
        await asyncio.gather(first, *rest)
        b.stop()
        return fake.calls

    calls = run(main())
    assert calls[0] == [4] and calls[1] == [4] * 10  # the ten that queued meanwhile ran as one forward


# ---------------------------------------------------------------- real models


def batched(pipe, works, max_rows=4, max_tokens=512):
    """Run the works concurrently through a batching scheduler (small chunks, so rows of different requests
    mix)."""
    async def main():
        b = Scheduler("m", pipe.model.sessions, pipe.forward, EXECUTOR, batching=True, max_rows=max_rows,
                      max_tokens=max_tokens, queue_rows=1024, queue_timeout_s=30)
        outs = await asyncio.gather(*(b.submit(w.rows, w.costs, w.finish) for w in works))
        b.stop()
        return outs

    return asyncio.run(asyncio.wait_for(main(), 120))


@pytest.mark.shared
class TestSameAsUnbatched:
    def pipe(self, shared_models, folder, kind):
        return build_pipeline(load_model(ModelConfig(name="m", kind=kind, path=str(shared_models / folder),
                                                     replicas=2)))

    def test_embedding(self, shared_models):
        pipe = self.pipe(shared_models, "all-minilm-l6-v2", "embedding")
        texts = [["hello world"], ["a much longer sentence about printing presses and ink", "b"], ["x"] * 5]
        together = batched(pipe, [pipe.plan(t) for t in texts])
        for t, res in zip(texts, together, strict=True):
            assert np.abs(res.vectors - pipe.embed(t).vectors).max() <= 1e-5

    def test_rerank(self, shared_models):
        pipe = self.pipe(shared_models, "tiny-reranker-2", "rerank")
        reqs = [("q one", ["doc a", "a longer document b", "c"]), ("second query", ["d", "e e e e e"])]
        together = batched(pipe, [pipe.plan_rerank(q, d) for q, d in reqs])
        for (q, d), res in zip(reqs, together, strict=True):
            assert np.abs(res.scores - pipe.rerank(q, d).scores).max() <= 1e-6

    def test_pii_windows(self, shared_models):
        pipe = self.pipe(shared_models, "rampart-pii", "pii")
        texts = [["My name is Alex Rivera"], ["lorem " * 700 + "mail john.smith@example.com", "short"]]
        together = batched(pipe, [pipe.plan_detect(t) for t in texts], max_tokens=4096)
        for t, res in zip(texts, together, strict=True):
            assert res.entities == pipe.detect(t).entities

    def test_zeroshot_and_true_false(self, shared_models):
        pipe = self.pipe(shared_models, "tiny-nli", "zeroshot")
        works = [pipe.plan_classify(["a text about sports"], ["sports", "cooking", "politics"]),
                 pipe.plan_true_false(["the server is down", "lunch"], "This is urgent.")]
        zs, tf = batched(pipe, works)
        direct = pipe.classify(["a text about sports"], ["sports", "cooking", "politics"]).results[0]
        assert zs.results[0].labels == direct.labels
        assert np.allclose(zs.results[0].scores, direct.scores, atol=1e-6)
        direct_tf = pipe.true_false(["the server is down", "lunch"], "This is urgent.").results
        assert [r.true_probability for r in tf.results] == pytest.approx([r.true_probability for r in direct_tf],
                                                                         abs=1e-6)


@pytest.mark.shared
def test_request_larger_than_the_queue_takes_the_direct_path(shared_models, serve_mode):
    import httpx

    from rsinfer_cli.config import parse_config

    from serverutil import ServerThread

    cfg = parse_config({"models": [{"name": "r", "kind": "rerank", "path": str(shared_models / "tiny-reranker-1"),
                                    "replicas": 1, "batching": {"max_rows": 3, "queue_rows": 4}}]})
    docs = [f"document number {i} " * (i + 1) for i in range(10)]
    with ServerThread(cfg, mode=serve_mode) as srv:
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            big = c.post("/v1/rerank", json={"query": "q", "documents": docs}).json()
            small = c.post("/v1/rerank", json={"query": "q", "documents": docs[:3]}).json()
        direct = srv.pipelines["r"].rerank("q", docs).scores
    assert {r["index"]: r["relevance_score"] for r in big["results"]} == \
        pytest.approx({i: float(s) for i, s in enumerate(direct)}, abs=1e-6)
    assert len(small["results"]) == 3
