"""The sans-IO refit stream protocol (harness/refit/stream.py) and ``refit_wire`` over it.

The sender is driven with an instant runtime; its effects become the wire records the
real transport writes, and ``refit_wire`` (harness/logs/invariants/refit_wire.py) reads them.
Sizes are drawn around the alignment and buffer boundaries (Hypothesis)."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.logs.invariants import check_log
from harness.refit import stream as proto
from tests.unit.refit_pair import drive_sender, specs_of_sizes


def wire_records(effects, half):
    """What the real sender would log for these effects (same record shapes)."""
    recs = [{"kind": "refit_stream_begin", "role": "sender", "half_bytes": half}]
    for e in effects:
        if isinstance(e, proto.SendGroup):
            recs.append(
                {
                    "kind": "refit_group_send",
                    "group": e.group,
                    "buffer": str(e.buffer),
                    "bytes": e.used_bytes,
                    "names": [s.name for s in e.slots],
                    "offsets": [s.offset for s in e.slots],
                    "sizes": [s.nbytes for s in e.slots],
                }
            )
        elif isinstance(e, proto.AwaitAck):
            recs.append({"kind": "refit_ack", "group": str(e.group)})
        elif isinstance(e, proto.SendComplete):
            recs.append({"kind": "refit_complete_send", "groups": e.groups})
    return [{"seq": i, "t": 0.0, "step": 0, "peer": "rx", "role": "sender", **r} for i, r in enumerate(recs)]


def boundary_sizes(half):
    return st.sampled_from(
        [
            0,
            1,
            2,
            255,
            511,
            512,
            513,
            1023,
            1024,
            1025,
            half - 513,
            half - 512,
            half - 511,
            half - 1,
            half,
            half + 1,
            2 * half,
            half // 2,
            half // 2 + 1,
        ]
    ).filter(lambda n: n >= 0)


@st.composite
def stream_case(draw):
    half = draw(st.sampled_from([1024, 1536, 2048, 4096]))
    sizes = draw(st.lists(st.one_of(boundary_sizes(half), st.integers(0, 3 * half)), max_size=25))
    return 2 * half, sizes


@settings(max_examples=300, deadline=None, derandomize=True)
@given(stream_case())
def test_sender_keeps_every_wire_invariant(case):
    budget, sizes = case
    half = proto.half_buffer_bytes(budget)
    cap = proto.half_capacity_bytes(budget)
    specs = specs_of_sizes(sizes)
    effects = drive_sender(specs, budget)
    assert effects[-1] == ("return", sum(isinstance(e, proto.SendGroup) for e in effects))
    assert check_log(wire_records(effects, half), ["refit_wire"]) == []
    # every tensor packed and sent exactly once, in order
    packed = [s.name for e in effects if isinstance(e, proto.Pack) for s in e.slots]
    sent = [s.name for e in effects if isinstance(e, proto.SendGroup) for s in e.slots]
    assert packed == sent == [s.name for s in specs]
    sends = [e for e in effects if isinstance(e, proto.SendGroup)]
    for i, e in enumerate(sends):
        oversized = [s for s in e.slots if proto.align_up(s.nbytes) > cap]
        if e.buffer == proto.DEDICATED:  # alone, and ACKed before anything else happens
            assert len(e.slots) == 1 and oversized
            k = effects.index(e)
            assert effects[k + 1] == proto.AwaitAck(e.group) and effects[k + 2] == proto.FreeDedicated(e.group)
        else:
            assert not oversized and e.used_bytes <= cap
            nxt = sends[i + 1] if i + 1 < len(sends) else None
            if nxt is not None and nxt.buffer != proto.DEDICATED:  # flushed only because the next did not fit
                assert e.used_bytes + proto.align_up(nxt.slots[0].nbytes) > cap
    pingpong = [e.buffer for e in sends if e.buffer != proto.DEDICATED]
    assert all(a != b for a, b in zip(pingpong, pingpong[1:]))  # the two buffers alternate
    acks = [e for e in effects if isinstance(e, proto.AwaitAck)]
    assert len(acks) == len(sends) + 1 and acks[-1].group == proto.COMPLETE
    # buffers are released before COMPLETE (as NeMo RL does)
    assert effects.index(proto.ReleaseBuffers()) < next(
        i for i, e in enumerate(effects) if isinstance(e, proto.SendComplete)
    )


def test_sizes_exactly_on_alignment_and_buffer_boundaries():
    half = 1024
    group_sizes = lambda sizes: [
        [s.nbytes for s in e.slots]
        for e in drive_sender(specs_of_sizes(sizes), 2 * half)
        if isinstance(e, proto.SendGroup)
    ]
    assert group_sizes([512, 512]) == [[512, 512]]  # exactly fills the half buffer
    assert group_sizes([511, 512]) == [[511, 512]]  # 511 pads to 512: still exactly full
    assert group_sizes([513, 511]) == [[513], [511]]  # 513 pads to 1024: the next one does not fit
    assert group_sizes([1024, 1]) == [[1024], [1]]  # exactly a half buffer is not oversized
    effects = drive_sender(specs_of_sizes([1, 1025, 1]), 2 * half)  # one byte over: dedicated buffer
    assert [(e.buffer, [s.nbytes for s in e.slots]) for e in effects if isinstance(e, proto.SendGroup)] == [
        (0, [1]),
        (proto.DEDICATED, [1025]),
        (1, [1]),
    ]
    assert [s.offset for e in effects if isinstance(e, proto.SendGroup) for s in e.slots] == [0, 0, 0]
    assert (
        proto.half_buffer_bytes(2050) == 1536
        and proto.half_buffer_bytes(2049) == 1024
        and proto.half_buffer_bytes(2048) == 1024
    )
    with pytest.raises(ValueError, match="at least 1024"):
        proto.half_buffer_bytes(1023)


def test_oversized_tensors_keep_order_and_go_once():
    sizes = [100, 5000, 200, 300, 9000, 9001, 50]
    effects = drive_sender(specs_of_sizes(sizes), 2048)
    sends = [(e.buffer, [s.name for s in e.slots]) for e in effects if isinstance(e, proto.SendGroup)]
    assert sends == [
        (0, ["t0"]),
        ("dedicated", ["t1"]),
        (1, ["t2", "t3"]),
        ("dedicated", ["t4"]),
        ("dedicated", ["t5"]),
        (0, ["t6"]),
    ]
    allocs = [e for e in effects if isinstance(e, proto.AllocDedicated)]
    assert [a.nbytes for a in allocs] == [5120, 9216, 9216]  # aligned up, as NeMo RL allocates them
    assert sum(isinstance(e, proto.FreeDedicated) for e in effects) == 3


# ------------------------------------------------------------------ receiver
def drive_receiver(manifest, messages, fail_load=()):
    """Feed messages to the receiver protocol; return (effects, outcome)."""
    gen = proto.receiver(manifest, half_bytes=4096)
    effects, reply, throw = [], None, None
    feed = iter(messages)
    try:
        while True:
            e = gen.throw(throw) if throw else gen.send(reply)
            throw, reply = None, None
            effects.append(e)
            if isinstance(e, proto.AwaitMessage):
                reply = next(feed)
            elif isinstance(e, proto.LoadGroup) and e.group in fail_load:
                throw = RuntimeError(f"cannot load group {e.group}")
    except StopIteration as stop:
        return effects, stop.value
    except proto.ManifestError as exc:
        return effects, exc


def group(g, names, buffer=0):
    slots, cursor = [], 0
    for n in names:
        slots.append(proto.Slot(n, (4,), "float32", cursor, 16))
        cursor += 512
    return proto.GroupMessage(g, buffer, tuple(slots), cursor)


MANIFEST = {n: ((4,), "float32") for n in ("a", "b", "c", "d")}


def test_receiver_finalizes_a_clean_transfer():
    effects, outcome = drive_receiver(
        MANIFEST, [group(0, ["a", "b"]), group(1, ["c", "d"], 1), proto.CompleteMessage(2)]
    )
    assert isinstance(outcome, proto.ManifestReport) and outcome.ok
    assert [e for e in effects if isinstance(e, proto.SendAck)] == [
        proto.SendAck(0),
        proto.SendAck(1),
        proto.SendAck("complete"),
    ]
    assert effects[-1] == proto.Finalize(2)


def test_missing_duplicate_and_unexpected_are_reported_together_and_complete_is_acked():
    msgs = [
        group(0, ["a", "b"]),
        group(1, ["b", "zzz"], 1),
        proto.CompleteMessage(2),
    ]  # c, d missing; b twice; zzz unknown
    effects, outcome = drive_receiver(MANIFEST, msgs)
    assert isinstance(outcome, proto.ManifestError)
    text = str(outcome)
    assert "missing: 'c', 'd'" in text and "duplicate: 'b'" in text and "unexpected: 'zzz'" in text
    assert "not finalized" in text
    assert effects[-1] == proto.SendAck("complete")  # ACKed, then the error; never Finalize
    assert not any(isinstance(e, proto.Finalize) for e in effects)
    loaded = [s.name for e in effects if isinstance(e, proto.LoadGroup) for s in e.slots]
    assert loaded == ["a", "b"]  # the duplicate and the stranger are not loaded


def test_a_failed_load_is_still_acked_and_reported_at_complete():
    msgs = [group(0, ["a", "b"]), group(1, ["c", "d"], 1), proto.CompleteMessage(2)]
    effects, outcome = drive_receiver(MANIFEST, msgs, fail_load={0})
    assert isinstance(outcome, proto.ManifestError) and "cannot load group 0" in str(outcome)
    assert [e.group for e in effects if isinstance(e, proto.SendAck)] == [0, 1, "complete"]
    assert not any(isinstance(e, proto.Finalize) for e in effects)


def test_receiver_flags_a_bad_layout():
    bad = proto.GroupMessage(
        0, 0, (proto.Slot("a", (4,), "float32", 0, 16), proto.Slot("b", (4,), "float32", 16, 16)), 1024
    )
    _, outcome = drive_receiver(MANIFEST, [bad, group(1, ["c", "d"], 1), proto.CompleteMessage(2)])
    assert isinstance(outcome, proto.ManifestError) and "at offset 16, expected 512" in str(outcome)


# ------------------------------------------------------------------ refit_wire fires
def good_records():
    effects = drive_sender(specs_of_sizes([300, 300, 600, 5000, 100, 200, 900]), 2048)
    return wire_records(effects, 1024)


def test_refit_wire_passes_a_good_stream():
    assert check_log(good_records(), ["refit_wire"]) == []


def test_refit_wire_fires_on_a_missing_ack():
    recs = [r for r in good_records() if not (r["kind"] == "refit_ack" and r["group"] == "0")]
    msgs = [v.message for v in check_log(recs, ["refit_wire"])]
    assert any("still un-ACKed" in m for m in msgs) and any("ACKs for" in m for m in msgs)


def test_refit_wire_fires_on_a_misaligned_slot_and_an_overfull_buffer():
    recs = good_records()
    send = next(r for r in recs if r["kind"] == "refit_group_send" and len(r["offsets"]) > 1)
    send["offsets"][1] += 8
    msgs = [v.message for v in check_log(recs, ["refit_wire"])]
    assert any("unaligned offset" in m for m in msgs)
    recs = good_records()
    send = next(r for r in recs if r["kind"] == "refit_group_send" and r["buffer"] == "0")
    send["bytes"] += 2048
    send["sizes"][-1] += 2048
    assert any("half buffer" in v.message for v in check_log(recs, ["refit_wire"]))


def test_refit_wire_fires_on_a_buffer_refilled_before_its_ack():
    recs = good_records()
    sends = [r for r in recs if r["kind"] == "refit_group_send" and r["buffer"] in ("0", "1")]
    sends[1]["buffer"] = sends[0]["buffer"]
    # drop the ACK of the first group so its buffer is still in use when the second is sent
    first_ack = next(r for r in recs if r["kind"] == "refit_ack" and r["group"] == str(sends[0]["group"]))
    recs.remove(first_ack)
    assert any("refilled" in v.message for v in check_log(recs, ["refit_wire"]))


def test_refit_wire_fires_when_an_incomplete_transfer_is_finalized():
    base = {"t": 0.0, "step": 0, "peer": "tx", "role": "receiver"}
    recs = [
        {"seq": 0, "kind": "refit_stream_begin", "expected": ["a", "b", "c"], **base},
        {
            "seq": 1,
            "kind": "refit_group_recv",
            "group": 0,
            "buffer": "0",
            "bytes": 16,
            "names": ["a", "a"],
            "offsets": [0, 512],
            **base,
        },
        {
            "seq": 2,
            "kind": "refit_group_recv",
            "group": 1,
            "buffer": "1",
            "bytes": 16,
            "names": ["x"],
            "offsets": [0],
            **base,
        },
        {"seq": 3, "kind": "refit_finalize", "groups": 2, **base},
    ]
    [v] = check_log(recs, ["refit_wire"])
    assert "missing ['b', 'c'], duplicate ['a'], unexpected ['x']" in v.message
    fixed = copy.deepcopy(recs)
    fixed[1]["names"], fixed[2]["names"] = ["a", "b"], ["c"]
    assert check_log(fixed, ["refit_wire"]) == []
