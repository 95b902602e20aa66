"""The CPU thread plan: the CPUs a process may use (affinity, cgroup v2/v1 quota on a fake /sys/fs/cgroup), the plan
per model, the CPU budget shared by schedulers, the latency lane, and the sessions a loaded model really gets."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rsinfer_cli.config import ModelConfig, ServerConfig, parse_config
from rsinfer_cli.engine.model import load_model
from rsinfer_cli.engine.scheduler import Scheduler
from rsinfer_cli.engine.threads import CpuBudget, Cpus, ModelThreads, plan_threads, usable_cpus

import synth

# ------------------------------------------------------------------ CPUs from affinity and cgroups


def cgroup_tree(tmp: Path, proc: str, files: dict[str, str]) -> tuple[Path, Path]:
    """A fake cgroup mount under tmp/cgroup with `files` (relative path → content) and a /proc/self/cgroup."""
    root = tmp / "cgroup"
    root.mkdir()
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text + "\n")
    proc_file = tmp / "proc-self-cgroup"
    proc_file.write_text(proc)
    return root, proc_file


class TestUsableCpus:
    def test_v2_quota_caps_the_affinity_mask(self, tmp_path):
        root, proc = cgroup_tree(tmp_path, "0::/kubepods/pod1/ctr\n", {
            "kubepods/pod1/ctr/cpu.max": "250000 100000",     # docker --cpus 2.5 / limits.cpu: 2500m
            "kubepods/cpu.max": "max 100000"})
        cpus = usable_cpus(root, proc, affinity=16, host=64)
        assert cpus.count == 2            # rounded down: a third thread would only be throttled
        assert cpus.host == 64
        assert any("cpu.max = 250000 100000" in w and "2.5 CPUs" in w for w in cpus.why)
        assert "affinity mask: 16 of 64 CPUs" in cpus.why[0]

    def test_v2_tightest_ancestor_wins(self, tmp_path):
        root, proc = cgroup_tree(tmp_path, "0::/a/b\n", {"a/b/cpu.max": "max 100000", "a/cpu.max": "100000 100000"})
        assert usable_cpus(root, proc, affinity=8, host=8).count == 1

    def test_v2_container_view_reads_the_mount_root(self, tmp_path):
        # inside a container the host's path in /proc/self/cgroup does not exist under the container's mount
        root, proc = cgroup_tree(tmp_path, "0::/system.slice/docker-abc.scope\n", {"cpu.max": "300000 100000"})
        assert usable_cpus(root, proc, affinity=32, host=32).count == 3

    def test_no_limit_is_the_affinity_mask(self, tmp_path):
        root, proc = cgroup_tree(tmp_path, "0::/\n", {"cpu.max": "max 100000"})
        cpus = usable_cpus(root, proc, affinity=3, host=8)
        assert cpus.count == 3 and len(cpus.why) == 1

    def test_fractional_quota_below_one_is_one(self, tmp_path):
        root, proc = cgroup_tree(tmp_path, "0::/x\n", {"x/cpu.max": "50000 100000"})
        assert usable_cpus(root, proc, affinity=4, host=4).count == 1

    def test_v1_cfs_quota(self, tmp_path):
        root, proc = cgroup_tree(tmp_path, "12:cpu,cpuacct:/docker/abc\n11:memory:/docker/abc\n", {
            "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "200000",
            "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000"})
        cpus = usable_cpus(root, proc, affinity=8, host=8)
        assert cpus.count == 2 and any("cgroup v1" in w for w in cpus.why)

    def test_v1_unlimited(self, tmp_path):
        root, proc = cgroup_tree(tmp_path, "4:cpu,cpuacct:/\n", {"cpu,cpuacct/cpu.cfs_quota_us": "-1",
                                                                 "cpu,cpuacct/cpu.cfs_period_us": "100000"})
        assert usable_cpus(root, proc, affinity=6, host=6).count == 6

    def test_missing_cgroup_files(self, tmp_path):
        cpus = usable_cpus(tmp_path / "none", tmp_path / "no-proc", affinity=2, host=4)
        assert cpus.count == 2

    def test_this_process(self):
        import os

        cpus = usable_cpus()
        assert 1 <= cpus.count <= len(os.sched_getaffinity(0))


# ------------------------------------------------------------------ the plan


def cfg(**kw) -> ModelConfig:
    return ModelConfig(name=kw.pop("name", "m"), kind="embedding", path="x", **kw)


def two(n: int = 2) -> Cpus:
    return Cpus(count=n, host=n, why=("test",))


class TestPlan:
    def test_default_is_narrow_lanes_on_one_session_and_a_latency_lane(self):
        t = plan_threads([("m", cfg(), True)], cpus=two()).models["m"]
        assert (t.lanes, t.threads, t.sessions, t.wide, t.source) == (2, 1, 1, 2, "plan")

    def test_one_cpu_has_no_latency_lane(self):
        t = plan_threads([("m", cfg(), True)], cpus=two(1)).models["m"]
        assert (t.lanes, t.threads, t.sessions, t.wide) == (1, 1, 1, 0)

    def test_explicit_settings_are_authoritative(self):
        plan = plan_threads([("a", cfg(name="a", replicas=1), True),
                             ("b", cfg(name="b", intra_threads=2), True),
                             ("c", cfg(name="c", replicas=3, intra_threads=1), True)], cpus=two(4))
        a, b, c = plan.models["a"], plan.models["b"], plan.models["c"]
        assert (a.lanes, a.threads, a.sessions, a.wide, a.source) == (1, 4, 1, 0, "config")
        assert (b.lanes, b.threads, b.sessions) == (2, 2, 2)        # multi-thread lanes get a session each
        assert (c.lanes, c.threads, c.sessions) == (3, 1, 1)        # one-thread lanes share one
        assert not any(t.budgeted for t in (a, b, c))

    def test_oversubscription_is_a_warning_with_the_numbers(self):
        plan = plan_threads([("a", cfg(name="a", replicas=2, intra_threads=2), True)], cpus=two())
        assert len(plan.warnings) == 1
        assert "a: 2 replicas x 2 threads = 4 threads on 2 CPUs" in plan.warnings[0]
        assert plan_threads([("a", cfg(name="a", replicas=2, intra_threads=1), True)], cpus=two()).warnings == ()
        # a configured model beside planned ones: the planned ones count as every CPU
        mixed = plan_threads([("a", cfg(name="a", replicas=1, intra_threads=1), True), ("b", cfg(name="b"), True)],
                             cpus=two())
        assert "planned models: 2" in mixed.warnings[0]

    def test_server_threads_sets_the_cpus(self):
        plan = plan_threads([("m", cfg(), True)], ServerConfig(threads=3), cpus=two(8))
        assert plan.cpus.count == 3 and "server.threads = 3" in plan.cpus.why[-1]
        assert plan.models["m"].lanes == 3 and plan.prep_threads == 3

    def test_accelerator_models_keep_their_rules(self):
        plan = plan_threads([("g", cfg(name="g", eps=("cuda",)), False)], cpus=two(16))
        g = plan.models["g"]
        assert (g.lanes, g.sessions, g.wide, g.source, g.budgeted) == (2, 2, 0, "accelerator", False)

    def test_infer_threads_cover_every_lane(self):
        plan = plan_threads([("a", cfg(name="a"), True), ("b", cfg(name="b"), True)], cpus=two())
        assert plan.infer_threads == 2 * (2 + 1)
        assert [ln for ln in plan.lines() if ln.startswith("model a:")] == \
            ["model a: 2 x 1 thread sharing one session + a latency lane of 2 threads (plan)"]

    def test_auto_and_zero_parse_as_the_plan(self):
        c = parse_config({"server": {"threads": "auto"}, "models": [
            {"name": "m", "kind": "embedding", "path": "x", "replicas": "auto", "intra_threads": "auto"}]})
        assert (c.server.threads, c.models[0].replicas, c.models[0].intra_threads) == (0, None, 0)


# ------------------------------------------------------------------ the budget and the latency lane


class Sessions:
    """Fake sessions whose forward blocks until released, recording which ran and how many at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active: dict[str, int] = {}
        self.peak_cpus = 0
        self.ran: list[str] = []
        self.release = threading.Event()
        self.cpus = {"wide": 2}

    def forward(self, session, rows):
        with self.lock:
            self.active[session] = self.active.get(session, 0) + 1
            self.ran.append(session)
            busy = sum(self.cpus.get(s.split(":")[-1], 1) * n for s, n in self.active.items())
            self.peak_cpus = max(self.peak_cpus, busy)
        self.release.wait(5)
        with self.lock:
            self.active[session] -= 1
        return [r * 10 for r in rows]


EXECUTOR = ThreadPoolExecutor(max_workers=8)


def lanes(fake: Sessions, name: str, budget: CpuBudget, narrow: int = 2, **kw) -> Scheduler:
    opts = {"batching": True, "max_rows": 8, "max_tokens": 512, "max_queue": 64, "queue_timeout_s": 5}
    opts.update(kw)
    return Scheduler(name, [f"{name}:narrow"] * narrow, fake.forward, EXECUTOR, wide=f"{name}:wide",
                     budget=budget, **opts)


async def until(cond, what: str) -> None:
    for _ in range(500):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


class TestLatencyLane:
    def test_a_lone_request_runs_on_the_latency_lane(self):
        async def main():
            fake, budget = Sessions(), CpuBudget(2)
            fake.release.set()
            s = lanes(fake, "a", budget)
            assert await s.submit([1], [4], list) == [10]
            assert fake.ran == ["a:wide"]
            await until(lambda: s.running == 0 and budget.free == 2, "the lane returns its CPUs")

        asyncio.run(asyncio.wait_for(main(), 10))

    def test_a_direct_request_alone_runs_on_the_latency_lane(self):
        async def main():
            fake, budget = Sessions(), CpuBudget(2)
            fake.release.set()
            s = lanes(fake, "a", budget, batching=False)
            assert await s.run(lambda runner: runner.session) == "a:wide"

        asyncio.run(asyncio.wait_for(main(), 10))

    def test_concurrent_work_runs_on_narrow_lanes_and_never_oversubscribes(self):
        async def main():
            fake, budget = Sessions(), CpuBudget(2)
            a, b = lanes(fake, "a", budget), lanes(fake, "b", budget)
            # many single-row requests of two models at once
            tasks = [asyncio.create_task(s.submit([i], [4], list)) for i in range(12) for s in (a, b)]
            await until(lambda: sum(fake.active.values()) >= 1, "a forward starts")
            await asyncio.sleep(0.05)
            fake.release.set()
            results = await asyncio.gather(*tasks)
            assert sorted(r[0] for r in results) == sorted(10 * i for i in range(12) for _ in (0, 1))
            assert fake.peak_cpus <= 2                       # every model together: never more than the CPUs
            assert any(r.endswith(":narrow") for r in fake.ran)
            await until(lambda: budget.free == 2 and a.running == b.running == 0, "all CPUs back")

        asyncio.run(asyncio.wait_for(main(), 10))

    def test_a_model_waiting_for_cpus_is_called_back(self):
        async def main():
            fake, budget = Sessions(), CpuBudget(1)
            a, b = lanes(fake, "a", budget, narrow=1), lanes(fake, "b", budget, narrow=1)
            first = asyncio.create_task(a.submit([1], [4], list))
            await until(lambda: fake.ran, "a's forward starts")
            second = asyncio.create_task(b.submit([2], [4], list))
            await asyncio.sleep(0.05)
            assert fake.ran == ["a:wide"] and b.waiting == 1      # b has an idle lane but no CPU
            fake.release.set()
            assert await asyncio.wait_for(second, 5) == [20] and await first == [10]

        asyncio.run(asyncio.wait_for(main(), 10))

    def test_a_backlog_is_split_over_narrow_lanes(self):
        async def main():
            fake, budget = Sessions(), CpuBudget(2)
            fake.release.set()
            s = lanes(fake, "a", budget, max_rows=4)
            assert await s.submit(list(range(8)), [4] * 8, list) == [10 * i for i in range(8)]
            assert fake.ran.count("a:narrow") >= 2 and "a:wide" not in fake.ran

        asyncio.run(asyncio.wait_for(main(), 10))


class TestLoneRow:
    """A lone row whose latency-lane forward is known to be short runs on that lane on the event loop's own thread:
    no job, future or thread hop (engine/scheduler/queue.py `lone`)."""

    class Threads(Sessions):
        def __init__(self, delay: float = 0.0) -> None:
            super().__init__()
            self.release.set()
            self.delay = delay
            self.threads: list[int] = []

        def forward(self, session, rows):
            self.threads.append(threading.get_ident())
            time.sleep(self.delay)
            return super().forward(session, rows)

    def test_a_lone_row_runs_on_the_loop_once_its_forward_is_known_short(self):
        async def main():
            fake, budget = self.Threads(), CpuBudget(2)
            s = lanes(fake, "a", budget)
            assert await s.submit([1], [4], list) == [10]        # the first: nothing known yet, a worker runs it
            assert fake.ran == ["a:wide"] and fake.threads[0] != threading.get_ident()
            await until(lambda: s.running == 0 and budget.free == 2, "the lane returns its CPUs")
            assert s.lone(1) and s.lone(1, 4) and not s.lone(2)
            assert not s.lone(1, 10**9)                           # a row this long would hold the loop
            assert s.run_now([2], [4], lone=True) == [20]
            assert fake.ran[-1] == "a:wide" and fake.threads[-1] == threading.get_ident()
            assert s.running == 0 and budget.free == 2            # the lane and its CPUs are back at once

        asyncio.run(asyncio.wait_for(main(), 10))

    def test_not_lone_while_anything_else_runs_or_waits(self):
        async def main():
            fake, budget = self.Threads(), CpuBudget(2)
            a, b = lanes(fake, "a", budget), lanes(fake, "b", budget)
            await a.submit([1], [4], list)
            await until(lambda: a.running == 0 and budget.free == 2, "the lane returns its CPUs")
            assert a.lone()
            fake.release.clear()                                  # b's forward holds a CPU
            running = asyncio.create_task(b.submit([1], [4], list))
            await until(lambda: b.running == 1, "b's forward starts")
            assert not a.lone()
            fake.release.set()
            await running
            await until(lambda: budget.free == 2, "b's CPUs are back")
            assert a.lone()
            assert await asyncio.to_thread(a.lone) is False      # only on the event loop's thread

        asyncio.run(asyncio.wait_for(main(), 10))

    def test_a_slow_forward_keeps_its_worker_thread(self):
        """A one-row forward over LONE_FORWARD_S would hold the loop that long: it keeps the hop."""
        from rsinfer_cli.engine.scheduler import LONE_FORWARD_S

        async def main():
            fake, budget = self.Threads(delay=LONE_FORWARD_S * 1.5), CpuBudget(2)
            s = lanes(fake, "a", budget)
            for i in range(3):
                assert await s.submit([i], [1], list) == [10 * i]     # one token each
                await until(lambda: s.running == 0, "the lane is back")
            assert not s.lone()
            assert all(t != threading.get_ident() for t in fake.threads)

        asyncio.run(asyncio.wait_for(main(), 10))


# ------------------------------------------------------------------ what a loaded model gets


def intra(session) -> int:
    return session.get_session_options().intra_op_num_threads


class TestLoadedSessions:
    def test_planned_model_shares_one_narrow_session(self, tmp_path):
        root = synth.write_model_dir(tmp_path / "m")
        m = load_model(ModelConfig(name="m", kind="embedding", path=str(root)),
                       threads=ModelThreads(lanes=2, threads=1, sessions=1, wide=2))
        assert len(m.sessions) == 2 and m.sessions[0] is m.sessions[1] and m.replicas == 2
        assert intra(m.sessions[0]) == 1
        assert m.wide is not None and intra(m.wide) == 2
        assert m.card()["threads"] == {"lanes": 2, "threads": 1, "sessions": 1, "latency_lane_threads": 2,
                                       "source": "plan", "spinning": "latency lane only"}

    def test_no_memory_pattern_on_any_session(self, tmp_path):
        """ORT's memory pattern keeps a plan per input shape forever: off on every session, the latency lane's too
        (benchmarks/mem_pattern.py)."""
        root = synth.write_model_dir(tmp_path / "m")
        m = load_model(ModelConfig(name="m", kind="embedding", path=str(root)),
                       threads=ModelThreads(lanes=2, threads=1, sessions=1, wide=2))
        assert m.wide is not None
        assert [s.get_session_options().enable_mem_pattern for s in (*m.sessions, m.wide)] == [False] * 3

    def test_configured_model_gets_what_it_says(self, tmp_path):
        root = synth.write_model_dir(tmp_path / "m")
        m = load_model(ModelConfig(name="m", kind="embedding", path=str(root), replicas=2, intra_threads=2))
        assert len({id(s) for s in m.sessions}) == 2 and all(intra(s) == 2 for s in m.sessions)
        assert m.wide is None and m.threads.source == "config"


def test_a_forward_on_the_lanes_is_timed_as_it_runs():
    """The scheduler observes the latency lane's forwards like any other (metrics keep counting)."""
    seen: list[int] = []

    class Obs:
        def forward(self, rows, padded, seconds):
            seen.append(rows)

        def waited(self, seconds):
            pass

    async def main():
        fake, budget = Sessions(), CpuBudget(2)
        fake.release.set()
        s = lanes(fake, "a", budget, observer=Obs())
        t0 = time.perf_counter()
        await s.submit([1, 2], [4, 4], list)
        assert time.perf_counter() - t0 < 5

    asyncio.run(asyncio.wait_for(main(), 10))
    assert sum(seen) == 2


@pytest.mark.parametrize("n", [1, 2])
def test_budget_tokens_never_go_negative(n):
    b = CpuBudget(n)
    assert b.take(n) and not b.take(1)
    called: list[int] = []
    b.wait(1, lambda: called.append(1))
    b.give(n)
    assert b.free == n and called == [1]


# ------------------------------------------------------------------ where the plan shows


def synth_config(tmp_path: Path, **model) -> dict:
    root = synth.write_model_dir(tmp_path / "m")
    return {"models": [{"name": "m", "kind": "embedding", "path": str(root), **model},
                       {"name": "m2", "kind": "embedding", "path": str(root)}]}


def test_served_models_show_their_plan_and_answer(tmp_path):
    """Two planned models and a configured one in one server: /v1/models shows each plan, and concurrent
    requests to all of them (lanes, latency lane, budget) are answered with the same vectors as one at a time."""
    import concurrent.futures

    import httpx

    from serverutil import ServerThread

    data = synth_config(tmp_path)
    data["models"].append({"name": "fixed", "kind": "embedding", "path": data["models"][0]["path"], "replicas": 1,
                           "intra_threads": 1})
    cfg = parse_config(data)
    with ServerThread(cfg) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        cards = {m["id"]: m["threads"] for m in c.get("/v1/models").json()["data"]}
        cpus = srv.registry.plan.cpus.count
        assert cards["m"] == {"lanes": cpus, "threads": 1, "sessions": 1, "latency_lane_threads": cpus if cpus > 1
                              else 0, "source": "plan", "spinning": "latency lane only" if cpus > 1 else
                              "ORT default", "cpus": cpus}
        assert cards["fixed"]["source"] == "config" and cards["fixed"]["latency_lane_threads"] == 0
        texts = [f"text number {i} " + "word " * (i % 7) for i in range(24)]

        def one(i: int) -> tuple[int, list[float]]:
            model = ("m", "m2", "fixed")[i % 3]
            r = c.post("/v1/embeddings", json={"model": model, "input": texts[i]})
            assert r.status_code == 200, r.text
            return i, r.json()["data"][0]["embedding"]

        alone = dict(one(i) for i in range(24))                       # one at a time: the latency lane
        with concurrent.futures.ThreadPoolExecutor(8) as ex:          # at once: the lanes and the budget
            together = dict(ex.map(one, range(24)))
        for i in range(24):
            assert max(abs(a - b) for a, b in zip(alone[i], together[i], strict=True)) < 1e-5


def test_inspect_shows_the_serve_plan_and_its_warning(tmp_path):
    import json
    import subprocess
    import sys

    import yaml

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"server": {"threads": 2},
                                   **synth_config(tmp_path, replicas=2, intra_threads=2)}))
    proc = subprocess.run([sys.executable, "-m", "rsinfer_cli", "inspect", "m", "--config", str(cfg), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    th = json.loads(proc.stdout)["threads"]
    assert (th["lanes"], th["threads"], th["sessions"], th["source"]) == (2, 2, 2, "config")
    assert th["cpus"]["count"] == 2 and "server.threads = 2" in th["cpus"]["why"][-1]
    assert th["warnings"] == ["the configured threads oversubscribe the CPUs: m: 2 replicas x 2 threads + planned "
                              "models: 2 = 6 threads on 2 CPUs; leave replicas/intra_threads unset to get a plan "
                              "that fits"]
    table = subprocess.run([sys.executable, "-m", "rsinfer_cli", "inspect", "m2", "--config", str(cfg)],
                           capture_output=True, text=True, timeout=120, env={**__import__("os").environ,
                                                                             "COLUMNS": "200"})
    assert "2 x 1 thread sharing one session + a latency lane of 2 threads (plan)" in table.stdout
    assert "oversubscribe" in table.stdout


def test_start_up_log_has_the_plan(tmp_path, caplog):
    import logging

    from rsinfer_cli.engine.registry import Registry

    with caplog.at_level(logging.INFO, logger="rsinfer.engine"):
        reg = Registry.load(parse_config({"server": {"threads": 2}, **synth_config(tmp_path)}))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("thread plan:")]
    assert lines[0].startswith("thread plan: CPUs: 2 (") and "server.threads = 2" in lines[0]
    assert "thread plan: model m: 2 x 1 thread sharing one session + a latency lane of 2 threads (plan)" in lines
    assert reg.plan.infer_threads == 6 and reg.plan.prep_threads == 2


def test_a_lone_small_request_runs_on_the_event_loop(tmp_path):
    """One client, one short text at a time: once the latency lane's one-row forward is known short, each request's
    forward runs on the server's event-loop thread, with the same answer as the first, hopped one; a large body, or
    requests that arrive together, keep the hop (and batch)."""
    import httpx

    from rsinfer_cli.runtime.record import RequestRecord

    from serverutil import ServerThread

    with ServerThread(parse_config(synth_config(tmp_path))) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        if srv.registry.plan.cpus.count < 2:
            pytest.skip("one CPU: no latency lane")
        key = next(k for k, p in srv.pipelines.items() if p.model.name == "m")
        pipe, sched = srv.pipelines[key], srv.schedulers[key]
        threads: list[tuple[str, int]] = []
        forward = sched.forward

        def traced(session, rows):
            threads.append((threading.current_thread().name, len(rows)))
            return forward(session, rows)

        sched.forward = traced
        vectors = []
        for _ in range(40):   # bounded; on a busy machine a few more forwards may be measured before the lane is short
            r = c.post("/v1/embeddings", json={"model": "m", "input": "how do I reset my password"})
            assert r.status_code == 200, r.text
            vectors.append(r.json()["data"][0]["embedding"])
            if threads[-2:] == [("server", 1), ("server", 1)]:
                break
        assert threads[0][0] != "server" and threads[-2:] == [("server", 1), ("server", 1)], threads
        assert len(threads) == len(vectors) and all(v == vectors[0] for v in vectors)
        big = c.post("/v1/embeddings", json={"model": "m", "input": "word " * 1000})  # over INLINE_BYTES: a hop
        assert big.status_code == 200 and threads[-1][0] != "server"

        async def together(n: int) -> list:
            async def one(i: int):
                record = RequestRecord()
                record.body_bytes = 60                             # as the middleware makes it
                return await srv.state.core.infer(record, pipe.model, pipe.plan, [f"query number {i}"], None)
            return await asyncio.gather(*(one(i) for i in range(n)))

        def held(session, rows):              # forwards that take a while: the requests behind them wait, then batch
            time.sleep(0.2)
            return traced(session, rows)

        sched.forward = held
        del threads[:]
        asyncio.run_coroutine_threadsafe(together(8), srv._loop).result(30)
        assert threads and all(name != "server" for name, _ in threads), threads
        assert max(rows for _, rows in threads) > 1, threads            # batched together
