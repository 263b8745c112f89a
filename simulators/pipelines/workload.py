"""Rollout workload: trajectory requests, their decode lengths, and the replay buffer.

One request is one trajectory (a prompt's generation); a step needs
``prompts_per_step × generations_per_prompt`` of them. Decode lengths are log-normal
around a median with a long tail, capped, drawn from the run's seeded generator.

* ``sync`` collection (ROLL): a step's requests are submitted when its batch opens and
  every trajectory of the batch is generated for that step.
* ``async`` collection (NeMo async GRPO): generation runs ahead of training, keeping
  at most ``(max_trajectory_age_steps + 1)`` steps' worth of trajectories queued, in
  flight or buffered; the trainer takes a batch only from trajectories whose version is
  within the age window and older ones are evicted (docs/modelled-systems.md#nemo-rl-async-grpo).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from simulators.costmodel.formulas import cap_quantile
from simulators.pipelines.inference import Request
from simulators.scenario.spec import WorkloadSpec


@dataclass
class ReplayBuffer:
    items: List[Tuple[int, int]] = field(default_factory=list)  # (version, request id), FIFO
    evicted: int = 0
    last_taken: List[int] = field(default_factory=list, compare=False)  # request ids of the last batch
    # version -> how many items carry it (never 0: a version whose last item leaves is
    # deleted); kept in step with ``items`` by add/take so that ``usable`` (called on every
    # completion) is O(versions) instead of O(items). A plain dict: Counter's ``del`` and
    # ``subtract`` are Python-level methods, and every stale trajectory's wake deletes one.
    versions: Dict[int, int] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for v, _ in self.items:
            self.versions[v] = self.versions.get(v, 0) + 1

    def add(self, version: int, rid: int) -> None:
        self.items.append((version, rid))
        versions = self.versions
        versions[version] = versions.get(version, 0) + 1

    def usable(self, current: int, max_age: int) -> int:
        oldest = current - max_age
        n = 0
        for v, c in self.versions.items():
            if v >= oldest:
                n += c
        return n

    def take(self, n: int, current: int, max_age: int) -> Optional[Dict[int, int]]:
        """Evict stale trajectories; if n usable remain, consume the oldest n and return
        the staleness histogram {age in steps: count}; else None (training waits)."""
        oldest = current - max_age
        versions, items = self.versions, self.items
        stale = 0  # how many items are too old: the counts of the stale versions
        gone = None
        for v, c in versions.items():
            if v < oldest:
                stale += c
                if gone is None:
                    gone = [v]
                else:
                    gone.append(v)
        if gone is not None:
            for v in gone:
                del versions[v]
            self.evicted += stale
            if stale == 1 and items[-1][0] < oldest:
                # the one stale item is the newest (the common case: a sync pipeline wakes for
                # each stale trajectory as it arrives): what the filter below would leave
                items.pop()
            else:
                self.items = items = [item for item in items if item[0] >= oldest]
        if len(items) < n:
            return None
        batch, self.items = items[:n], items[n:]
        self.last_taken = [r for _, r in batch]
        for v, _ in batch:
            left = versions[v] - 1
            if left:
                versions[v] = left
            else:
                del versions[v]
        return dict(sorted(Counter(current - v for v, _ in batch).items()))


_DRAW_BLOCK = 256  # decode lengths drawn per numpy call (see Collector)


class Collector:
    """Draws the requests of one pipeline from its seeded generator.

    Decode lengths are drawn a block at a time and handed out in order: the generator's
    normals come out of ``standard_normal(a)`` then ``standard_normal(b)`` exactly as
    out of one ``standard_normal(a + b)``, and every later step (exp, round half to even,
    clamp) is element-wise, so each request gets the length a draw of its own size would
    have given it (``tests/sim/test_workload.py`` pins this). The generator is this
    collector's alone; one numpy call per block instead of per refill of one or two
    requests is what makes it worth it (an async refill draws at every completion)."""

    def __init__(self, spec: WorkloadSpec, mode: str, rng: np.random.Generator) -> None:
        self.spec = spec
        self.mode = mode
        self.rng = rng
        self.next_rid = 0
        self.outstanding = 0  # submitted and not yet completed
        self.dead = False  # fault collector_dies: nothing is drawn any more
        self._log_median = np.log(spec.decode_tokens_median)  # the spec is frozen
        self._cap_z = cap_quantile(spec.decode_tokens_cap_share)
        self._tokens: List[int] = []  # decode lengths drawn ahead, handed out from ``_next``
        self._next = 0

    def _lengths(self, n: int) -> List[int]:
        """The next ``n`` decode lengths from the generator (one numpy pass)."""
        s = self.spec
        z = self.rng.standard_normal(n)
        lengths = np.exp(self._log_median + s.decode_tokens_sigma * z)
        if self._cap_z is not None:  # the top share of the draws runs to the cap (element-wise: blocks stay exact)
            lengths = np.where(z > self._cap_z, float(s.decode_tokens_max), lengths)
        # np.rint rounds half to even exactly as round() does
        return np.minimum(np.maximum(1.0, np.rint(lengths)), s.decode_tokens_max).astype(np.int64).tolist()

    def draw(self, n: int) -> List[Request]:
        if self.dead:
            return []
        i, tokens = self._next, self._tokens
        if i + n > len(tokens):  # the block is spent: the rest of it, then a new one
            tokens = self._tokens = tokens[i:] + self._lengths(max(n, _DRAW_BLOCK))
            i = 0
        self._next = i + n
        rid = self.next_rid
        # one at a time is the common draw (an async refill after a completion)
        out = [Request(rid, tokens[i])] if n == 1 else [Request(rid + k, tokens[i + k]) for k in range(n)]
        self.next_rid = rid + n
        self.outstanding += n
        return out

    def refill(self, buffered: int) -> int:
        """Async mode: how many new requests to submit to keep the pipeline ahead."""
        if self.mode != "async":
            return 0
        window = (self.spec.max_trajectory_age_steps + 1) * self.spec.trajectories_per_step
        return max(0, window - buffered - self.outstanding)
