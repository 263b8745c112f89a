"""The oracle hands each check only the record kinds it declares (``reads`` + ``sees``);
on real logs — bundled scenarios with findings of many checks, replayed traces — every
check finds exactly what it finds walking the whole log, so the declarations are whole."""

from __future__ import annotations

import glob
import os

import pytest

from harness.logs.invariants import CHECKS, SEES, check_log, kind_views
from harness.logs.replay import replay_file
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import load_scenario

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# small scenarios whose logs hold findings of many checks and records of most kinds
SCENARIOS = (
    "handover_old_log_probs_oom",
    "stranded_sync_group",
    "nccl_kept_on_sleep",
    "lost_finish",
    "streaming_vs_batch",
    "dataplane_via_driver",
    "cache_built_after_offload",
    "gap_ratio_3pipelines",
    "expand_fails_midway",
    "tp2_broadcast",
)


def _logs(scenarios=SCENARIOS):
    """(name, a function making its records) of each scenario, then of each replayed trace."""
    for name in scenarios:
        yield (
            name,
            lambda name=name: (
                Simulation(load_scenario(os.path.join(ROOT, "examples", "scenarios", name + ".yaml"))).run().records
            ),
        )
    for path in sorted(glob.glob(os.path.join(ROOT, "examples", "traces", "*.jsonl"))):
        yield os.path.basename(path), lambda path=path: replay_file(path).log.records


@pytest.mark.parametrize("name,records", list(_logs()), ids=lambda x: x if isinstance(x, str) else "")
def test_each_check_finds_on_its_view_what_it_finds_on_the_whole_log(name, records):
    records = records()
    views = kind_views(records, SEES.values())
    for check, fn in CHECKS.items():
        assert fn(views[SEES[check]]) == fn(records), check
    assert check_log(records) == sorted(
        (v for fn in CHECKS.values() for v in fn(records)), key=lambda v: (v.seq, v.invariant)
    )


def test_a_view_keeps_log_order_and_the_first_and_last_record():
    records = [
        {"seq": 0, "kind": "header"},
        {"seq": 1, "kind": "plan"},
        {"seq": 2, "kind": "vram"},
        {"seq": 3, "kind": "plan"},
        {"seq": 4, "kind": "sim_end"},
    ]
    views = kind_views(records, [frozenset({"plan"}), None, frozenset({"header", "sim_end"})])
    assert [r["seq"] for r in views[frozenset({"plan"})]] == [0, 1, 3, 4]
    assert views[None] is records
    assert [r["seq"] for r in views[frozenset({"header", "sim_end"})]] == [0, 4]
    assert kind_views([], [frozenset({"plan"})]) == {frozenset({"plan"}): []}
