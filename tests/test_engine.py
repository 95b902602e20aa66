"""Engine core: feeds from synthetic graphs, tokenizer limits, the scheduler's admission, EPs, registry."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import pytest

from rsinfer_cli.config import ModelConfig, parse_config
from rsinfer_cli.engine.batching import plan_batches
from rsinfer_cli.engine.model import effective_max_len, load_model
from rsinfer_cli.engine.registry import Registry
from rsinfer_cli.engine.scheduler import Scheduler
from rsinfer_cli.engine.session import plan_eps, sample_feeds
from rsinfer_cli.errors import (
    HubError,
    InputError,
    KindMismatch,
    ModelLoadError,
    ModelNotFound,
    PoolTimeout,
    Saturated,
)
from rsinfer_cli.pipelines.embedding import EmbeddingPipeline
from rsinfer_cli.pipelines.text import FeedBuilder, TextEncoder

import synth


def load(tmp_path: Path, model=None, **cfg) -> EmbeddingPipeline:
    """The embedding pipeline (text front end + model) of a synthetic model folder."""
    root = synth.write_model_dir(tmp_path / "m", model=model)
    return EmbeddingPipeline(load_model(ModelConfig(name="m", kind="embedding", path=str(root), replicas=1, **cfg)))


def run(m: EmbeddingPipeline, outputs: list[str], feeds: dict) -> list:
    out = m.model.run(m.model.sessions[0], feeds, outputs)
    return [out[n] for n in outputs]


class TestFeeds:
    def test_bert_style_feeds_run(self, tmp_path):
        m = load(tmp_path)
        enc = m.encoder.encode(["hello world", "the cat sat on the mat"])
        feeds = m.feeds.build(enc.ids, enc.type_ids, m.encoder.pad_id)
        assert set(feeds) == {"input_ids", "attention_mask", "token_type_ids"}
        assert feeds["input_ids"].shape == (2, 8) and feeds["input_ids"].dtype == np.int64
        assert feeds["attention_mask"].tolist() == [[1, 1, 1, 1, 0, 0, 0, 0], [1] * 8]
        out, _ = run(m, ["last_hidden_state", "mask_plus_types"], feeds)
        table = synth.embedding_table()
        assert np.allclose(out[0, :4], table[[2, 4, 5, 3]])  # [CLS] hello world [SEP]

    def test_pair_type_ids(self, tmp_path):
        m = load(tmp_path)
        enc = m.encoder.encode(["hello"], ["the cat"])
        assert enc.ids == [[2, 4, 3, 6, 7, 3]]
        assert enc.type_ids == [[0, 0, 0, 1, 1, 1]]
        feeds = m.feeds.build(enc.ids, enc.type_ids)
        (mpt,) = run(m, ["mask_plus_types"], feeds)
        assert mpt.tolist() == [[1, 1, 1, 2, 2, 2]]

    def test_position_ids_and_empty_kv_cache(self, tmp_path):
        graph = synth.embedding_graph(position_ids=True, past_layers=2)
        m = load(tmp_path, model=graph)
        expected = {f"past_key_values.{i}.{kv}" for i in (0, 1) for kv in ("key", "value")}
        assert {t.name for t in m.feeds.past} == expected
        enc = m.encoder.encode(["hello", "the cat sat"])
        feeds = m.feeds.build(enc.ids, enc.type_ids, m.encoder.pad_id)
        assert feeds["past_key_values.0.key"].shape == (2, 2, 0, 8)
        assert feeds["past_key_values.0.key"].dtype == np.float32
        positions, present = run(m, ["positions", "present.1.value"], feeds)
        assert positions.tolist() == [[0, 1, 2, 1, 1], [0, 1, 2, 3, 4]]  # cumsum(mask)-1, pads at 1
        assert present.tolist() == [2, 2, 0, 8]

    def test_unfillable_input_is_a_load_error_listing_inputs(self, tmp_path):
        graph = synth.embedding_graph(extra_input="pixel_values")
        with pytest.raises(ModelLoadError) as info:
            load(tmp_path, model=graph)
        msg = str(info.value)
        assert "graph input 'pixel_values' cannot be filled" in msg
        assert "input_ids (int64), attention_mask (int64), token_type_ids (int64), pixel_values (int64)" in msg

    def test_symbolic_kv_heads_is_a_load_error(self, tmp_path):
        graph = synth.embedding_graph(past_layers=1)
        for inp in graph.graph.input:
            if inp.name.startswith("past_key_values"):
                inp.type.tensor_type.shape.dim[1].dim_param = "heads"
        with pytest.raises(ModelLoadError, match="kv_heads"):
            load(tmp_path, model=graph)

    def test_int32_graph_inputs(self, tmp_path):
        graph = synth.embedding_graph()
        for node in graph.graph.input:
            node.type.tensor_type.elem_type = onnx.TensorProto.INT32
        del graph.graph.node[-1]  # the int64 Add
        del graph.graph.output[-1]
        feeds = FeedBuilder(load(tmp_path, model=graph).model.graph).build([[2, 4, 3]], [[0, 0, 0]])
        assert feeds["input_ids"].dtype == np.int32 and feeds["attention_mask"].dtype == np.int32


class TestTruncation:
    def test_cut_at_max_len_and_counted(self, tmp_path):
        m = load(tmp_path, max_len=4)
        enc = m.encoder.encode(["hello world the cat sat", "hello"])
        assert enc.ids[0] == [2, 4, 5, 3]  # specials kept
        assert enc.truncated == 1

    def test_truncate_off_is_an_input_error(self, tmp_path):
        m = load(tmp_path, max_len=4, truncate=False)
        with pytest.raises(InputError, match=r"input\[1\] has 7 tokens but max_len is 4") as info:
            m.encoder.encode(["hello", "hello world the cat sat"])
        assert info.value.param == "input[1]"

    def test_pair_truncation_cuts_the_second(self, tmp_path):
        m = load(tmp_path, max_len=6)
        enc = m.encoder.encode(["hello world"], ["the cat sat on the mat"], strategy="only_second")
        assert enc.ids == [[2, 4, 5, 3, 6, 3]]

    def test_tokenizer_presets_are_cleared(self, tmp_path, shared_models):
        enc = TextEncoder(shared_models / "all-minilm-l6-v2" / "tokenizer.json", 256)
        out = enc.encode(["word " * 300, "short"])
        assert enc.tokenizer.padding is None
        assert [len(r) for r in out.ids] == [256, 3]  # the file's preset says 128 and pads to 128

    def test_effective_max_len(self):
        assert effective_max_len(100, {}) == (100, "max_len in config")
        assert effective_max_len(None, {"sentence_bert_config.json": {"max_seq_length": 256},
                                        "tokenizer_config.json": {"model_max_length": 512}})[0] == 256
        assert effective_max_len(None, {"tokenizer_config.json": {"model_max_length": 10**30},
                                        "config.json": {"max_position_embeddings": 514,
                                                        "model_type": "xlm-roberta"}}) == \
            (512, "config.json max_position_embeddings")
        assert effective_max_len(None, {}) == (None, "no limit known")


class Held:
    """A direct job's body that holds its replica until released; records the peak of concurrent jobs."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)
        self.active = self.peak = 0
        self.lock = threading.Lock()

    def __call__(self, runner):
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        self.entered.release()
        self.release.wait(5)
        with self.lock:
            self.active -= 1
        return runner.session


EXECUTOR = ThreadPoolExecutor(max_workers=4)


def scheduler(sessions=("s1",), **kw) -> Scheduler:
    opts = {"batching": False, "max_rows": 8, "max_tokens": 512, "max_queue": 4, "queue_timeout_s": 5}
    opts.update(kw)
    return Scheduler("m", list(sessions), lambda session, rows: rows, EXECUTOR, **opts)


async def settled(s: Scheduler) -> None:
    """Until every replica is back (a replica returns as its thread ends, just after the answer); bounded."""
    for _ in range(100):
        if s.running == 0:
            return
        await asyncio.sleep(0.01)


async def entered(held: Held, n: int = 1) -> None:
    for _ in range(n):
        assert await asyncio.get_running_loop().run_in_executor(None, held.entered.acquire, True, 5)


class TestAdmission:
    def test_saturated_when_waiter_budget_spent(self):
        async def main():
            s, held = scheduler(max_queue=1), Held()
            first = asyncio.create_task(s.run(held))
            await entered(held)
            second = asyncio.create_task(s.run(held))
            await asyncio.sleep(0)
            assert s.waiting == 1
            with pytest.raises(Saturated, match="saturated"):
                await s.run(held)
            held.release.set()
            await asyncio.gather(first, second)
            await settled(s)
            assert s.waiting == 0 and s.running == 0

        asyncio.run(asyncio.wait_for(main(), 10))

    def test_timeout_while_waiting(self):
        async def main():
            s, held = scheduler(queue_timeout_s=0.05), Held()
            first = asyncio.create_task(s.run(held))
            await entered(held)
            t0 = time.monotonic()
            with pytest.raises(PoolTimeout, match="timed out after 50 ms in the queue"):
                await s.run(held)
            assert time.monotonic() - t0 >= 0.05
            held.release.set()
            await first
            assert s.waiting == 0

        asyncio.run(asyncio.wait_for(main(), 10))

    def test_each_waiting_job_times_out_at_its_own_deadline_with_one_timer(self):
        async def main():
            s, held = scheduler(queue_timeout_s=0.2, max_queue=8), Held()
            first = asyncio.create_task(s.run(held))          # holds the one replica: the rest wait
            await entered(held)
            loop = asyncio.get_running_loop()
            ended: dict[str, float] = {}

            async def waiter(name: str) -> None:
                with pytest.raises(PoolTimeout, match="timed out after 200 ms in the queue"):
                    await s.run(held)
                ended[name] = loop.time()

            t0 = loop.time()
            early = asyncio.create_task(waiter("early"))
            await asyncio.sleep(0.1)
            late = asyncio.create_task(waiter("late"))
            await asyncio.sleep(0)
            assert s.admission.expiry is not None and s.waiting == 2   # one timer for both, armed for the oldest
            await asyncio.gather(early, late)
            assert ended["early"] - t0 >= 0.2                   # not before its own 200 ms
            assert ended["early"] < ended["late"]               # at its own deadline, not the later job's
            assert ended["late"] - t0 >= 0.3                    # 200 ms after it came, not when the first expired
            assert s.waiting == 0
            held.release.set()
            await first                                          # the job that started never expires
            s.stop()
            assert s.admission.expiry is None

        asyncio.run(asyncio.wait_for(main(), 10))

    def test_replica_returns_after_exception(self):
        async def main():
            s = scheduler(sessions=("s1", "s2"), max_queue=0)

            def boom(runner):
                raise RuntimeError("boom")

            with pytest.raises(RuntimeError, match="boom"):
                await s.run(boom)
            await settled(s)
            assert len(s.lanes.idle) == 2 and s.running == 0

        asyncio.run(asyncio.wait_for(main(), 10))

    def test_zero_queue_rejects_at_once_when_busy(self):
        async def main():
            s, held = scheduler(max_queue=0), Held()
            first = asyncio.create_task(s.run(held))
            await entered(held)
            with pytest.raises(Saturated):
                await s.run(held)
            held.release.set()
            await first

        asyncio.run(asyncio.wait_for(main(), 10))

    def test_concurrency_never_exceeds_replicas(self):
        async def main():
            s, held = scheduler(sessions=("a", "b"), max_queue=64), Held()
            held.release.set()
            used = await asyncio.gather(*(s.run(held) for _ in range(16)))
            return held.peak, set(used)

        peak, used = asyncio.run(asyncio.wait_for(main(), 10))
        assert peak <= 2 and used <= {"a", "b"}


class TestEps:
    def test_cpu_always_last_and_missing_skipped(self):
        cfg = ModelConfig(name="m", kind="embedding", hf="a/b", eps=("tensorrt", "cuda", "cpu"), device_id=1,
                          trt_engine_cache="/tmp/trt")
        plan = plan_eps(cfg, ["CUDAExecutionProvider", "CPUExecutionProvider"])
        assert plan.resolved == ("cuda", "cpu")
        assert plan.skipped[0][0] == "tensorrt" and "not in this onnxruntime build" in plan.skipped[0][1]
        assert plan.options[0] == {"device_id": 1}
        plan = plan_eps(cfg, ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"])
        assert plan.resolved == ("tensorrt", "cuda", "cpu")
        assert plan.options[0]["trt_engine_cache_path"] == "/tmp/trt"

    def test_cpu_appended_when_not_listed(self):
        cfg = ModelConfig(name="m", kind="embedding", hf="a/b", eps=("coreml",), coreml_compute_units="cpu_and_ne")
        plan = plan_eps(cfg, ["CoreMLExecutionProvider", "CPUExecutionProvider"])
        assert plan.resolved == ("coreml", "cpu")
        assert plan.options[0] == {"MLComputeUnits": "CPUAndNeuralEngine"}

    def test_skipped_ep_logged_and_reported(self, tmp_path, caplog):
        m = load(tmp_path, eps=("cuda", "cpu"))
        assert m.model.providers == ["cpu"]
        assert "execution provider cuda skipped" in caplog.text


class TestRegistry:
    def config(self, tmp_path: Path, models: list[dict]):
        root = synth.write_model_dir(tmp_path / "m")
        return parse_config({"models": [{"path": str(root), "replicas": 1, **m} for m in models]})

    def test_loads_all_and_picks_defaults(self, tmp_path):
        reg = Registry.load(self.config(tmp_path, [{"name": "a", "kind": "embedding"},
                                                   {"name": "b", "kind": "embedding", "default": True},
                                                   {"name": "r", "kind": "rerank"}]))
        assert list(reg.models) == ["a", "b", "r"]
        assert reg.get(None, "embedding").name == "b"
        assert reg.get(None, "rerank").name == "r"
        assert reg.get("a", "embedding").name == "a"
        with pytest.raises(ModelNotFound, match="model 'zz' not found"):
            reg.get("zz", "embedding")
        with pytest.raises(KindMismatch, match="'r' is a rerank model but was used for an embedding request"):
            reg.get("r", "embedding")
        with pytest.raises(InputError, match="no default pii model configured"):
            reg.get(None, "pii")

    def test_no_default_among_several(self, tmp_path):
        reg = Registry.load(self.config(tmp_path, [{"name": "a", "kind": "embedding"},
                                                   {"name": "b", "kind": "embedding"}]))
        with pytest.raises(InputError, match=r"\(several are configured \(a, b\)\); specify `model`"):
            reg.get(None, "embedding")

    def test_any_failure_stops_startup_naming_each(self, tmp_path):
        cfg = self.config(tmp_path, [{"name": "ok", "kind": "embedding"}])
        bad = parse_config({"models": [{"name": "ok", "kind": "embedding", "path": cfg.models[0].path},
                                       {"name": "gone", "kind": "embedding", "path": str(tmp_path / "nope")},
                                       {"name": "broken", "kind": "embedding", "path": cfg.models[0].path,
                                        "file": "onnx/missing.onnx"}]})
        with pytest.raises(HubError) as info:       # both are files not there: exit 4, as a one-shot command says
            Registry.load(bad)
        msg = str(info.value)
        assert msg.startswith("failed to load 2 model(s):")
        assert "model 'gone' (models[1]): model folder" in msg
        assert "model 'broken' (models[2]): `file: onnx/missing.onnx`" in msg
        corrupt = tmp_path / "corrupt"
        synth.write_model_dir(corrupt)
        (corrupt / "onnx" / "model.onnx").write_bytes(b"not a graph")
        mixed = parse_config({"models": [{"name": "gone", "kind": "embedding", "path": str(tmp_path / "nope")},
                                         {"name": "corrupt", "kind": "embedding", "path": str(corrupt)}]})
        with pytest.raises(ModelLoadError, match="failed to load 2 model"):
            Registry.load(mixed)

    def test_replicas_and_budget_from_config(self, tmp_path):
        from rsinfer_cli.server.app import create_app

        root = synth.write_model_dir(tmp_path / "m")
        cfg = parse_config({"server": {"max_queue": 7, "queue_timeout_ms": 1500},
                            "models": [{"name": "m", "kind": "embedding", "path": str(root), "replicas": 2}]})
        from rsinfer_cli.runtime import Runtime
        from rsinfer_cli.server.metrics import Metrics

        app = create_app(Runtime(cfg, Registry.load(cfg), Metrics()))
        from rsinfer_cli.server.routes.common import STATE

        s = app[STATE].runtime.queues["m"]
        assert (s.replicas, s.admission.max_queue, s.admission.queue_timeout_s) == (2, 7, 1.5)


class TestTensorModel:
    def test_graph_without_tokenizer_loads_and_runs(self, shared_models):
        m = load_model(ModelConfig(name="t", kind="tensor", path=str(shared_models / "tensor-models" / "add_one"),
                                   replicas=1))
        assert m.resolved.tokenizer_path is None
        assert [(t.name, t.dtype) for t in m.graph.inputs] == [("INPUT0", "float32")]
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        assert m.run(m.sessions[0], {"INPUT0": x})["OUTPUT0"].tolist() == (x + 1).tolist()

    def test_a_cpu_session_runs_without_the_wrapper_and_answers_as_it_does(self, shared_models, monkeypatch):
        """On the CPU provider alone a session's run goes straight to ORT's C++ session: the same outputs as the
        wrapper's run, all of them by default, and a missing or unknown input still refused (by ORT itself), as an
        InferenceError of the model. With another provider planned first the session is ORT's own."""
        import onnxruntime as ort

        from rsinfer_cli.engine import session as session_module
        from rsinfer_cli.engine.session import EpPlan, build_session
        from rsinfer_cli.errors import InferenceError

        folder = shared_models / "tensor-models" / "add_one"
        m = load_model(ModelConfig(name="t", kind="tensor", path=str(folder), replicas=1))
        session = m.sessions[0]
        assert type(session).__name__ == "CpuSession" and session.run is not None
        assert type(session).run is not ort.InferenceSession.run
        plain = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        for names in (None, ["OUTPUT0"]):
            (ours,), (theirs,) = session.run(names, {"INPUT0": x}), plain.run(names, {"INPUT0": x})
            np.testing.assert_array_equal(ours, theirs)
        with pytest.raises(InferenceError, match="Missing Input: INPUT0"):
            m.run(session, {})
        with pytest.raises(InferenceError, match="Invalid input name: nope"):
            m.run(session, {"INPUT0": x, "nope": x})
        cfg = ModelConfig(name="t", kind="tensor", path=str(folder), replicas=1)
        assert "AzureExecutionProvider" in ort.get_available_providers()     # (in onnxruntime's CPU wheels)
        monkeypatch.setitem(session_module.PROVIDERS, "azure", "AzureExecutionProvider")
        other = build_session(folder / "model.onnx", cfg, EpPlan(("azure",), ("azure", "cpu"), (), ({}, {})), 1)
        assert type(other) is ort.InferenceSession

    def test_text_kind_still_needs_a_tokenizer(self, shared_models):
        from rsinfer_cli.errors import HubError

        with pytest.raises(HubError, match="tokenizer.json not found"):
            load_model(ModelConfig(name="t", kind="embedding",
                                   path=str(shared_models / "tensor-models" / "add_one"), replicas=1))

    def test_sample_feeds_follow_the_signature(self, tmp_path):
        graph = synth.embedding_graph(position_ids=True, past_layers=1)
        m = load(tmp_path, model=graph).model
        feeds = sample_feeds(m.graph, {"sequence_length": 5})
        assert feeds["input_ids"].shape == (1, 5)
        assert feeds["past_key_values.0.key"].shape == (1, 2, 0, 8)


@pytest.mark.parametrize(("lengths", "rows", "tokens", "expected"), [
    ([5, 1, 9, 3, 7], 2, 10_000, [[1, 3], [0, 4], [2]]),   # rs-infer's direct-path test
    ([3, 3, 4, 10, 10], 4, 20, [[0, 1, 2], [3, 4]]),
    ([1, 1, 1, 1, 1], 2, 100, [[0, 1], [2, 3], [4]]),
    ([2, 50], 8, 20, [[0], [1]]),
    ([], 4, 100, []),
])
def test_plan_batches(lengths, rows, tokens, expected):
    assert plan_batches(lengths, rows, tokens) == expected


def test_padding_limit_starts_a_new_batch():
    # 3 short rows, then a row 20 tokens longer: 3 x 20 = 60 padding tokens > 16 → a new batch
    assert plan_batches([5, 5, 6, 26, 27], 64, 8192, max_padding=16) == [[0, 1, 2], [3, 4]]
    assert plan_batches([5, 5, 6, 26, 27], 64, 8192) == [[0, 1, 2, 3, 4]]
    assert plan_batches([3, 3, 4, 10, 10], 4, 20, max_padding=16) == [[0, 1, 2], [3, 4]]  # rs-infer's split holds


class TestInlineForwards:
    """A model whose forwards take a few µs runs its direct requests on the event loop (a thread hop costs more);
    one whose forwards are slower keeps them on worker threads, and a model that turns slow goes back to them."""

    def test_tiny_forwards_move_to_the_loop_and_slow_ones_back(self):
        """Judged on a clock the test moves (a forward's measured time is its `delay`, whatever the machine), with a
        line at 50 ms: far above any real forward here, far below the 1 s a slow one is made to take."""
        import threading
        import time as _time
        import types

        from rsinfer_cli.engine import scheduler as sched
        from rsinfer_cli.engine.scheduler import Tunables
        from rsinfer_cli.engine.scheduler import runner as runner_room

        delay = [0.0]
        moved = [0.0]

        def forward(session, rows):
            moved[0] += delay[0]               # the test's clock moves on by the forward's `delay`
            return [threading.get_ident() for _ in rows]

        clock = types.SimpleNamespace(perf_counter=lambda: _time.perf_counter() + moved[0],
                                      thread_time=_time.thread_time)
        line = Tunables(inline_forward_s=0.05, spike_s=0.1)

        async def threads(s, n):
            out = []
            for _ in range(n):
                out.append(await s.run(lambda runner: runner.forward(["r"], [1])[0]))
            return out

        async def main():
            s = Scheduler("m", ["s1"], forward, EXECUTOR, batching=False, max_rows=8, max_tokens=512, max_queue=4,
                          queue_timeout_s=5, tunables=line)
            loop_thread = threading.get_ident()
            first = await threads(s, sched.INLINE_AFTER)
            assert loop_thread not in first                       # measured on worker threads first
            later = await threads(s, 5)
            assert set(later) == {loop_thread}                    # then on the loop
            delay[0] = 1.0                                        # the model turns slow: back to the threads
            slow = await threads(s, 40)
            assert slow[-1] != loop_thread
            await settled(s)
            delay[0] = 0.0
            assert (await threads(s, 60))[-1] == loop_thread      # fast again: the loop again

            def failing(runner):
                runner.forward(["r"], [1])
                raise ValueError("bad row")

            with pytest.raises(ValueError, match="bad row"):      # an error on the loop still reaches its caller
                await s.run(failing)
            assert s.running == 0 and await threads(s, 1) == [loop_thread]

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(runner_room, "time", clock)
            asyncio.run(asyncio.wait_for(main(), 20))

    def test_run_now_is_one_forward_here_with_the_queued_paths_bookkeeping(self):
        """`now()`/`run_now()` (the core's path for a tiny model's request with a lane free and nobody queued): not
        before the forwards were measured tiny; then one row is one forward on the loop's thread, with the wait and
        the forward observed, the request's timing record written and the lane given back, errors included; more
        rows run in forwards of at most max_rows."""
        import threading

        from rsinfer_cli.engine import scheduler as sched
        from rsinfer_cli.runtime.record import RequestRecord

        calls: list[tuple[int, list[str]]] = []
        seen: list[tuple] = []

        class Obs:
            def forward(self, rows, padded, seconds):
                seen.append(("forward", rows, padded, seconds >= 0))

            def waited(self, seconds):
                seen.append(("waited", seconds))

        def forward(session, rows):
            calls.append((threading.get_ident(), list(rows)))
            if "boom" in rows:
                raise RuntimeError("boom")
            return [r.upper() for r in rows]

        async def main():
            s = Scheduler("m", ["s1", "s2"], forward, EXECUTOR, batching=False, max_rows=2, max_tokens=512,
                          max_queue=4, queue_timeout_s=5, observer=Obs())
            assert not s.now()                                   # nothing measured yet: the thread hop first
            for _ in range(sched.INLINE_AFTER):
                await s.run(lambda runner: runner.forward(["r"], [1]))
            await settled(s)
            assert s.now()
            seen.clear()
            calls.clear()
            stats = RequestRecord()
            assert s.run_now(["a"], [7], ask=stats) == ["A"]
            assert calls == [(threading.get_ident(), ["a"])]     # one forward, on this (the loop's) thread
            assert seen == [("waited", 0.0), ("forward", 1, 7, True)]
            assert stats.queue_ms == 0.0 and stats.inference_ms is not None and stats.inference_ms >= 0
            assert stats.t_forward is not None and len(stats.t_forward) == 2
            assert s.running == 0 and sorted(s.lanes.idle) == ["s1", "s2"]
            with pytest.raises(RuntimeError, match="boom"):
                s.run_now(["boom"], [1])
            assert s.running == 0 and len(s.lanes.idle) == 2 and s.now()   # the lane is back after a failure
            calls.clear()
            assert s.run_now(["x", "y", "z"], [1, 1, 1]) == ["X", "Y", "Z"]
            assert [rows for _, rows in calls] == [["x", "y"], ["z"]]  # max_rows = 2: two forwards

        asyncio.run(asyncio.wait_for(main(), 20))

    def test_wall_time_inflated_off_the_loop_is_tried_on_it(self):
        """A forward that waits on a worker thread (there: the GIL a busy loop holds) but uses a few µs of CPU is
        tried on the loop, and stays there since its wall time there is its own; one that waits wherever it runs
        (a device) is tried, stays on the threads, and is tried again less and less often."""
        import threading
        import time as _time

        from rsinfer_cli.engine import scheduler as sched

        loop_thread = threading.get_ident()
        everywhere = [False]
        tried_on_loop = [0]

        def forward(session, rows):
            here = threading.get_ident() == loop_thread
            tried_on_loop[0] += here
            if everywhere[0] or not here:
                _time.sleep(0.002)          # waiting: no CPU
            return [here for _ in rows]

        async def run(s, n):
            return [await s.run(lambda runner: runner.forward(["r"], [1])[0]) for _ in range(n)]

        async def main():
            s = Scheduler("m", ["s1"], forward, EXECUTOR, batching=False, max_rows=8, max_tokens=512, max_queue=4,
                          queue_timeout_s=5)
            first = await run(s, sched.INLINE_AFTER)
            assert not any(first)                                   # 2 ms each on the threads: not tiny by wall
            later = await run(s, 8)
            assert later[0] and all(later)                          # tried on the loop at once: 2 µs there, stays
            everywhere[0] = True
            tried_on_loop[0] = 0
            slow = await run(s, 200)
            assert not slow[-1]
            # off the loop after a few (each forward there counts at most SPIKE_S in the average: 7 of 2 ms), then
            # tried at growing gaps (32, 64, 128, ... forwards), not every few
            assert 1 <= tried_on_loop[0] <= 10

        asyncio.run(asyncio.wait_for(main(), 20))

    def test_a_spike_on_the_loop_does_not_send_a_tiny_model_to_the_threads(self):
        """A forward on the loop whose wall time includes a wait for the GIL another thread held (grpc.aio's poller
        under gRPC load: 8 µs forwards measured up to 440 µs) moves the model's average by a bounded step; a model
        whose every forward there is slow still leaves the loop within a few forwards."""
        from rsinfer_cli.engine import scheduler as sched

        async def main():
            s = Scheduler("m", ["s1", "s2"], lambda session, rows: rows, EXECUTOR, batching=False, max_rows=8,
                          max_tokens=512, max_queue=4, queue_timeout_s=5)
            s._get_loop()                            # this thread is the loop's
            for _ in range(sched.INLINE_AFTER):
                s.learner.took(10e-6, 10e-6, False)        # measured tiny on worker threads
            for _ in range(50):
                s.learner.took(10e-6, 10e-6, True)         # and on the loop
            assert s.now()
            for spike in (5e-3, 1e-3):              # one long GIL wait, then another right after it
                s.learner.took(spike, spike, True)
                assert s.now(), spike
            for _ in range(30):
                s.learner.took(10e-6, 10e-6, True)
            slow = 0
            while s.now():                          # every forward 1 ms now: off the loop within a few
                s.learner.took(1e-3, 1e-3, True)
                slow += 1
                assert slow <= 10
            assert slow >= 3

        asyncio.run(asyncio.wait_for(main(), 20))

    def test_batched_rows_of_a_tiny_model_run_on_the_loop(self):
        import threading

        from rsinfer_cli.engine import scheduler as sched
        from rsinfer_cli.engine.scheduler import as_is

        async def main():
            s = Scheduler("m", ["s1", "s2"], lambda session, rows: [threading.get_ident() for _ in rows], EXECUTOR,
                          batching=True, max_rows=8, max_tokens=512, max_queue=64, queue_timeout_s=5)
            loop_thread = threading.get_ident()
            first = [await s.submit(["a", "b"], [1, 1], as_is) for _ in range(sched.INLINE_AFTER)]   # one forward each
            assert loop_thread not in first[0]                  # measured on worker threads first
            await settled(s)
            later = await asyncio.gather(*(s.submit(["a", "b", "c"], [1, 2, 3], as_is) for _ in range(10)))
            assert {t for out in later for t in out} == {loop_thread} and all(len(out) == 3 for out in later)
            assert s.running == 0 and s.queued_rows == 0

        asyncio.run(asyncio.wait_for(main(), 20))

    def test_a_model_judged_by_its_cpu_time_stays_on_the_loop_through_waits(self):
        """A model whose forwards compute on their caller's thread (`cpu_clock`) is judged by that thread's CPU
        time: forwards on the loop that wait without computing (the thread preempted, or waiting for the GIL) keep
        it there however long they take, as does one forward that computes 2 ms; forwards that all compute 2 ms take
        it off within a few, and fast ones on worker threads bring it back within a few (no probe on the loop to
        wait for, whose one wall time could fail it and double the wait, up to 4,096 forwards). On the loop the
        clock is read on every CLOCK_EVERY-th forward, not on each."""
        import threading
        import time as _time
        import types

        from rsinfer_cli.engine import scheduler as sched

        loop_thread = threading.get_ident()
        mode = ["fast"]
        reads = [0]

        def thread_time() -> float:
            reads[0] += threading.get_ident() == loop_thread
            return _time.thread_time()

        def forward(session, rows):
            if mode[0] == "waits":
                _time.sleep(0.002)                     # 2 ms of wall time, no CPU
            elif mode[0] == "computes":
                end = _time.thread_time() + 0.002      # 2 ms of CPU
                while _time.thread_time() < end:
                    pass
            return [threading.get_ident() == loop_thread for _ in rows]

        async def run(s, n):
            return [await s.run(lambda runner: runner.forward(["r"], [1])[0]) for _ in range(n)]

        async def run_now(s, n):
            return [s.run_now(["r"], [1])[0] for _ in range(n)]

        async def main():
            s = Scheduler("m", ["s1"], forward, EXECUTOR, batching=False, max_rows=8, max_tokens=512, max_queue=4,
                          queue_timeout_s=5, cpu_clock=True)
            first = await run(s, sched.INLINE_AFTER)
            assert not any(first)                                # measured on worker threads first
            assert all(await run(s, 8))                          # then on the loop: no probe needed
            reads[0] = 0
            assert all(await run_now(s, 4 * sched.CLOCK_EVERY))
            assert reads[0] == 2 * 4                             # one forward in CLOCK_EVERY read, both ends
            mode[0] = "waits"
            assert all(await run(s, 40))                         # 2 ms each on the loop, none of it CPU: stays
            mode[0] = "computes"
            assert all(await run(s, 2))                          # one spike (unread, then read): a bounded step
            mode[0] = "fast"
            assert all(await run(s, 20))
            mode[0] = "computes"
            busy = await run(s, 20)
            assert 3 <= busy.index(False) <= 10 and not any(busy[10:])   # every one 2 ms of CPU: off within a few
            await settled(s)
            mode[0] = "fast"
            back = await run(s, 12)
            assert not back[0] and back[-1]     # worker threads' CPU says tiny again: the loop within a few forwards,
            assert back.index(True) <= 8        # no probe awaited (a wall-judged model waits 32 forwards for one)

        with pytest.MonkeyPatch.context() as mp:
            from rsinfer_cli.engine.scheduler import runner as runner_room

            mp.setattr(runner_room, "time", types.SimpleNamespace(perf_counter=_time.perf_counter,
                                                                  thread_time=thread_time))
            asyncio.run(asyncio.wait_for(main(), 20))

    def test_cpu_clock_for_models_that_compute_on_their_callers_thread(self, tmp_path):
        """A planned CPU model (narrow lanes of one intra-op thread) and one of `intra_threads: 1` are judged by
        their CPU time; one of two intra-op threads, or a script model (its forward runs in another process), by
        wall time."""
        import types

        from rsinfer_cli.runtime import Runtime
        from rsinfer_cli.server.metrics import Metrics

        root = synth.write_model_dir(tmp_path / "m")
        cfg = parse_config({"models": [
            {"name": "planned", "kind": "embedding", "path": str(root)},
            {"name": "one", "kind": "embedding", "path": str(root), "replicas": 2, "intra_threads": 1},
            {"name": "two", "kind": "embedding", "path": str(root), "replicas": 1, "intra_threads": 2}]})
        queues = Runtime(cfg, Registry.load(cfg), Metrics()).queues
        assert {k: q.learner.cpu_clock for k, q in queues.items()} == {"planned": True, "one": True, "two": False}
        script = types.SimpleNamespace(threads=types.SimpleNamespace(budgeted=False, threads=1), sessions=["p"],
                                       wide=None, on_cpu=True, backend="python")
        pipe = types.SimpleNamespace(forward=lambda s, rows: rows, batching=False, max_rows=8, max_tokens=512,
                                     max_padding=None)
        s = Scheduler.for_model("s", script, pipe, EXECUTOR, queue_rows=64, max_queue=4, queue_timeout_ms=1000)
        assert not s.learner.cpu_clock


def test_enqueue_answers_by_callback_and_abandons():
    """Scheduler.enqueue (the engine process's path: no task per request): done(outputs, None) with the outputs in
    row order, done(None, error) for a failure; abandoned rows never reach a forward and are never answered; a full
    queue raises Saturated at once; rows that do not batch run as one direct job; no rows, or a tiny model's direct
    request on a free lane, are answered before enqueue returns (None: nothing to abandon)."""
    from rsinfer_cli.engine.scheduler import INLINE_AFTER, as_is
    from rsinfer_cli.errors import Saturated

    seen: list[list[str]] = []
    gate = threading.Event()

    def forward(session, rows):
        gate.wait(5)
        seen.append(list(rows))
        if "boom" in rows:
            raise RuntimeError("boom")
        return [r.upper() for r in rows]

    async def main():
        s = Scheduler("m", ["s1"], forward, EXECUTOR, batching=True, max_rows=4, max_tokens=512, max_queue=2,
                      queue_timeout_s=5)
        loop = asyncio.get_running_loop()
        got: dict[str, tuple] = {}
        first_done = loop.create_future()

        def into(name, then=None):
            def done(outputs, exc):
                got[name] = (outputs, exc)
                if then is not None:
                    then.set_result(None)
            return done

        assert s.enqueue(["a", "b"], [1, 1], as_is, into("ab", first_done)) is not None   # runs on a thread
        abandon = s.enqueue(["c"], [1], as_is, into("c"))                                  # queued
        s.enqueue(["d"], [1], as_is, into("d"))
        with pytest.raises(Saturated):
            s.enqueue(["e"], [1], as_is, into("e"))
        abandon()
        gate.set()
        await asyncio.wait_for(first_done, 5)
        await settled(s)
        for _ in range(100):
            if "d" in got:
                break
            await asyncio.sleep(0.01)
        assert got["ab"] == (["A", "B"], None) and got["d"] == (["D"], None)
        assert "c" not in got and "e" not in got
        assert all("c" not in rows for rows in seen)
        plain = Scheduler("p", ["s1"], forward, EXECUTOR, batching=False, max_rows=4, max_tokens=512)
        direct = loop.create_future()
        assert plain.enqueue(["x", "y"], [1, 1], as_is, lambda o, e: direct.set_result((o, e))) is not None
        assert await asyncio.wait_for(direct, 5) == (["X", "Y"], None)                    # one direct job
        empty: list[tuple] = []
        assert plain.enqueue([], [], as_is, lambda o, e: empty.append((o, e))) is None and empty == [([], None)]
        for _ in range(INLINE_AFTER + 1):                  # its forwards are measured tiny: run at once from now on
            answered = loop.create_future()
            plain.enqueue(["w"], [1], as_is, lambda o, e, f=answered: f.done() or f.set_result((o, e)))
            await asyncio.wait_for(answered, 5)
            await settled(plain)
        now: list[tuple] = []
        assert plain.enqueue(["z"], [1], as_is, lambda o, e: now.append((o, e))) is None and now == [(["Z"], None)]
        assert plain.enqueue(["boom"], [1], as_is, lambda o, e: now.append((o, e))) is None
        assert now[1][0] is None and isinstance(now[1][1], RuntimeError)                 # the error, not raised

    asyncio.run(asyncio.wait_for(main(), 20))
