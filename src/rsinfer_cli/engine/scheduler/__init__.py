"""One scheduler per model: admission, cross-request batching of generic rows, dispatch to idle lanes, cancellation.
The only async code in the engine, in rooms: `contract` (what callers and rooms agree on: `ModelQueue`, `Asked`),
`admission` (the FIFO queue, its limits and its one expiry timer), `lanes` (sessions, the latency lane and the CPU
budget), `learner` (whether forwards are tiny enough for the event loop: one object with its tunables),
`runner` (the one forward-stamping function, the direct path's `Runner`), `dispatcher` (what starts where) and
`queue` (`Scheduler`: the path of each request)."""

from .contract import Asked, Cancelled, Forwarding, ModelQueue, Observer, QueueStats, RowForward, Rows, as_is
from .learner import CLOCK_EVERY, INLINE_AFTER, INLINE_FORWARD_S, LONE_FORWARD_S, SPIKE_S, Learner, Tunables
from .queue import Scheduler
from .runner import Runner, run_rows, stamped

__all__ = ["CLOCK_EVERY", "INLINE_AFTER", "INLINE_FORWARD_S", "LONE_FORWARD_S", "SPIKE_S", "Asked", "Cancelled",
           "Forwarding", "Learner", "ModelQueue", "Observer", "QueueStats", "RowForward", "Rows", "Runner",
           "Scheduler", "Tunables", "as_is", "run_rows", "stamped"]
