"""The teardown gate's peer-died case on gloo (gpu_gates/teardown/peer_died.py,
sgl-project/SpecForge #781): a collective with a dead peer fails, both teardowns return, and
a teardown that hangs is named within the deadline without hanging the gate."""

import time

import pytest

torch = pytest.importorskip("torch")

from gpu_gates.teardown.peer_died import main, run_case  # noqa: E402

pytestmark = pytest.mark.gate


@pytest.mark.parametrize("mode", ["destroy", "abort"])
def test_teardown_after_a_peer_died_returns_on_gloo(mode):
    report = run_case(mode, "gloo", deadline_s=10.0)
    assert report["ok"], report
    assert report["teardown_returned"] is True and report["collective"].startswith("raised ")
    assert "finding" not in report


def test_a_hung_teardown_is_named_within_the_deadline():
    start = time.monotonic()
    report = run_case("destroy", "gloo", deadline_s=1.0, hook="hang_teardown")
    assert time.monotonic() - start < 30
    assert report["ok"] is False and report["teardown_returned"] is False
    assert report["finding"] == "destroy did not return within 1 s after a peer died (sgl-project/SpecForge #781)"


def test_a_bad_deadline_is_refused_before_any_process_starts(capsys):
    assert main(["--deadline-s", "0"]) == 2
    assert capsys.readouterr().err == "error: --deadline-s: must be positive\n"
