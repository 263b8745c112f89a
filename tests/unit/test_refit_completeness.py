"""Refit completeness: the ``refit_payload`` check over logs, and a
tensor larger than a ping-pong buffer going through (NeMo RL #3280: sent alone) at the
boundary (exactly the buffer, one byte over) and well above it (1.05x, 3x) — in the
protocol, on the real transport and in the simulator's refit cost model."""

from __future__ import annotations

import pytest
import torch

from harness.logs.invariants import check_log
from harness.refit import stream as proto
from simulators.refit.sync import StreamCosts, predict_sync_seconds
from tests.unit.refit_pair import Log, drive_sender, endpoint, run_pair, specs_of_sizes  # noqa: F401 (fixture)

BUDGET = 16384
HALF = BUDGET // 2  # 8192: the capacity and the allocated size of each ping-pong buffer
SIZES = {"exact": HALF, "one_byte_over": HALF + 1, "1.05x": int(HALF * 1.05), "3x": 3 * HALF}


def _log(required, expected, received, step=0, rank=1):
    base = {"t": 0.0, "rank": rank, "step": step, "peer": "rank 0", "role": "receiver"}
    recs = [
        {"kind": "engine_required", "names": list(required)},
        {"kind": "refit_stream_begin", "expected": list(expected)},
        {
            "kind": "refit_group_recv",
            "group": 0,
            "buffer": "0",
            "bytes": 512,
            "names": list(received),
            "offsets": [0] * len(received),
        },
        {"kind": "refit_finalize", "groups": 1},
    ]
    return [{**base, **r, "seq": i} for i, r in enumerate(recs)]


def test_a_payload_without_the_kv_scales_fails_naming_them():
    params = ["embed", "proj_weight"]
    scales = ["layers.0.attn.k_scale", "layers.0.attn.v_scale"]
    (v,) = check_log(_log(params + scales, params, params), ["refit_payload"])
    assert "rank 1 refit step 0" in v.message and "'layers.0.attn.k_scale', 'layers.0.attn.v_scale'" in v.message
    assert "manifest did not list them either" in v.message and "'embed'" not in v.message


def test_the_complete_payload_is_clean_and_a_listed_but_lost_tensor_is_told_apart():
    names = ["embed", "layers.0.attn.k_scale"]
    assert check_log(_log(names, names, names), ["refit_payload"]) == []
    (v,) = check_log(_log(names, names, ["embed"]), ["refit_payload"])
    assert "manifest listed 1 of them" in v.message


def test_a_refit_that_never_finalized_is_not_judged_by_this_check():
    recs = _log(["a", "b"], ["a"], ["a"])[:-1]
    assert check_log(recs, ["refit_payload"]) == []


@pytest.mark.parametrize("case", sorted(SIZES))
def test_protocol_sends_a_tensor_around_the_buffer_size_exactly_once(case):
    n = SIZES[case]
    effects = drive_sender(specs_of_sizes([100, n, 100]), BUDGET)
    sends = [(e.buffer, [s.name for s in e.slots]) for e in effects if isinstance(e, proto.SendGroup)]
    if case == "exact":  # fills one buffer by itself: flushed around it, no dedicated buffer
        assert sends == [(0, ["t0"]), (1, ["t1"]), (0, ["t2"])]
    else:  # alone in a dedicated buffer of its own aligned size, order kept
        assert sends == [(0, ["t0"]), (proto.DEDICATED, ["t1"]), (1, ["t2"])]
        (alloc,) = [e for e in effects if isinstance(e, proto.AllocDedicated)]
        assert alloc.nbytes == proto.align_up(n) > HALF


@pytest.mark.parametrize("case", ["exact", "one_byte_over", "3x"])
def test_real_transport_carries_it_bit_exact(endpoint, case):  # noqa: F811 (the fixture)
    n = SIZES[case]
    g = torch.Generator().manual_seed(n)
    named = [
        (f"t{i}", torch.randint(0, 256, (k,), generator=g, dtype=torch.uint8)) for i, k in enumerate([300, n, 300])
    ]
    log = Log()
    res, outcome, dst = run_pair(endpoint, named, BUDGET, log=log)
    assert outcome["result"].finalized and all(torch.equal(dst[k], t) for k, t in named)
    assert res.dedicated_bytes == (0 if case == "exact" else proto.align_up(n))
    assert check_log(log.records, ["refit_wire"]) == []


def test_simulated_time_of_an_oversized_tensor_is_its_own_staging_plus_pack_and_load():
    """Closed form, independent of the interpreter: setup + (dedicated staging) + pack +
    load + COMPLETE for a tensor alone; no dedicated staging when it fits exactly."""
    c = StreamCosts(pack_bytes_per_s=1e6, load_bytes_per_s=2e6, setup_s=0.01, staging_bytes_per_s=4e6, complete_s=0.002)
    for case, n in SIZES.items():
        staging = 0.0 if case == "exact" else proto.align_up(n) / c.staging_bytes_per_s
        expected = c.setup_s + staging + n / c.pack_bytes_per_s + n / c.load_bytes_per_s + c.complete_s
        got = predict_sync_seconds(specs_of_sizes([n]), BUDGET, c)
        assert got == pytest.approx(expected, rel=1e-12), case
