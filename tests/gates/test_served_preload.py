"""The launch server's preloads (tests/gates/launch_forked.py): a module a launch preloads
that the server lacks is imported by the server before it forks that launch, once; one
that cannot be imported is left to the launch (which fails on it as the program would);
flags after the torchrun command line are the gate's, never preloads."""

import sys

from tests.gates.launch_forked import _import_preloads

ABSENT = "no_such_module_for_the_preload_test"


def test_a_preload_the_server_lacks_is_imported_and_a_broken_one_is_left_to_the_launch(monkeypatch):
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    _import_preloads(["--preload", "colorsys", "--preload", ABSENT, "--nproc-per-node", "2", "gate.py"])
    assert "colorsys" in sys.modules and ABSENT not in sys.modules


def test_an_imported_module_is_not_imported_again_and_gate_flags_are_not_preloads(monkeypatch):
    already = object()
    monkeypatch.setitem(sys.modules, "already_there_for_the_preload_test", already)
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    _import_preloads(["--preload", "already_there_for_the_preload_test", "gate.py", "--preload", "colorsys"])
    assert sys.modules["already_there_for_the_preload_test"] is already
    assert "colorsys" not in sys.modules  # after the gate file: the gate's own flag
