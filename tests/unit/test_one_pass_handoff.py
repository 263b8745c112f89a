"""The one-pass hand-off (harness/logs/one_pass.py): a function written over a list runs
over pushed batches in the caller's own thread, strictly alternating with it, and a run
abandoned (its caller failing) is ended, its function's loop closed."""

from __future__ import annotations

import threading

from harness.logs.one_pass import OnePassRun, abandon


def _records(n: int, start: int = 0) -> list:
    return [{"seq": i, "t": float(i), "kind": "x"} for i in range(start, start + n)]


def test_the_function_runs_in_the_callers_thread_alternating_with_it():
    seen: list = []
    threads: set = set()

    def fn(view):
        threads.add(threading.get_ident())
        for r in view:
            seen.append(r["seq"])
        threads.add(threading.get_ident())
        return len(seen)

    run = OnePassRun(fn, None, "probe")
    for start in (0, 3, 5):
        run.push(_records(3 if start == 0 else 2, start))
        assert seen[-1] == (2 if start == 0 else start + 1)  # each batch read before push returns
    assert run.finish() == 7
    assert seen == list(range(7))
    assert threads == {threading.get_ident()}  # no thread of its own: no wake-ups per batch


def test_an_abandoned_run_is_ended():
    ended: list = []

    def fn(view):
        try:
            for _r in view:
                pass
        finally:
            ended.append(True)

    run = OnePassRun(fn, None, "abandoned")
    run.push(_records(2))
    assert ended == []
    abandon([run])
    assert ended == [True] and run.ended
