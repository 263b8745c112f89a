"""The streamed view's record times (run-length coded) and chunk split, against the list's view."""

import random

import pytest

from harness.logs.outputs.run_view import RunView
from harness.logs.outputs.streamed_view import StreamedRunView
from tests.unit.output_logs import dense_log


def _log(seed):
    """The dense log with runs of equal times of random lengths (the first record of a
    chunk often shares its time with the last of the one before)."""
    rng = random.Random(seed)
    recs = dense_log()
    t = 0.0
    for r in recs[1:]:
        if rng.random() < 0.6:
            t += rng.choice([0.5, 1.0, 2.0])
        r["t"] = t
    recs[-1]["sim_time"] = t
    return recs


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("per_chunk", [1, 2, 3, 7, 1000])
def test_streamed_view_answers_as_the_lists(seed, per_chunk):
    recs = _log(seed)
    view = StreamedRunView()
    try:
        for at in range(0, len(recs), per_chunk):
            view(recs[at : at + per_chunk])
    finally:
        view.finish()
    whole = RunView(recs)
    want = set(range(-1, len(recs) + 2)) | {"x"}
    assert view.with_seqs(want) == [{"seq": r["seq"], "t": r["t"]} for r in whole.with_seqs(want)]
    assert view.bounds == whole.bounds
    assert view.gpus == whole.gpus and view.pipeline_ids == whole.pipeline_ids
    assert [dict(r) for r in view.of("oom", "sim_end")] == [dict(r) for r in whole.of("oom", "sim_end")]
    assert view.derived("effects") == whole.derived("effects")
    assert view.derived("ranks") == whole.derived("ranks")
