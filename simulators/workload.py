"""Rollout workload: trajectory requests, their decode lengths, and the replay buffer.

One request is one trajectory (a prompt's generation); a step needs
``prompts_per_step × generations_per_prompt`` of them. Decode lengths are log-normal
around a median with a long tail, capped, drawn from the run's seeded generator.

* ``sync`` collection (ROLL): a step's requests are submitted when its batch opens and
  every trajectory of the batch is generated for that step.
* ``async`` collection (NeMo async GRPO): generation runs ahead of training, keeping
  at most ``(max_trajectory_age_steps + 1)`` steps' worth of trajectories queued, in
  flight or buffered; the trainer takes a batch only from trajectories whose version is
  within the age window and older ones are evicted (reference/nemo_rl.md §2.1).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from simulators.inference import Request
from simulators.spec import WorkloadSpec


@dataclass
class ReplayBuffer:
    items: List[Tuple[int, int]] = field(default_factory=list)  # (version, request id), FIFO
    evicted: int = 0

    def add(self, version: int, rid: int) -> None:
        self.items.append((version, rid))

    def usable(self, current: int, max_age: int) -> int:
        return sum(1 for v, _ in self.items if v >= current - max_age)

    def take(self, n: int, current: int, max_age: int) -> Optional[Dict[int, int]]:
        """Evict stale trajectories; if n usable remain, consume the oldest n and return
        the staleness histogram {age in steps: count}; else None (training waits)."""
        keep = [(v, r) for v, r in self.items if v >= current - max_age]
        self.evicted += len(self.items) - len(keep)
        self.items = keep
        if len(keep) < n:
            return None
        batch, self.items = keep[:n], keep[n:]
        return dict(sorted(Counter(current - v for v, _ in batch).items()))


class Collector:
    def __init__(self, spec: WorkloadSpec, mode: str, rng: np.random.Generator) -> None:
        self.spec = spec
        self.mode = mode
        self.rng = rng
        self.next_rid = 0
        self.outstanding = 0  # submitted and not yet completed

    def draw(self, n: int) -> List[Request]:
        s = self.spec
        lengths = np.exp(np.log(s.decode_tokens_median) + s.decode_tokens_sigma * self.rng.standard_normal(n))
        out = []
        for x in lengths:
            out.append(Request(self.next_rid, int(min(max(1.0, round(float(x))), s.decode_tokens_max))))
            self.next_rid += 1
        self.outstanding += n
        return out

    def refill(self, buffered: int) -> int:
        """Async mode: how many new requests to submit to keep the pipeline ahead."""
        if self.mode != "async":
            return 0
        window = (self.spec.max_trajectory_age_steps + 1) * self.spec.trajectories_per_step
        return max(0, window - buffered - self.outstanding)
