"""A model's lanes and its share of the process's CPUs (engine/threads.py): its sessions are its narrow lanes (one
forward each at a time); a planned CPU model also has a latency lane (`wide`, every CPU on one forward) and shares
the process's `CpuBudget` with the other planned models. A narrow forward takes `cost` CPUs of it; work that forms a
single forward with nothing else running or waiting anywhere in the process goes to the latency lane, which takes
all of them. Event-loop thread only."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..session import Session
from ..threads import CpuBudget


class Lanes:
    def __init__(self, sessions: Sequence[Session], wide: Session | None = None, budget: CpuBudget | None = None,
                 cost: int = 1) -> None:
        if not sessions:
            raise ValueError("a scheduler needs at least one session")
        self.replicas = len(sessions)
        self.idle: list[Session] = list(sessions)
        self.wide = wide
        self.budget = budget if budget is not None or wide is None else CpuBudget(len(sessions))
        self.cost = cost
        self.running = 0          # forwards (or trains, or direct jobs) holding a lane

    def slots(self) -> int:
        """Narrow lanes that may start a forward now: idle ones, as far as the CPU budget has room."""
        if self.budget is None:
            return len(self.idle)
        return min(len(self.idle), self.budget.free // self.cost)

    def alone(self) -> bool:
        """A forward started now would run alone in the process: the latency lane may have every CPU."""
        budget = self.budget
        return self.wide is not None and self.running == 0 and budget is not None and budget.free == budget.total

    def take(self, wide: bool = False) -> Session:
        """A lane for one forward (or train of forwards): the latency lane, else an idle narrow one; its CPUs come
        out of the budget."""
        self.running += 1
        if wide and self.wide is not None and self.budget is not None:
            self.budget.take(self.budget.total)
            return self.wide
        if self.budget is not None:
            self.budget.take(self.cost)
        return self.idle.pop()

    def give_back(self, session: Session) -> None:
        """A lane back after its forward; its CPUs back to the budget (models waiting for them are called, in
        turn)."""
        self.running -= 1
        wide = session is self.wide
        if not wide:
            self.idle.append(session)
        if self.budget is not None:
            self.budget.give(self.budget.total if wide else self.cost)

    def wait(self, key: int, wake: Callable[[], None]) -> bool:
        """No slot: when another model holds the CPUs (a lane is idle), `wake` is called once they come back."""
        if self.budget is not None and self.idle:
            self.budget.wait(key, wake)
            return True
        return False
