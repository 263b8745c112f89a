"""The simpy environment with an explicit order for events at the same simulated time.

simpy orders events by (time, priority, insertion counter); two processes waking at the
same instant therefore run in whatever order their events happened to be created. That
is deterministic for one program, but fragile: an unrelated change in creation order
silently reorders a log. Here every process carries an ``order_key`` (a tuple of ints)
and an event is keyed by the process that scheduled it:

    (time, (simpy priority, order_key of the scheduling process), insertion counter)

Keys, smallest first (see ``ORDER``): the scheduler loop, then pipelines by their index
in the scenario, then coordinator resize calls, then inference ranks, then request
completions. Within one process, program order decides (the insertion counter).
"""

from __future__ import annotations

from heapq import heappush
from typing import Any, Dict, Generator, Tuple

import simpy
from simpy.core import NORMAL, URGENT
from simpy.events import Process

ORDER = {
    "scheduler": 0,
    "pipeline": 1,
    "resize": 2,
    "watchdog": 3,
    "collector": 4,
    "rank": 5,
}
ROOT_KEY: Tuple[int, ...] = (-1,)


def _keyed_prios(key: Tuple[int, ...]) -> Dict[int, Tuple[int, Tuple[int, ...]]]:
    """The heap priorities (simpy priority, order key) of one process, built once."""
    return {URGENT: (URGENT, key), NORMAL: (NORMAL, key)}


_ROOT_PRIOS = _keyed_prios(ROOT_KEY)


class SimEnv(simpy.Environment):
    """simpy.Environment whose same-time tie-break is the scheduling process's key."""

    def schedule(self, event: Any, priority: Any = NORMAL, delay: float = 0) -> None:
        if isinstance(priority, tuple):  # already keyed (re-schedule)
            prio = priority
        else:
            proc = self._active_proc
            prios = getattr(proc, "order_prios", _ROOT_PRIOS) if proc is not None else _ROOT_PRIOS
            prio = prios.get(priority)
            if prio is None:
                prio = (int(priority), getattr(proc, "order_key", ROOT_KEY) if proc is not None else ROOT_KEY)
        heappush(self._queue, (self._now + delay, prio, next(self._eid), event))

    def spawn(self, generator: Generator, kind: str, *ids: int) -> Process:
        """Start a process with the order key (ORDER[kind], *ids)."""
        proc = _KeyedProcess(self, generator, (ORDER[kind], *ids))
        return proc

    def scheduled_events(self) -> int:
        """How many events have been scheduled so far (consumes one counter value)."""
        return next(self._eid)


class _KeyedProcess(Process):
    def __init__(self, env: SimEnv, generator: Generator, key: Tuple[int, ...]) -> None:
        self.order_key = key  # set before Process.__init__ schedules the Initialize event
        self.order_prios = _keyed_prios(key)
        super().__init__(env, generator)

