"""The CPU thread plan: how many CPUs this process may really use, and how every CPU model's forwards share them.

The CPUs: the affinity mask (`taskset`, cpusets) and the cgroup CPU quota (v2 `cpu.max`, v1 `cpu.cfs_quota_us`:
Kubernetes `resources.limits.cpu`, `docker --cpus`), the smallest of them, never the host's count alone (a pod
limited to 2 CPUs on a 64-core host that spins 64 threads per session is throttled to a crawl).

The plan for a model that sets neither `replicas` nor `intra_threads` (benchmarks/RESULTS.md, "Threads and CPUs"):
- **narrow lanes**: one session with ONE intra-op thread, run by as many callers at once as there are CPUs.
  ORT sessions are thread-safe, and with one thread a forward runs on its caller, so N callers on one session
  measured as fast as N sessions (1222 vs 1254 short texts/s on 2 cores) with one copy of the weights; a shared
  multi-thread session under concurrent callers was the slowest layout measured (924).
- **the latency lane**: a second session with one intra-op thread per CPU, used only for a forward that would run
  alone (nothing else running or queued): a lone short query then costs one forward with every CPU (1.77 ms vs
  2.59 ms on one thread, MiniLM). It spins (`session.intra_op.allow_spinning`): without spinning its
  forward measured as slow as one thread (2.54 ms).
- **one CPU budget** for every planned model of the process: a narrow forward holds one CPU, the latency lane
  all of them, so the models of one config together never run more ORT threads than there are CPUs.
A model with explicit `replicas`/`intra_threads` gets exactly that (no latency lane, outside the budget), and a plan
that then needs more threads than CPUs is logged as a warning with the numbers. Accelerator models keep their own
rules (`replicas` sessions, default 2; one engine per device).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import ModelConfig, ServerConfig

log = logging.getLogger("rsinfer.engine")

ACCELERATOR_REPLICAS = 2


@dataclass(frozen=True)
class Cpus:
    """The CPUs this process may use, and why that many."""

    count: int
    host: int
    why: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "host": self.host, "why": list(self.why)}


def _affinity() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _cgroup_paths(proc_cgroup: Path) -> tuple[str | None, dict[str, str]]:
    """This process's cgroup v2 path and its v1 paths by controller, from /proc/self/cgroup."""
    v2: str | None = None
    v1: dict[str, str] = {}
    try:
        text = proc_cgroup.read_text(encoding="ascii")
    except OSError:
        return None, {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            v2 = path
        for c in controllers.split(","):
            if c:
                v1[c] = path
    return v2, v1


def _ancestors(root: Path, path: str) -> list[Path]:
    """The cgroup folder of `path` under `root` and each of its parents up to `root` (a limit on any of them
    applies). Inside a container the path of /proc/self/cgroup may not exist under the mount (the mount is the
    container's own cgroup): then the mount's root alone."""
    rel = [p for p in path.strip("/").split("/") if p and p != ".."]
    out = [root.joinpath(*rel[:i]) for i in range(len(rel), -1, -1)]
    return [d for d in out if d.is_dir()] or [root]


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii").strip()
    except OSError:
        return None


def _quota(cgroup_root: Path, proc_cgroup: Path) -> tuple[float, str] | None:
    """The tightest CPU quota over this process's cgroup and its ancestors, in CPUs, with where it was read."""
    v2, v1 = _cgroup_paths(proc_cgroup)
    found: list[tuple[float, str]] = []
    if v2 is not None:
        for d in _ancestors(cgroup_root, v2):
            text = _read(d / "cpu.max")
            if text:
                quota, _, period = text.partition(" ")
                if quota != "max" and quota.isdigit() and period.isdigit() and int(period) > 0:
                    found.append((int(quota) / int(period), f"cgroup v2 {d / 'cpu.max'} = {text}"))
    for controller in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        if controller.split(",")[0] not in v1:
            continue
        base = cgroup_root / controller
        if not base.is_dir():
            continue
        for d in _ancestors(base, v1["cpu"] if "cpu" in v1 else v1[controller.split(",")[0]]):
            q, p = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
            if q and p and q.lstrip("-").isdigit() and p.isdigit() and int(q) > 0 and int(p) > 0:
                found.append((int(q) / int(p), f"cgroup v1 {d / 'cpu.cfs_quota_us'} = {q} / {p}"))
        break
    return min(found) if found else None


def usable_cpus(cgroup_root: str | os.PathLike[str] = "/sys/fs/cgroup",
                proc_cgroup: str | os.PathLike[str] = "/proc/self/cgroup",
                affinity: int | None = None, host: int | None = None) -> Cpus:
    """The CPUs this process may use: the affinity mask, cut by the cgroup CPU quota (rounded down, at least 1:
    threads past the quota only get throttled)."""
    host = host or os.cpu_count() or 1
    aff = affinity if affinity is not None else _affinity()
    count = aff or host
    why = [f"affinity mask: {aff} of {host} CPUs" if aff is not None else f"host: {host} CPUs"]
    quota = _quota(Path(cgroup_root), Path(proc_cgroup))
    if quota is not None:
        cpus, where = quota
        limit = max(1, math.floor(cpus + 1e-9))
        why.append(f"{where} ({cpus:g} CPUs)")
        count = min(count, limit)
    return Cpus(count=max(1, count), host=host, why=tuple(why))


def limit_tokenizer_threads(cpus: Cpus) -> None:
    """The tokenizers library's rayon pool (`encode_batch`) sized to the usable CPUs, not the host's (set before
    its first use; an operator's RAYON_NUM_THREADS wins)."""
    os.environ.setdefault("RAYON_NUM_THREADS", str(cpus.count))


# ------------------------------------------------------------------ the plan


@dataclass(frozen=True)
class ModelThreads:
    """How one model runs: `lanes` forwards at once of `threads` intra-op threads each, on `sessions` sessions
    (1 when threads == 1: the lanes share it), plus a latency-lane session of `wide` threads (0: none)."""

    lanes: int
    threads: int
    sessions: int
    wide: int = 0
    source: str = "plan"                # plan | config | accelerator | script

    @property
    def budgeted(self) -> bool:
        """Its forwards take CPUs from the process's budget (planned CPU models)."""
        return self.source == "plan"

    def describe(self) -> str:
        if self.source == "script":
            return f"{self.lanes} process{'es' if self.lanes > 1 else ''} at once (script)"
        lane = f" + a latency lane of {self.wide} threads" if self.wide else ""
        shared = " sharing one session" if self.sessions == 1 and self.lanes > 1 else ""
        return f"{self.lanes} x {self.threads} thread{'s' if self.threads > 1 else ''}{shared}{lane} ({self.source})"

    def to_json(self) -> dict[str, Any]:
        return {"lanes": self.lanes, "threads": self.threads, "sessions": self.sessions, "latency_lane_threads":
                self.wide, "source": self.source, "spinning": "latency lane only" if self.wide else "ORT default"}


def model_threads(cfg: ModelConfig, cpus: int, on_cpu: bool, script: bool = False) -> ModelThreads:
    """One model's threads: its config where it sets them, else the plan (module docstring). A script model
    (engine/scripts/) runs `replicas` forwards at once (default one per CPU), each a process of its own."""
    replicas, threads = cfg.replicas, cfg.intra_threads
    if script:
        return ModelThreads(lanes=replicas or cpus, threads=1, sessions=1, source="script")
    if not on_cpu:
        lanes = replicas or ACCELERATOR_REPLICAS   # CPU threads only run the ops the accelerator lacks
        return ModelThreads(lanes=lanes, threads=threads or cpus, sessions=lanes, source="accelerator")
    if replicas or threads:
        threads = threads or max(1, cpus // (replicas or 1))
        lanes = replicas or max(1, cpus // threads)
        return ModelThreads(lanes=lanes, threads=threads, sessions=1 if threads == 1 else lanes, source="config")
    return ModelThreads(lanes=cpus, threads=1, sessions=1, wide=cpus if cpus > 1 else 0)


@dataclass(frozen=True)
class ThreadPlan:
    cpus: Cpus
    models: dict[str, ModelThreads] = field(default_factory=dict)    # by model key (name, or name:version)
    warnings: tuple[str, ...] = ()

    @property
    def prep_threads(self) -> int:
        """Tokenizing and answers: one thread per CPU (they mostly wait on the GIL or the tokenizer)."""
        return self.cpus.count

    @property
    def infer_threads(self) -> int:
        """Threads that call forwards: one per lane and per latency lane."""
        return max(1, sum(t.lanes + (1 if t.wide else 0) for t in self.models.values()))

    @property
    def budgeted(self) -> bool:
        return any(t.budgeted for t in self.models.values())

    def to_json(self) -> dict[str, Any]:
        return {"cpus": self.cpus.to_json(), "models": {k: t.to_json() for k, t in self.models.items()},
                "warnings": list(self.warnings)}

    def lines(self) -> list[str]:
        """The plan for people: the start-up log and `rsinfer inspect`."""
        out = [f"CPUs: {self.cpus.count} ({'; '.join(self.cpus.why)})"]
        out += [f"model {k}: {t.describe()}" for k, t in self.models.items()]
        return out + [f"warning: {w}" for w in self.warnings]


def plan_threads(models: Sequence[tuple[str, ModelConfig, bool]], server: ServerConfig | None = None,
                 cpus: Cpus | None = None, scripts: frozenset[str] = frozenset()) -> ThreadPlan:
    """The plan for `(key, config, runs on CPU)` of every model of the process (`scripts`: the keys of script
    models). `server.threads` > 0 sets the CPUs the plan uses instead of those found."""
    server = server or ServerConfig()
    found = cpus or usable_cpus()
    if server.threads:
        found = Cpus(count=server.threads, host=found.host, why=(*found.why, f"server.threads = {server.threads}"))
    plan = {key: model_threads(cfg, found.count, on_cpu, key in scripts) for key, cfg, on_cpu in models}
    warnings: list[str] = []
    cpu_models = {k: t for k, t in plan.items() if t.source in ("plan", "config")}
    explicit = {k: t for k, t in cpu_models.items() if t.source == "config"}
    total = sum(t.lanes * t.threads for t in explicit.values()) + (
        found.count if any(t.budgeted for t in cpu_models.values()) else 0)
    if explicit and total > found.count:
        parts = [f"{k}: {t.lanes} replicas x {t.threads} threads" for k, t in explicit.items()]
        if any(t.budgeted for t in cpu_models.values()):
            parts.append(f"planned models: {found.count}")
        warnings.append(f"the configured threads oversubscribe the CPUs: {' + '.join(parts)} = {total} threads "
                        f"on {found.count} CPUs; leave replicas/intra_threads unset to get a plan that fits")
    return ThreadPlan(cpus=found, models=plan, warnings=tuple(warnings))


def plan_models(models: Sequence[ModelConfig], server: ServerConfig | None = None) -> ThreadPlan:
    """The plan of these models (every version its own) served by one process: where each runs (its resolved EPs)
    and whether it is a script model decide which rule applies. The one way every caller plans."""
    from .scripts import script_backend
    from .session import plan_eps

    scripts = frozenset(m.key for m in models if script_backend(m) is not None)
    return plan_threads([(m.key, m, plan_eps(m).resolved[0] == "cpu") for m in models], server, scripts=scripts)


# ------------------------------------------------------------------ the budget


class CpuBudget:
    """The CPUs of the process as tokens, shared by every planned model's scheduler (event-loop thread only):
    a narrow forward takes 1, the latency lane all of them. A scheduler that finds too few free waits to be
    called back when some are released."""

    def __init__(self, total: int) -> None:
        self.total = max(1, total)
        self.free = self.total
        # requests in flight in the process (the runtime's core counts them): a lone request runs on the event loop
        # only while it is the one
        self.requests = 0
        self._waiting: dict[int, Callable[[], None]] = {}

    def take(self, n: int) -> bool:
        if n > self.free:
            return False
        self.free -= n
        return True

    def wait(self, key: int, wake: Callable[[], None]) -> None:
        self._waiting.setdefault(key, wake)

    def give(self, n: int) -> None:
        self.free = min(self.total, self.free + n)
        if not self._waiting:      # nobody to call back (almost always): no lists or dicts made per forward
            return
        waiting, self._waiting = list(self._waiting.items()), {}
        for i, (_, wake) in enumerate(waiting):   # in the order they waited; one still short waits again, last
            if self.free <= 0:
                rest = dict(waiting[i:])
                rest.update(self._waiting)
                self._waiting = rest
                return
            wake()
