"""``liveness`` online reads the wait-for graph the oracle's shared pass builds (issue #42).

Online, ``liveness`` cannot skip its walk (the log's end is not known until it comes), and
it used to build the wait-for graph in its own pass, for the chain of waits a stalled
effect names, beside the pass that builds the same graph for ``deadlock``,
``lost_wakeup`` and ``hot_state``. Beside that pass it now asks it for its graph at the
log's end; alone, or replaced by hand, it builds its own as before.
"""

from __future__ import annotations

import pytest

from harness.logs.invariants import CHECKS, check_log
from harness.logs.invariants import waitfor
from harness.logs.invariants.online import OnlineOracle
from tests.sim.test_waitfor_liveness import _lock, _log

SHORT = {"timeouts": {"await_release_s": 100.0, "resize_lock_s": 60.0, "selective_sync_s": 50.0, "shrink_drain_s": 5.0}}


def _stalled_log():
    held = [
        _lock(0.0, "effect_start", "LockCoordinator", "step"),
        _lock(0.0, "effect_end", "LockCoordinator", "step"),
        _lock(1.0, "effect_start", "LockCoordinator", "shrink", 4),
    ]
    end = (200.0, "sim_end", {"reason": "horizon", "sim_time": 200.0, "events": 1})
    return _log(*held, end, meta=SHORT)


def _online(records, chunk, names):
    oracle = OnlineOracle(names)
    for i in range(0, len(records), chunk):
        oracle(records[i : i + chunk])
    return oracle.finish()


def _count_graph_walks(monkeypatch):
    made = [0]
    init = waitfor.GraphWalk.__init__

    def counted(self, first):
        made[0] += 1
        init(self, first)

    monkeypatch.setattr(waitfor.GraphWalk, "__init__", counted)
    return made


@pytest.mark.parametrize("chunk", (1, 7, 4096))
def test_liveness_beside_the_shared_graph_finds_what_it_finds_alone(chunk, monkeypatch):
    records = _stalled_log()
    want = check_log(records, ["liveness"])
    assert len(want) == 1 and "chain of waits: p/shrink@cycle4" in want[0].message
    made = _count_graph_walks(monkeypatch)
    assert _online(records, chunk, ["liveness"])["liveness"] == want  # alone: its own graph
    assert made[0] == 1
    made[0] = 0
    found = _online(records, chunk, ["deadlock", "liveness", "lost_wakeup"])
    assert found["liveness"] == want
    assert made[0] == 1  # one graph for the four checks (it was two: the shared pass's and liveness's)


def test_a_replaced_liveness_runs_as_itself_beside_the_shared_graph(monkeypatch):
    records = _stalled_log()
    original = CHECKS["liveness"]
    calls = []

    def replaced(view):
        calls.append(1)
        return original(view)

    monkeypatch.setitem(CHECKS, "liveness", replaced)
    made = _count_graph_walks(monkeypatch)
    found = _online(records, 7, ["deadlock", "liveness"])
    assert calls == [1] and made[0] == 2 and found["liveness"] == check_log(records, ["liveness"])


def test_a_run_that_ends_without_a_stall_never_asks_for_the_graph():
    records = _stalled_log()[:-1] + [dict(_stalled_log()[-1], reason="done")]
    assert _online(records, 3, ["deadlock", "liveness"]) == {"deadlock": [], "liveness": []}
