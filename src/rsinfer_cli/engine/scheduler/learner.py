"""Whether a model's forwards are tiny enough to run on the event loop's own thread: one object per model with its
tunables, fed every forward's wall and CPU time (`runner.stamped`), asked by the dispatcher before each start.

A model whose forwards average less than `inline_forward_s` runs them on the event loop: a hop to a worker thread and
back cost ~270 µs of CPU under load (KServe add_one, 64 clients: 490 vs 220 µs a request on 2 cores). A lone row runs
on the latency lane on the loop's thread when its forward should take at most `lone_forward_s` (its tokens times the
lane's one-row seconds per token)."""

from __future__ import annotations

import math
from dataclasses import dataclass

# the defaults of Tunables, as module constants (benchmarks scale them; tests count in them)
INLINE_FORWARD_S = 100e-6
INLINE_AFTER = 16
SPIKE_S = 2 * INLINE_FORWARD_S
CLOCK_EVERY = 16
PROBE_GAP = (32, 4096)
LONE_FORWARD_S = 0.010


@dataclass(frozen=True)
class Tunables:
    # a model whose forwards average less than this runs them on the event loop
    inline_forward_s: float = INLINE_FORWARD_S
    # forwards measured (on worker threads) before that is decided
    inline_after: int = INLINE_AFTER
    # one forward counts at most this much in that average: one spike (the thread preempted, a wait for the GIL, a
    # cold cache: add_one's 5 µs forward read up to 330 µs of CPU and 440 µs of wall time on the loop) moves it by a
    # bounded step, and a model whose every forward is slow still crosses the line within a few
    spike_s: float = SPIKE_S
    # a model whose forwards compute on the thread that calls them (the CPU provider with one intra-op thread:
    # `cpu_clock`) is judged by that thread's CPU time wherever they run: a forward's wall time on the loop also
    # counts preemption, a CPU quota's throttled periods and waits for the GIL. On the loop its clock is read on every
    # clock_every-th forward and on those after one whose wall or CPU time crossed inline_forward_s (a system call
    # at each end, ~0.5 µs); the others count their wall time, which is at least their CPU time
    clock_every: int = CLOCK_EVERY
    # any other model (more intra-op threads, a device, a script's process) by wall time, with a probe on the loop
    # now and then when its CPU time on worker threads says tiny: forwards between two probes, the first gap and the
    # longest after failures
    probe_gap: tuple[int, int] = PROBE_GAP
    # a lone row's latency-lane forward on the loop: at most this long (health probes, timers and other models'
    # answers wait that long at most; the hop it saves, ~0.3 ms, is under 3 % of anything slower)
    lone_forward_s: float = LONE_FORWARD_S


class Learner:
    """One model's running means: its forwards' seconds (EWMA) that decide whether they run on the loop, their CPU
    seconds on the thread that ran them, and the latency lane's one-row seconds per token. Written by whichever
    thread ran a forward (floats and ints: a stale read by the loop only delays a switch)."""

    def __init__(self, cpu_clock: bool = False, tunables: Tunables | None = None) -> None:
        self.t = tunables or TUNABLES
        self.cpu_clock = cpu_clock      # a forward's CPU time on its calling thread is its cost
        self.forward_s = 1.0
        self.cpu_s = 1.0
        self.forwards = 0
        self.probing = False
        self.ran_here = False
        self.probe_gap = self.t.probe_gap[0]
        self.next_probe = self.t.inline_after
        self.clock_due = 0              # cpu_clock: forwards on the loop until the next one whose CPU time is read
        self.lone_s = math.inf          # the latency lane's one-row seconds per token; unknown

    def inline(self) -> bool:
        """A request may run here on the loop (a lane free, nobody queued): the forwards are measured tiny."""
        t = self.t
        return (self.forwards >= t.inline_after and self.forward_s < t.inline_forward_s) or self.tiny()

    def tiny(self) -> bool:
        """This model's forwards take a few µs (measured): run them on the event loop, not a worker thread. A
        model judged by wall time whose CPU on its worker threads says tiny but whose wall time does not (the wait
        for the GIL a busy loop holds counts in it, or a device that takes long) is tried on the loop now and
        then, with a longer gap after each try that says no."""
        t = self.t
        if self.forwards < t.inline_after:
            return False
        if self.forward_s < t.inline_forward_s:
            return True
        if self.cpu_clock:       # its CPU time, wherever read, is its cost: nothing to try
            return False
        if self.cpu_s < 2 * t.inline_forward_s and self.forwards >= self.next_probe:
            self.probing = True
            return True
        return False

    def lone_short(self, cost: int) -> bool:
        """A one-row forward of `cost` tokens on the latency lane is known to be short (cost 0: whether any is)."""
        return max(cost, 1) * self.lone_s <= self.t.lone_forward_s

    def clock_now(self) -> bool:
        """Read the thread's CPU clock around the next forward on the loop (clock_every)."""
        return self.cpu_clock and self.clock_due <= 0

    def lone_took(self, wall: float, cost: int) -> None:
        """A one-row forward of `cost` tokens on the latency lane took `wall` seconds (whichever thread ran it)."""
        per = wall / max(cost, 1)
        self.lone_s = per if self.lone_s == math.inf else self.lone_s + (per - self.lone_s) * 0.1

    def took(self, wall: float, cpu: float | None, here: bool) -> None:
        """A forward's wall seconds and its CPU seconds on the thread that ran it (None: not read; always read on
        a worker thread); `here`: it ran on the event loop."""
        self.forwards += 1
        weight = 1.0 if self.forwards == 1 else 0.1
        t = self.t
        if self.cpu_clock:                   # the CPU time is the cost: one average for both decisions
            if cpu is None:
                if wall >= t.inline_forward_s:   # preempted, a wait for the GIL, or slow: the next one's CPU says
                    self.clock_due = 0
                    return
                cpu = wall                   # (at least its CPU time, and below the line)
                self.clock_due -= 1
            else:
                self.clock_due = t.clock_every if cpu < t.inline_forward_s else 0
            self.cpu_s = self.forward_s = self.cpu_s + (min(cpu, t.spike_s) - self.cpu_s) * weight
            return
        if cpu is None:                      # not read: on the loop (the wall time stands for it)
            cpu = wall
        self.cpu_s += (cpu - self.cpu_s) * weight
        if self.probing and here:            # a try on the loop: a clean measurement, taken as it is
            self.probing = False
            self.forward_s = wall
            ok = wall < t.inline_forward_s
            self.probe_gap = t.probe_gap[0] if ok else min(self.probe_gap * 2, t.probe_gap[1])
            self.next_probe = self.forwards + self.probe_gap
        elif here:      # clipped: a spike moves the average by a bounded step (see spike_s)
            self.forward_s += (min(wall, t.spike_s) - self.forward_s) * weight
        elif not self.ran_here:              # worker threads' wall times only until one ran on the loop
            self.forward_s += (wall - self.forward_s) * weight
        self.ran_here = self.ran_here or here


TUNABLES = Tunables()     # every model's, unless a scheduler is given its own
