"""The collector's block-drawn decode lengths equal one draw per call of the same sizes; the
replay buffer's counts and shortcuts keep it what a filter of its item list would be."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from simulators.scenario.spec import WorkloadSpec
from simulators.pipelines.workload import _DRAW_BLOCK, Collector


def _one_call_per_draw(spec: WorkloadSpec, seed: int, sizes):
    """The lengths a generator call per draw gives (what draw did before drawing ahead)."""
    rng = np.random.default_rng(seed)
    out = []
    for n in sizes:
        lengths = np.exp(np.log(spec.decode_tokens_median) + spec.decode_tokens_sigma * rng.standard_normal(n))
        out.append([int(min(max(1.0, round(x)), spec.decode_tokens_max)) for x in lengths.tolist()])
    return out


def test_block_drawn_lengths_equal_a_draw_per_call():
    spec = WorkloadSpec(decode_tokens_median=192, decode_tokens_sigma=1.5, decode_tokens_max=1024)
    # sizes that straddle block ends, a draw larger than a block, and empty draws
    sizes = [1, 2, 0, 5, 1, _DRAW_BLOCK - 3, 7, 1, 3 * _DRAW_BLOCK + 1, 16, 1, 1, 0, 64] * 5
    collector = Collector(spec, "async", np.random.default_rng(7))
    got = [[r.tokens for r in collector.draw(n)] for n in sizes]
    assert got == _one_call_per_draw(spec, 7, sizes)
    flat = [t for d in got for t in d]
    assert max(flat) == 1024 and min(flat) >= 1  # the upper clamp is exercised (sigma 1.5, median 192)
    rids = [r.rid for n in [3, 4] for r in collector.draw(n)]
    assert rids == list(range(sum(sizes), sum(sizes) + 7)) and collector.outstanding == sum(sizes) + 7


def test_a_dead_collector_draws_nothing():
    collector = Collector(WorkloadSpec(), "sync", np.random.default_rng(0))
    collector.dead = True
    assert collector.draw(5) == [] and collector.outstanding == 0


def test_the_replay_buffer_counts_versions_as_its_items_do():
    """``versions`` (what ``usable`` reads) stays the per-version count of ``items`` through
    adds, evictions and takes; a take returns the staleness histogram of the oldest n."""
    from collections import Counter

    from simulators.pipelines.workload import ReplayBuffer

    buf = ReplayBuffer()
    for rid, version in enumerate([0, 0, 1, 2, 2, 2, 3, 1]):
        buf.add(version, rid)
    assert buf.versions == Counter(v for v, _ in buf.items) and buf.usable(3, 1) == 4
    assert buf.take(5, 3, 1) is None  # versions 0 and 1 evicted: 4 usable left
    assert buf.evicted == 4 and buf.versions == {2: 3, 3: 1}
    buf.add(3, 8)
    assert buf.take(4, 3, 1) == {0: 1, 1: 3}  # the oldest four: three of version 2, one of 3
    assert buf.last_taken == [3, 4, 5, 6] and buf.versions == {3: 1} and buf.items == [(3, 8)]
    assert ReplayBuffer(items=[(1, 0), (1, 1), (2, 2)]).versions == {1: 2, 2: 1}


class _ListBuffer:
    """The replay buffer's rule spelled out on the item list alone (what ReplayBuffer's
    per-version counts and its one-stale-item shortcut must reproduce)."""

    def __init__(self):
        self.items, self.evicted, self.last_taken = [], 0, []

    def take(self, n, current, max_age):
        keep = [(v, r) for v, r in self.items if v >= current - max_age]
        self.evicted += len(self.items) - len(keep)
        self.items = keep
        if len(keep) < n:
            return None
        batch, self.items = keep[:n], keep[n:]
        self.last_taken = [r for _, r in batch]
        ages = [current - v for v, _ in batch]
        return {a: ages.count(a) for a in sorted(set(ages))}


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.integers(-1, 4)),
            st.tuples(st.just("take"), st.integers(1, 5), st.integers(0, 5), st.integers(0, 2)),
        ),
        max_size=60,
    )
)
@settings(max_examples=300, deadline=None)
def test_the_replay_buffer_takes_as_a_filter_of_its_item_list_would(ops):
    from simulators.pipelines.workload import ReplayBuffer

    buf, ref = ReplayBuffer(), _ListBuffer()
    for rid, op in enumerate(ops):
        if op[0] == "add":
            buf.add(op[1], rid)
            ref.items.append((op[1], rid))
        else:
            assert buf.take(*op[1:]) == ref.take(*op[1:])
        assert (buf.items, buf.evicted, buf.last_taken) == (ref.items, ref.evicted, ref.last_taken)
        assert buf.versions == {v: [w for w, _ in ref.items].count(v) for v, _ in ref.items}
        assert buf.usable(3, 1) == sum(1 for v, _ in ref.items if v >= 2)


def test_the_cap_share_sends_the_top_draws_to_the_cap():
    # share 0.25: a draw whose normal exceeds the 75th percentile (0.6744897501960817, the
    # standard normal's table value) runs to the cap; the rest keep their log-normal length
    spec = WorkloadSpec(
        decode_tokens_median=100, decode_tokens_sigma=0.5, decode_tokens_max=5000, decode_tokens_cap_share=0.25
    )
    got = [r.tokens for r in Collector(spec, "sync", np.random.default_rng(3)).draw(4000)]
    z = np.random.default_rng(3).standard_normal(4000)
    expected = [
        5000 if x > 0.6744897501960817 else int(min(max(1.0, round(float(np.exp(np.log(100) + 0.5 * x)))), 5000))
        for x in z
    ]
    assert got == expected
    assert 0.23 < got.count(5000) / 4000 < 0.27  # about a quarter, as drawn
