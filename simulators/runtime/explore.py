"""Schedule exploration: a seeded choice wherever the modelled system gives no order.

Without exploration the simulator orders same-time events of different processes by one
fixed key (``simulators/runtime/env.py``): one interleaving per scenario. Real systems promise no
such order -- which engine reaches a rendezvous first, which waiter a lock wakes, which RPC
returns first -- and the bugs reported around weight sync are mostly of that kind. With
``--explore SEED`` a strategy ranks the processes instead, per simulated instant:

* ``random`` (a random walk): every process gets a fresh random rank at every instant it
  has events at, so each seed runs another interleaving of each instant's events.
* ``pct`` (probabilistic concurrency testing, Burckhardt et al., ASPLOS 2010): each process
  gets a random priority once, above ``depth``; ``depth - 1`` change points are drawn
  uniformly among the run's k scheduling points (here: rankings), the i-th drawn one with
  priority i, so that the process ranked at that point drops below every process not yet
  changed, and the changed ones stand in a random order among themselves. k is the number
  of rankings of the scenario's run (``steps=0``, the default: counted once per scenario by
  a pilot run in the fixed order, :func:`pilot_steps`). A bug that needs d ordering
  constraints is found with probability at least 1/(n·k^(d-1)) per seed.

The same ranks decide the two other choices the modelled system leaves open:

* **lock hand-off**: RLix's coordinator lock and cache lock are ``threading.Lock``s, which
  promise no order among waiters; the simulator hands them over FIFO, an explored run to
  the waiter whose process ranks first at that instant (:meth:`Explorer.pick`);
* **small delays** (:meth:`Explorer.delay`): a scheduler RPC's return to its caller, a
  coordinator resize call's arrival, and a lock holder's hold each get, with probability
  1/2, an extra delay in (0, ``max_delay_s``] (10 ms by default: a loaded Ray actor call's
  latency), in steps of ``max_delay_s``/100. They come from a stream of their own
  (``random.Random("explore-delays/SEED")``), so they shift events that are close but not
  simultaneous, which no reordering of one instant can.

What stays fixed: events of one process keep their program order (one rank per process and
instant), and simpy's own priorities (URGENT before NORMAL) come first. So a seed only
reorders what the model leaves unordered, and stretches nothing by more than the bound.
Each seed is deterministic: ranks and delays come from ``random.Random``, which draws the
same numbers on every supported Python.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Dict, Sequence, Tuple

STRATEGIES = ("random", "pct")
PILOT = "fixed"  # internal: every rank 0 and no delay (the fixed key orders), counting rankings
Key = Tuple[int, ...]


@dataclass(frozen=True)
class ExploreSpec:
    seed: int
    strategy: str = "pct"
    depth: int = 3  # pct: ordering constraints a found bug may need
    steps: int = 0  # pct: rankings over which the change points are drawn (0: the run's, counted)
    max_delay_s: float = 0.01  # the bound of one seeded delay (an RPC's return, a lock hold)

    def describe(self) -> Dict[str, object]:
        out: Dict[str, object] = {"seed": self.seed, "strategy": self.strategy}
        if self.strategy == "pct":
            out.update(depth=self.depth, steps=self.steps)
        out["max_delay_s"] = self.max_delay_s
        return out


class Explorer:
    """Ranks (process key, instant) pairs; smaller runs first. One per run."""

    _PURGE_AT = 200_000

    def __init__(self, spec: ExploreSpec) -> None:
        if spec.strategy not in STRATEGIES + (PILOT,):
            raise ValueError(f"unknown exploration strategy {spec.strategy!r}; known: {', '.join(STRATEGIES)}")
        self.spec = spec
        self.rng = random.Random(spec.seed)
        self._ranks: Dict[Tuple[Key, float], float] = {}
        self._priority: Dict[Key, float] = {}
        self._calls = 0
        # change point -> its priority: the i-th drawn gets i (the paper's k_i), so the
        # changed processes' order among themselves is as random as the draw
        self._changes: Dict[int, int] = {}
        if spec.strategy == "pct":
            if spec.steps < 1:
                raise ValueError("pct needs its number of scheduling points (steps >= 1; Simulation counts them)")
            points = self.rng.sample(range(1, spec.steps + 1), min(spec.depth - 1, spec.steps))
            self._changes = {step: i + 1 for i, step in enumerate(points)}
        self.rankings = 0  # distinct (process, instant) pairs ranked: a pilot's k
        self._delays = random.Random(f"explore-delays/{spec.seed}")  # str seeds hash the same on 3.11-3.13
        self._delay_step = spec.max_delay_s / 100

    def rank(self, key: Key, at: float, now: float) -> float:
        """The rank of ``key``'s events that fire at ``at`` (fixed once asked)."""
        slot = (key, at)
        rank = self._ranks.get(slot)
        if rank is not None:
            return rank
        self.rankings += 1
        if self.spec.strategy == "random":
            rank = self.rng.random()
        elif self.spec.strategy == PILOT:
            rank = 0.0
        else:
            rank = -self._pct_priority(key)
        if len(self._ranks) >= self._PURGE_AT:  # instants already past can never be asked again
            self._ranks = {k: v for k, v in self._ranks.items() if k[1] >= now}
        self._ranks[slot] = rank
        return rank

    def _pct_priority(self, key: Key) -> float:
        self._calls += 1
        prio = self._priority.get(key)
        if prio is None:
            prio = self._priority[key] = self.spec.depth + self.rng.random()  # above every change point
        label = self._changes.get(self._calls)
        if label is not None:  # a change point: the ranked process drops to its priority
            prio = self._priority[key] = float(label)
        return prio

    def pick(self, keys: Sequence[Key], now: float) -> int:
        """Which waiter (by its process key) a released lock goes to: the one ranked first
        at this instant, the earliest waiter among equals (so one process's waits stay FIFO)."""
        best, best_rank = 0, None
        for i, key in enumerate(keys):
            rank = self.rank(key, now, now)
            if best_rank is None or rank < best_rank:
                best, best_rank = i, rank
        return best

    def delay(self) -> float:
        """A seeded extra delay: 0 half the time, else k * max_delay_s / 100 for k in 1..100."""
        if self.spec.strategy == PILOT:
            return 0.0
        k = int(self._delays.random() * 200)
        return 0.0 if k < 100 else (k - 99) * self._delay_step


_PILOTS: Dict[str, int] = {}


def pilot_steps(scenario, run) -> int:
    """PCT's k for ``scenario``: the rankings of one run in the fixed order (every rank 0, no
    delay, so the key alone orders), as the paper estimates k from a run of the program.
    ``run(spec)`` runs the scenario under an ExploreSpec and returns its Explorer. Counted
    once per scenario in a process (a sweep of schedule seeds pays for one pilot)."""
    key = repr(scenario)  # a frozen dataclass of plain values: its repr names it whole
    steps = _PILOTS.get(key)
    if steps is None:
        steps = max(1, run(ExploreSpec(0, PILOT, max_delay_s=0.0)).rankings)
        if len(_PILOTS) >= 256:
            _PILOTS.clear()
        _PILOTS[key] = steps
    return steps
