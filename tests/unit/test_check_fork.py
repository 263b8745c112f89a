"""The oracle split over a forked child (simulators/verdict/check_fork.py) finds exactly what one
process finds, writes the same outputs, and survives a child that fails."""

from __future__ import annotations

import filecmp
import os

import pytest

from harness.logs.invariants import CHECKS, check_log
from harness.logs.invariants.base import READS, SEES, Violation
from simulators.verdict.check_fork import check_beside
from simulators.run import OUTPUT_FILES, write_outputs
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import load_scenario

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork: the split needs it (one process otherwise)")


@pytest.fixture(scope="module")
def run():
    # findings of several checks, handover's among them (the summary's table)
    return Simulation(
        load_scenario(os.path.join(ROOT, "examples", "scenarios", "handover_old_log_probs_oom.yaml"))
    ).run()


def test_a_forked_split_finds_what_one_process_finds(run):
    whole = check_log(run.records)
    assert {v.invariant for v in whole} >= {"handover"}
    found, here = check_beside(run.records, lambda mine: mine, fork=True)
    assert found == whole
    assert sorted(here["handover"], key=lambda v: v.seq) == [v for v in whole if v.invariant == "handover"]
    assert check_beside(run.records, lambda mine: mine, fork=False) == (found, here)


def test_the_outputs_are_the_same_files_with_and_without_the_fork(run, tmp_path):
    one = write_outputs(run, str(tmp_path / "one"), fork=False, png=False)
    two = write_outputs(run, str(tmp_path / "two"), fork=True, png=False)
    assert one.violations == two.violations and one.summary == two.summary
    names = [f for f in OUTPUT_FILES if (tmp_path / "one" / f).exists()]
    assert len(names) == len(OUTPUT_FILES) - 1  # all but the picture
    assert [f for f in names if not filecmp.cmp(tmp_path / "one" / f, tmp_path / "two" / f, shallow=False)] == []
    assert sorted(os.listdir(tmp_path / "two")) == sorted(names)


def test_a_child_that_fails_leaves_its_share_to_the_parent(run, tmp_path):
    parent = os.getpid()

    def only_here(records):  # raises in the forked child, finds one thing in the parent
        if os.getpid() != parent:
            raise RuntimeError("child")
        return [Violation("_fork_probe", records[-1]["seq"], "probe")]

    marks = tmp_path / "written_by"

    def child_work():
        with open(marks, "a") as fh:
            fh.write(f"{os.getpid()}\n")

    CHECKS["_fork_probe"], READS["_fork_probe"], SEES["_fork_probe"] = only_here, None, None
    try:
        found, _ = check_beside(run.records, lambda mine: None, child_work=child_work, fork=True)
        assert found == check_log(run.records)
        assert Violation("_fork_probe", run.records[-1]["seq"], "probe") in found
    finally:
        for registry in (CHECKS, READS, SEES):
            registry.pop("_fork_probe", None)
    assert marks.read_text() == f"{parent}\n"  # the child failed before its work: done once, here


def test_the_split_is_taken_only_with_a_cpu_to_spare(monkeypatch):
    from simulators.verdict import check_fork

    monkeypatch.setattr(check_fork.os, "getloadavg", lambda: (0.4, 0.0, 0.0))
    assert check_fork._spare_cpu(2) and not check_fork._spare_cpu(1)
    monkeypatch.setattr(check_fork.os, "getloadavg", lambda: (1.6, 0.0, 0.0))
    assert not check_fork._spare_cpu(2) and check_fork._spare_cpu(4)
    assert not check_fork.fork_worthwhile([{}] * 10)  # a short log: never
