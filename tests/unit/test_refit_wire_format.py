"""The refit stream's group format against NeMo RL's, stated here independently.

NeMo RL's colocated ZMQ refit (NVIDIA-NeMo/RL @ 7ea279abfbeb698b092856d0dab61e7cf39bc909,
``nemo_rl/models/policy/utils.py`` ``stream_weights_via_ipc_zmq_impl``, its vLLM receiver
``update_weights_via_ipc_zmq`` and ``tests/unit/models/policy/test_utils.py``) describes a
data group, in our words:

* the total staging budget is split in two; a group may hold at most ``budget // 2`` bytes;
* a tensor of ``n`` bytes takes ``ceil(n / 512) * 512`` bytes of its group ("aligned size");
* tensors are written one after the other, the first at byte 0, each next one at the sum
  of the aligned sizes before it; the group announces only the tensor names and that sum
  (``used_bytes``);
* a tensor whose aligned size is more than half the budget travels alone, its
  ``used_bytes`` its aligned size; otherwise, if it would take the group past half the
  budget, the group is sent first and the tensor starts the next one;
* the receiver walks the names, sizes each tensor from its own shapes and dtypes, reads it
  at the running offset, and refuses the group unless the running offset ends exactly at
  ``used_bytes``.

The reference below is written from that description alone (plain Python, no code under
test), then held against the harness's sender (:func:`harness.refit.stream.sender`) and
receiver rule, byte for byte.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.logs.invariants import check_log
from harness.refit import stream as proto
from tests.unit.refit_pair import drive_sender, endpoint  # noqa: F401  (fixture)

PAD = 512


# ------------------------------------------------------------------ the reference
def ref_aligned(n):
    return -(-n // PAD) * PAD


def ref_groups(sizes, budget):
    """[(indices, used_bytes)] as NeMo RL's sender would form them."""
    cap = budget // 2
    out, cur, used = [], [], 0
    for i, n in enumerate(sizes):
        a = ref_aligned(n)
        if a > cap:
            if cur:
                out.append((cur, used))
                cur, used = [], 0
            out.append(([i], a))
            continue
        if used + a > cap:
            out.append((cur, used))
            cur, used = [], 0
        cur.append(i)
        used += a
    if cur:
        out.append((cur, used))
    return out


def ref_decode(buffer, names, used, sizes_by_name):
    """NeMo RL's receiver: bytes of each named tensor, or ValueError on the used_bytes check."""
    offset, out = 0, {}
    for name in names:
        n = sizes_by_name[name]
        out[name] = bytes(buffer[offset : offset + n])
        offset += ref_aligned(n)
    if offset != used:
        raise ValueError(f"offset {offset} != used_bytes {used}")
    return out


def ref_encode(tensors):
    """A group packed by the description: (buffer, names, used_bytes)."""
    buf, names = bytearray(), []
    for name, data in tensors:
        buf += data + bytes(ref_aligned(len(data)) - len(data))
        names.append(name)
    return bytes(buf), names, len(buf)


# ------------------------------------------------------------------ harness side
def payload(i, n):
    rng = random.Random(i * 7919 + n)
    return bytes(rng.randrange(256) for _ in range(n))


def harness_groups(sizes, budget):
    """Run the harness sender; execute its Pack effects into real byte buffers."""
    specs = [proto.TensorSpec(f"t{i}", (n,), "uint8", n) for i, n in enumerate(sizes)]
    data = {s.name: payload(i, s.nbytes) for i, s in enumerate(specs)}
    effects = drive_sender(specs, budget)
    half = next(e.half_bytes for e in effects if isinstance(e, proto.AllocBuffers))
    buffers = {0: bytearray(half), 1: bytearray(half)}
    groups = []
    for e in effects:
        if isinstance(e, proto.AllocDedicated):
            buffers[proto.DEDICATED] = bytearray(e.nbytes)
        elif isinstance(e, proto.Pack):
            for s in e.slots:
                buffers[e.buffer][s.offset : s.offset + s.nbytes] = data[s.name]
        elif isinstance(e, proto.SendGroup):
            groups.append((bytes(buffers[e.buffer]), [s.name for s in e.slots], e.used_bytes, e))
    return groups, data


@st.composite
def cases(draw):
    budget = draw(st.sampled_from([1024, 1500, 2048, 2049, 2100, 3000, 4096, 5000]))
    cap = budget // 2
    near = st.sampled_from([0, 1, 511, 512, 513, cap - 1, cap, cap + 1, ref_aligned(cap), ref_aligned(cap) + 1])
    sizes = draw(st.lists(st.one_of(near, st.integers(0, 2 * budget)).filter(lambda n: n >= 0), max_size=14))
    return budget, sizes


@settings(max_examples=200, deadline=None, derandomize=True)
@given(cases())
def test_harness_groups_are_nemo_rl_groups_and_decode_by_its_rule(case):
    budget, sizes = case
    groups, data = harness_groups(sizes, budget)
    want = ref_groups(sizes, budget)
    assert [(names, used) for _, names, used, _ in groups] == [([f"t{i}" for i in idx], used) for idx, used in want]
    sizes_by_name = {f"t{i}": n for i, n in enumerate(sizes)}
    for buf, names, used, _ in groups:
        assert ref_decode(buf, names, used, sizes_by_name) == {n: data[n] for n in names}


def test_nemo_rl_groups_decode_in_the_harness_receiver():
    """Vice versa: groups packed by the description are located by the harness's names-only
    decoder and accepted, loaded and finalized by its receiver protocol."""
    tensors = [("w", payload(1, 1000)), ("b", payload(2, 3)), ("s", payload(3, 512)), ("e", b"")]
    manifest = {"w": ((250,), "float32"), "b": ((3,), "uint8"), "s": ((256,), "bfloat16"), "e": ((0,), "int64")}
    buf, names, used = ref_encode(tensors)
    assert used == 1024 + 512 + 512 + 0
    slots = proto.slots_from_names(names, used, manifest)
    assert [(s.offset, s.nbytes) for s in slots] == [(0, 1000), (1024, 3), (1536, 512), (2048, 0)]
    assert {s.name: buf[s.offset : s.offset + s.nbytes] for s in slots} == dict(tensors)
    gen = proto.receiver(manifest, half_bytes=4096)
    assert isinstance(next(gen), proto.AwaitMessage)
    load = gen.send(proto.GroupMessage(0, 0, slots, used))
    assert isinstance(load, proto.LoadGroup) and [s.name for s in load.slots] == names
    assert gen.send(None) == proto.SendAck(0)
    next(gen)
    assert gen.send(proto.CompleteMessage(1)) == proto.SendAck(proto.COMPLETE)
    assert gen.send(None) == proto.Finalize(1)


def test_used_bytes_at_the_end_of_the_last_tensor_is_refused_by_both_rules():
    """The format the harness used before: ``used_bytes`` = end of the last (unaligned)
    tensor. NeMo RL's receiver rule refuses it, and so do the harness's receiver and
    ``refit_wire`` now."""
    tensors = [("w", payload(1, 1000)), ("b", payload(2, 3))]
    manifest = {"w": ((1000,), "uint8"), "b": ((3,), "uint8")}
    buf, names, _ = ref_encode(tensors)
    old_used = 1024 + 3
    with pytest.raises(ValueError, match="offset 1536 != used_bytes 1027"):
        ref_decode(buf, names, old_used, {"w": 1000, "b": 3})
    with pytest.raises(ValueError, match="running aligned offset 1536 != used_bytes 1027"):
        proto.slots_from_names(names, old_used, manifest)
    slots = (proto.Slot("w", (1000,), "uint8", 0, 1000), proto.Slot("b", (3,), "uint8", 1024, 3))
    problems = proto.check_layout(proto.GroupMessage(0, 0, slots, old_used), 4096)
    assert problems == ["group 0: running aligned offset 1536 but the message says 1027 used bytes"]
    rec = {
        "seq": 1,
        "t": 0.0,
        "step": 0,
        "peer": "rx",
        "role": "sender",
        "kind": "refit_group_send",
        "group": 0,
        "buffer": "0",
        "bytes": old_used,
        "names": names,
        "offsets": [0, 1024],
        "sizes": [1000, 3],
    }
    begin = {
        "seq": 0,
        "t": 0.0,
        "step": 0,
        "peer": "rx",
        "role": "sender",
        "kind": "refit_stream_begin",
        "half_bytes": 4096,
    }
    [v] = check_log([begin, rec], ["refit_wire"])
    assert "running aligned offset ends at 1536, group says 1027 used bytes" in v.message
    assert check_log([begin, dict(rec, bytes=1536)], ["refit_wire"]) == []
    gap = dict(rec, bytes=2048, offsets=[0, 1536])  # aligned, ordered, but not where a names-only reader looks
    assert any("leaves a gap" in v.message for v in check_log([begin, gap], ["refit_wire"]))


def test_an_unknown_name_leaves_the_layout_undecodable():
    with pytest.raises(ValueError, match="'x' is not in the manifest"):
        proto.slots_from_names(["x"], 512, {"w": ((4,), "float32")})
    assert proto.tensor_nbytes((2, 3), "bfloat16") == 12
    with pytest.raises(ValueError, match="unknown dtype name 'float7'"):
        proto.tensor_nbytes((1,), "float7")


def test_capacity_is_half_the_budget_unrounded():
    """An unaligned half budget: NeMo RL compares against ``budget // 2`` (1000 here), so a
    1000-byte tensor (aligned 1024) is oversized although the buffer allocated is 1024."""
    groups, _ = harness_groups([1000, 10], 2000)
    assert [(g[3].buffer, g[1], g[2]) for g in groups] == [(proto.DEDICATED, ["t0"], 1024), (0, ["t1"], 512)]
    assert ref_groups([1000, 10], 2000) == [([0], 1024), ([1], 512)]
    assert proto.half_capacity_bytes(2000) == 1000 and proto.half_buffer_bytes(2000) == 1024


def test_a_sender_announcing_the_old_used_bytes_is_refused_on_the_real_transport(endpoint, monkeypatch):
    """The fault for real: the pyzmq sender and receiver, with the sender's ``used_bytes``
    put back to the end of the last tensor. The receiver refuses every group (nothing is
    finalized) and ``refit_wire`` over the transport's own records names each group."""
    import torch

    from tests.unit.refit_pair import Log, run_pair

    named = [("w", torch.arange(250, dtype=torch.float32)), ("b", torch.arange(3, dtype=torch.float32))]
    log = Log()
    _, outcome, _ = run_pair(endpoint, named, 4096, log=log)
    assert outcome["result"].finalized and check_log(log.records, ["refit_wire"]) == []

    monkeypatch.setattr(proto, "used_bytes", proto.span_bytes)
    log = Log()
    _, outcome, _ = run_pair(endpoint, named, 4096, step=1, log=log)
    assert isinstance(outcome.get("error"), proto.ManifestError)
    assert "running aligned offset 1536 but the message says 1036 used bytes" in str(outcome["error"])
    assert not [r for r in log.records if r["kind"] == "refit_finalize"]
    msgs = [v.message for v in check_log(log.records, ["refit_wire"])]
    assert msgs and all("running aligned offset ends at 1536, group says 1036 used bytes" in m for m in msgs)
