"""``--explore SEED`` for the dual-pipeline gate: small seeded delays before its concurrent operations.

The simulator's schedule exploration (``simulators/runtime/explore.py``) finds orderings that a
fixed tie-break hides; this lets an ordering found there be tried on real process groups.
The gate's driver runs each pipeline, each coordinator resize call and the scheduler loop
in threads of their own, so which operation comes first is decided by their timing. With a
seed, a delay is slept:

* before every effect a pipeline's interpreter dispatches (run-level and step effects, in
  the pipeline's thread, and every effect of a resize call, in that call's thread);
* before a resize call starts (its first draw in its thread's stream);
* before the scheduler loop delivers a cycle's signals to their waiters.

A delay is 0 half the time, else k * ``max_delay_s`` / 100 for k in 1..100 (50 ms by
default: long against the gate's per-effect latencies of a few ms, short against its
timeouts). Delays are drawn per *stream* — the thread's name: ``ppl1``, ``ppl2``,
``scheduler``, ``resize ppl1 shrink cycle 3``, ... — and the i-th delay of a stream is a
pure function of (seed, stream, i): ``random.Random(f"gate-explore/{seed}/{stream}/{i}")``.
So a seed gives the same delays in the same order within each stream whatever the threads'
own timing, and the driver log's header records the seed, the bound and every delay each
stream slept, in order (``meta.explore``). Which interleaving of the streams results is
then up to the real processes: the delays move it, they do not pin it.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Dict, List

DEFAULT_MAX_DELAY_S = 0.05


def seeded_delay(seed: int, stream: str, i: int, max_delay_s: float) -> float:
    """The i-th delay of ``stream`` under ``seed`` (str seeds hash the same on every Python)."""
    k = int(random.Random(f"gate-explore/{seed}/{stream}/{i}").random() * 200)
    return 0.0 if k < 100 else round((k - 99) * max_delay_s / 100, 6)


class GateExplorer:
    """Sleeps each stream's next seeded delay and keeps what it slept (for the log header)."""

    def __init__(self, seed: int, max_delay_s: float = DEFAULT_MAX_DELAY_S) -> None:
        self.seed, self.max_delay_s = seed, max_delay_s
        self.slept: Dict[str, List[float]] = {}
        self._lock = threading.Lock()

    def pause(self) -> float:
        """Sleep the calling thread's stream's next delay; return it."""
        stream = threading.current_thread().name
        with self._lock:
            done = self.slept.setdefault(stream, [])
            delay = seeded_delay(self.seed, stream, len(done), self.max_delay_s)
            done.append(delay)
        if delay:
            time.sleep(delay)
        return delay

    def describe(self) -> Dict[str, object]:
        """The header's ``meta.explore``: seed, bound, and each stream's delays in order."""
        with self._lock:
            return {
                "seed": self.seed,
                "max_delay_s": self.max_delay_s,
                "delays": {s: list(d) for s, d in sorted(self.slept.items())},
            }
