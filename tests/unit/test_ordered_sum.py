"""Float totals that keep Python 3.11's bits on 3.12 and 3.13 (harness/ordered_sum.py).

3.12's builtin ``sum()`` compensates the rounding of float additions; 3.11's adds left to
right. The summaries of the default scenario had step means and idle times that differed in
the last bits between the two (summary.json of 18 bundled runs); these tests pin
the left-to-right result on whatever interpreter runs them."""

from __future__ import annotations

import random

from harness.ordered_sum import ordered_sum
from harness.logs.outputs import summarize
from simulators.runtime.simulation import Simulation
from simulators.scenario.spec import default_scenario


def _left_to_right(values):
    total = 0
    for v in values:
        total = total + v
    return total


def test_floats_add_left_to_right_without_compensation():
    assert ordered_sum([0.1] * 10) == 0.9999999999999999  # compensated: 1.0
    assert ordered_sum([1e16, 1.0, -1e16]) == 0.0  # compensated: 1.0
    rng = random.Random(7)
    for _ in range(200):
        values = [rng.uniform(-1e3, 1e3) * 10 ** rng.randint(-8, 8) for _ in range(rng.randint(0, 40))]
        assert ordered_sum(values) == _left_to_right(values)
        assert ordered_sum(iter(values)) == _left_to_right(values)


def test_integers_stay_exact_integers_and_nothing_sums_to_the_integer_zero():
    assert ordered_sum([]) == 0 and type(ordered_sum([])) is int
    assert ordered_sum([2**70, 1, -(2**70)]) == 1
    assert type(ordered_sum([1, 2.0])) is float


def test_the_summary_step_means_are_left_to_right_totals():
    # the default scenario's step times round differently when their sum is compensated
    summary = summarize(Simulation(default_scenario()).run().records)
    rounded_differently = 0
    for p in summary.pipelines:
        assert p.mean_step_s == _left_to_right(p.step_times) / len(p.step_times)
        rounded_differently += _left_to_right(p.step_times) != _compensated(p.step_times)
    assert rounded_differently > 0  # else this scenario could not tell the two apart


def _compensated(values):
    """Neumaier's summation, as CPython 3.12's ``sum()`` of floats does it."""
    total, comp = 0.0, 0.0
    for v in values:
        t = total + v
        comp += (total - t) + v if abs(total) >= abs(v) else (v - t) + total
        total = t
    return total + comp
