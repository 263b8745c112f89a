"""The vLLM engine gate is GPU-only: on a node without vLLM or without CUDA,
the gate is a skip (``rlharness gate vllm_engine``: exit SKIPPED) that says which is missing; where both
exist the gate itself runs (marker ``gpu``; see docs/gpu-runs.md)."""

from __future__ import annotations

import importlib.util

import pytest

torch = pytest.importorskip("torch")

from gpu_gates import vllm_engine  # noqa: E402
from tests.unit.refit_pair import endpoint  # noqa: E402,F401 (fixture)

pytestmark = pytest.mark.gate


def test_the_skip_reason_names_what_is_missing(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert "vllm is not installed" in vllm_engine.skip_reason()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "no CUDA device" in vllm_engine.skip_reason()
    assert "exactly 1 rank" in vllm_engine.check_world(None, 2)


@pytest.mark.skipif(vllm_engine.skip_reason() is None, reason="this node can run the vLLM gate")
def test_the_gate_launched_here_is_a_skip_that_says_why(gate_runner):
    # one rank, forked: the gate's own skip path (what `rlharness gate` turns into exit SKIPPED,
    # tests/gates/test_gate_command.py::test_a_skip_is_exit_77) with vLLM's reason
    run = gate_runner("vllm_engine", 1)
    assert run.report["status"] == "skipped", run.report["message"]
    assert run.report["message"] == f"skipped: {vllm_engine.skip_reason()}"


def test_the_worker_extension_loads_a_complete_refit_only_after_complete(endpoint):
    """The glue that runs inside vLLM's worker, on CPU with a stand-in model: the refit
    stream's receiver (oversized tensors included) hands every tensor to ``load_weights``
    once, after COMPLETE; nothing is loaded group by group."""
    import threading

    from gpu_gates.transports import zmq_stream as zs
    from gpu_gates.engines.vllm_worker_ext import RefitWorkerExtension
    from harness.refit import stream as proto
    from gpu_gates.sync.bucket_cache import dtype_name

    calls = []

    class Model:
        def load_weights(self, weights):
            calls.append({n: t.clone() for n, t in weights})

    worker = RefitWorkerExtension()
    worker.model_runner = type("Runner", (), {"model": Model()})()
    g = torch.Generator().manual_seed(7)
    state = {
        "model.embed_tokens.weight": torch.randn(512, 16, generator=g).to(torch.bfloat16),  # 16 KiB: oversized
        "model.norm.weight": torch.randn(16, generator=g),
        "lm_head.weight": torch.randn(8, 16, generator=g),
    }
    manifest = {n: [list(t.shape), dtype_name(t.dtype)] for n, t in state.items()}
    sender = zs.RefitSender(endpoint, timeout_s=10)
    th = threading.Thread(target=lambda: sender.stream(list(state.items()), 8192, step=1), daemon=True)
    th.start()
    try:
        got = worker.rlh_receive_refit(endpoint, manifest, proto.half_buffer_bytes(8192), 1, timeout_s=10)
    finally:
        th.join(15)
        sender.close()
    assert got["finalized"] and got["loaded"] == sorted(state) and len(calls) == 1
    assert all(torch.equal(calls[0][n], t) for n, t in state.items())
