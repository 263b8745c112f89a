"""The outputs' one-pass tables' inline paths make what their general paths make (issue #42).

``pause_rows`` handles a dispatch and a completion inline (nearly every record of a long
run), with its lookups bound once and the retry and drain tests skipped while nothing was
dropped or drained; everything else goes through ``_Walk``. Held here to a reference that
sends every record through ``_Walk``, on random sequences that include broken ones (a
completion never dispatched, an abort after a completion, a resume never paused).
"""

from __future__ import annotations

import random
from typing import List

from harness.logs.outputs.pause_summary import PauseRow, _Walk, pause_rows


def _pause_rows_reference(records: List[dict]) -> List[PauseRow]:
    walk = _Walk()
    for r in records:
        k = r["kind"]
        if k in ("effect_start", "effect_end"):
            if r["effect"] in ("Abort", "Pause") and r["scope"] == "shrink":
                walk.effect(r)
        elif k == "rank_state":
            if r["state"] in ("asleep", "routable", "stopped"):
                walk.draining.discard((r["pipeline_id"], r["dp_rank"]))
        else:
            walk.request(r)
            if k == "request_done":  # a finished request's dispatch time is not kept
                walk.since.pop((r["pipeline_id"], r["request"]), None)
    return [row for row in walk.rows.values() if row.pauses]


_REQUEST_KINDS = (
    ("request_dispatch",) * 4
    + ("request_done",) * 3
    + (
        "request_abort",
        "request_failed",
        "request_pause",
        "request_resume",
    )
)


def _random_log(rng: random.Random, n: int) -> List[dict]:
    out: List[dict] = []
    for seq in range(n):
        r = {"seq": seq, "t": seq * 0.5, "pipeline_id": rng.choice("pq"), "dp_rank": rng.randrange(3)}
        roll = rng.random()
        if roll < 0.1:
            r["kind"] = rng.choice(("effect_start", "effect_end"))
            r["effect"] = rng.choice(("Abort", "Pause", "Compute"))
            r["scope"] = rng.choice(("shrink", "shrink", "expand"))
            ranks = rng.sample(range(3), rng.randrange(1, 4))
            r["args"] = {"ranks": ranks, "mode": rng.choice(("abort", "wait", "keep"))}
        elif roll < 0.18:
            r["kind"] = "rank_state"
            r["state"] = rng.choice(("asleep", "routable", "stopped", "waking", "draining"))
        else:
            r["kind"] = rng.choice(_REQUEST_KINDS)
            r["request"] = rng.randrange(12)
        out.append(r)
    return out


def test_pause_rows_inline_path_matches_the_general_path():
    rng = random.Random(42)
    nonempty = 0
    for _ in range(300):
        log = _random_log(rng, rng.randrange(1, 160))
        want = _pause_rows_reference(log)
        assert pause_rows(log) == want
        nonempty += any(r.waited or r.retried or r.dropped for r in want)
    assert nonempty > 100  # the drain, retry and drop paths are exercised, not only empty tables
