"""Swarm testing of the simulator (a fault mix chosen per example; docs/modelled-systems.md#test-harness-anchors): any mix
of fault hooks, on any pipeline and step, over the small bundled topologies that run
clean without faults.

Whatever the mix, the run ends on its own terms (done, horizon or failed) with no
exception escaping the simulator; a failure is always explained in the log by a fault
that fired, an OOM or an RLix timeout (the topologies complete without faults, so
anything else is a simulator bug); and the same mix twice gives the same log.
"""

from __future__ import annotations

import dataclasses
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import load_scenario
from simulators.scenario.spec import FAULT_NAMES, FaultSpec

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BASES = {
    name: load_scenario(os.path.join(ROOT, "examples", "scenarios", f"{name}.yaml"))
    for name in ("default", "roll_dual_4gpu", "tp2_broadcast", "gap_ratio_3pipelines")
}
EXPLAINING_KINDS = ("fault_fired", "oom", "timeout")


@st.composite
def fault_mixes(draw):
    base = BASES[draw(st.sampled_from(sorted(BASES)))]
    pipelines = [p.name for p in base.pipelines]
    hooks = draw(
        st.lists(
            st.tuples(st.sampled_from(FAULT_NAMES), st.sampled_from(pipelines), st.integers(0, 3)),
            min_size=1,
            max_size=3,
            unique_by=lambda h: (h[0], h[1]),
        )
    )
    return dataclasses.replace(
        base, faults=tuple(FaultSpec(*h) for h in hooks), seed=draw(st.integers(0, 3)), horizon_s=900.0
    )


def test_the_base_topologies_complete_without_faults():
    for name, s in BASES.items():
        res = Simulation(s).run()
        assert res.reason == "done", (name, res.detail)
        assert not [r for r in res.records if r["kind"] in EXPLAINING_KINDS], name


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(fault_mixes())
def test_any_mix_of_faults_ends_on_its_own_terms_and_explains_a_failure(scenario):
    res = Simulation(scenario).run()  # an exception escaping here is a simulator bug
    end = res.records[-1]
    assert end["kind"] == "sim_end" and end["reason"] == res.reason in ("done", "horizon", "failed")
    if res.reason == "failed":
        assert any(r["kind"] in EXPLAINING_KINDS for r in res.records), res.detail
    assert list(Simulation(scenario).run().log.lines()) == list(res.log.lines())
