"""The refit stream on its real transport (pyzmq REQ/REP on ipc://, /dev/shm ping-pong
buffers): wire invariants on normal runs, bit-exactness, boundaries, manifest errors, and
peers that die mid-stream. Every socket lives under a private temp dir (xdist-safe)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.logs.invariants import check_log
from harness.refit import stream as proto
from gpu_gates.transports import staging, zmq_stream as zs
from tests.unit.refit_pair import Log, endpoint, run_pair  # noqa: F401  (fixture)

REPO = Path(__file__).resolve().parents[2]


def mixed_model(seed: int):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(48, 40, generator=g)
    return [
        ("embed.bf16", torch.randn(300, 33, generator=g).to(torch.bfloat16)),
        ("attn.fp16", torch.randn(129, 7, generator=g).to(torch.float16)),
        ("mlp.fp32", torch.randn(1000, generator=g)),
        ("pos.int64", torch.randint(-(2**62), 2**62, (77,), generator=g, dtype=torch.int64)),
        ("noncontig.t", base.t()),  # transposed view: not contiguous
        ("noncontig.slice", base[::3, 1::2]),
        ("scalar", torch.tensor(3.25)),
        ("empty", torch.empty(0, 5)),
        ("mask", torch.rand(37, generator=g) > 0.5),
    ]


def assert_bit_exact(named, dst):
    for name, t in named:
        got = dst[name]
        assert got.dtype == t.dtype and tuple(got.shape) == tuple(t.shape), name
        assert zs.raw_bytes(got.contiguous()).tolist() == zs.raw_bytes(t.contiguous()).tolist(), name


def test_normal_runs_keep_the_wire_invariants_and_are_bit_exact(endpoint):
    log = Log()
    for step in range(3):  # several syncs over fresh sockets, changed weights each time
        named = mixed_model(step)
        budget = 8192  # embed.bf16 (19800 B) is oversized; the rest ping-pong
        res, outcome, dst = run_pair(endpoint, named, budget, step=step, log=log)
        assert "error" not in outcome, outcome.get("error")
        assert outcome["result"].finalized and outcome["result"].groups == res.groups
        assert_bit_exact(named, dst)
    assert check_log(log.records, ["refit_wire"]) == []
    acks = [r for r in log.records if r["kind"] == "refit_ack"]
    sends = [r for r in log.records if r["kind"] == "refit_group_send"]
    assert len(acks) == len(sends) + 3  # one COMPLETE ACK per sync
    assert {r["buffer"] for r in sends} == {"0", "1", "dedicated"}
    assert staging.leftover_shm(os.getpid()) == []


@settings(max_examples=12, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from([0, 1, 511, 512, 513, 1023, 1024, 1025, 2047, 2048, 2049]), min_size=1, max_size=8))
def test_sizes_on_alignment_and_buffer_boundaries_arrive_bit_exact(sizes):
    from gpu_gates.transports import private_dirs

    d = private_dirs.make_private("refit-test")
    try:
        g = torch.Generator().manual_seed(len(sizes))
        named = [(f"t{i}", torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8)) for i, n in enumerate(sizes)]
        log = Log()
        res, outcome, dst = run_pair(f"ipc://{d}/s.sock", named, 2048, log=log)  # half buffer 1024
        assert outcome["result"].finalized
        assert_bit_exact(named, dst)
        assert check_log(log.records, ["refit_wire"]) == []
        sent = [n for r in log.records if r["kind"] == "refit_group_send" for n in r["names"]]
        assert sent == [n for n, _ in named]  # order kept, each once
    finally:
        private_dirs.remove(d)


def test_oversized_path_keeps_order_and_sends_each_tensor_once(endpoint):
    g = torch.Generator().manual_seed(5)
    sizes = [100, 3000, 200, 5000, 5001, 10]
    named = [(f"p{i}", torch.randn(n // 4 + 1, generator=g)) for i, n in enumerate(sizes)]
    log = Log()
    res, outcome, dst = run_pair(endpoint, named, 2048, log=log)
    assert outcome["result"].finalized
    assert_bit_exact(named, dst)
    sends = [(r["buffer"], r["names"]) for r in log.records if r["kind"] == "refit_group_send"]
    assert sends == [
        ("0", ["p0"]),
        ("dedicated", ["p1"]),
        ("1", ["p2"]),
        ("dedicated", ["p3"]),
        ("dedicated", ["p4"]),
        ("0", ["p5"]),
    ]
    assert check_log(log.records, ["refit_wire"]) == []


def test_manifest_error_lists_missing_duplicate_and_unexpected_together(endpoint):
    g = torch.Generator().manual_seed(1)
    a, b, c = (torch.randn(10, generator=g) for _ in range(3))
    manifest = {"a": ((10,), "float32"), "b": ((10,), "float32"), "c": ((10,), "float32")}
    named = [("a", a), ("b", b), ("b", b), ("stranger", c)]  # c missing, b twice, stranger unknown
    log = Log()
    res, outcome, _ = run_pair(endpoint, named, 4096, manifest=manifest, log=log)
    err = outcome["error"]
    assert isinstance(err, proto.ManifestError)
    text = str(err)
    assert "missing: 'c'" in text and "duplicate: 'b'" in text and "unexpected: 'stranger'" in text
    assert "step 0 from sender" in text and "not finalized" in text
    assert res.complete_s >= 0 and res.groups == 1  # the sender got its COMPLETE ACK: no timeout
    assert not any(r["kind"] == "refit_finalize" for r in log.records)
    [check] = [r for r in log.records if r["kind"] == "refit_manifest_check"]
    assert (check["missing"], check["duplicate"], check["unexpected"]) == (["c"], ["b"], ["stranger"])
    assert staging.leftover_shm(os.getpid()) == []


RECEIVER_THAT_DIES = textwrap.dedent("""
    import os, sys, torch
    from gpu_gates.transports import zmq_stream as zs
    from harness.refit import stream as proto
    manifest = {f"w{i}": ((4096,), "float32") for i in range(8)}
    r = zs.RefitReceiver(sys.argv[1], timeout_s=30)
    loaded = []
    def load(slot, view):
        loaded.append(slot.name)
        if len(loaded) == 3:
            os._exit(17)  # dies in the middle of the stream, holding its ACK
    print("ready", flush=True)
    r.receive(manifest, load, step=4)
""")


def test_receiver_dying_mid_stream_fails_the_sender_within_its_timeout(endpoint):
    named = [(f"w{i}", torch.full((4096,), float(i))) for i in range(8)]  # 16 KiB each: one per group
    sender = zs.RefitSender(endpoint, peer="infer-dp0", timeout_s=3.0)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", RECEIVER_THAT_DIES, endpoint], stdout=subprocess.PIPE, env=env)
    try:
        assert child.stdout.readline().strip() == b"ready"
        t0 = time.monotonic()
        with pytest.raises(zs.StreamTimeout) as info:
            sender.stream(named, 2 * 16384, step=4)
        elapsed = time.monotonic() - t0
    finally:
        sender.close()
        try:
            child.wait(timeout=10)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    msg = str(info.value)
    assert "infer-dp0" in msg and "step 4" in msg and "ACK of group 2" in msg and "may be dead" in msg
    assert elapsed < 3.0 + 2.0  # failed within its timeout (plus the packing before it), no hang
    assert child.returncode == 17  # the receiver is gone and reaped: no orphan
    assert staging.leftover_shm(os.getpid()) == []  # the sender's staging files went with the failure
    with pytest.raises(zs.StreamError, match="already closed"):
        sender.stream(named, 2 * 16384, step=5)  # a REQ that missed its reply is never reused


def test_sender_dying_mid_stream_fails_the_receiver_and_nothing_is_finalized(endpoint):
    """A raw REQ sends one valid group, then falls silent: the receiver loads it, ACKs,
    times out waiting for the next one, and never finalizes."""
    ctx = zmq.Context()
    req = ctx.socket(zmq.REQ)
    req.setsockopt(zmq.LINGER, 0)
    req.setsockopt(zmq.SNDTIMEO, 5000)
    req.setsockopt(zmq.RCVTIMEO, 5000)
    req.bind(endpoint)
    r = zs.RefitReceiver(endpoint, peer="trainer0", timeout_s=1.0)  # connected: the REQ can send
    buf = staging.ShmBuffer(1024)
    buf.tensor[:16].copy_(zs.raw_bytes(torch.arange(4, dtype=torch.float32)))
    header = {
        "type": "group",
        "step": 2,
        "group": 0,
        "buffer": 0,
        "used": 16,
        "slots": [["a", [4], "float32", 0, 16]],
        "shm": buf.path,
        "shm_bytes": 1024,
    }
    req.send_multipart([json.dumps(header).encode(), b""])
    finalized = []
    dst = {"a": torch.zeros(4), "b": torch.zeros(4)}
    try:
        with pytest.raises(zs.StreamTimeout, match=r"trainer0.*step 2: waiting for group 1"):
            r.receive(
                {"a": ((4,), "float32"), "b": ((4,), "float32")}, zs.copy_into(dst), step=2, finalize=finalized.append
            )
        assert json.loads(req.recv()) == {"step": 2, "group": 0}  # group 0 was ACKed
    finally:
        r.close()
        req.close(0)
        ctx.term()
        buf.close()
    assert dst["a"].tolist() == [0.0, 1.0, 2.0, 3.0] and finalized == []


def test_endpoint_must_be_ipc():
    with pytest.raises(ValueError, match="ipc://"):
        zs.RefitSender("tcp://127.0.0.1:5555")
