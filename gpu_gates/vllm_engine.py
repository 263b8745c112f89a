"""vLLM engine gate (GPU only): sleep levels 1 and 2, a refit over the harness's stream, greedy parity.

    rlharness gate vllm_engine [--report out/vllm.json]
    torchrun --nproc-per-node 1 gpu_gates/vllm_engine.py

One rank. It writes a tiny random-weight Llama (2 layers, width 256, 512-token vocabulary;
``transformers``' own ``save_pretrained``, nothing downloaded) to a private folder and
serves it with ``vllm.LLM(..., enable_sleep_mode=True, skip_tokenizer_init=True)``:

1. greedy output of the original weights (token ids in, token ids out: no tokenizer);
2. ``sleep(level=1)``, the device memory freed measured (``torch.cuda.mem_get_info``:
   vLLM's worker is another process), ``wake_up()``; the output must not change (level 1
   keeps the weights in host memory);
3. ``sleep(level=2)`` (weights discarded), memory freed measured; ``wake_up(tags=
   ["weights"])``; a refit of *other* weights (a second random init, the "trained" state)
   over the harness's refit stream — this process is the trainer (``RefitSender``, CUDA IPC
   staging, two ping-pong buffers, oversized tensors alone), vLLM's worker the receiver
   (``gpu_gates/engines/vllm_worker_ext.py`` through ``collective_rpc``), which loads them with the
   model's own ``load_weights`` only after a complete transfer; then ``wake_up(tags=
   ["kv_cache"])`` — vLLM's RL order (weights awake for the refit, KV cache after);
4. a fresh engine on the refitted weights saved to disk: its greedy output and its
   parameter digest must equal the refitted engine's.

Without vLLM or without CUDA the gate is a skip (``ExitCode.SKIPPED``) that says which; it has not yet
run on a GPU (docs/gpu-runs.md).
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # run as a script by torchrun: make the repo importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse  # noqa: E402
import gc  # noqa: E402
import importlib.util  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
from typing import Any, Dict, List, Optional, Tuple  # noqa: E402

import torch  # noqa: E402

from gpu_gates.sync import ipc  # noqa: E402
from gpu_gates.runtime.gate import GateContext, GateSpec, positive_int, run_gate  # noqa: E402
from harness.refit import stream as proto  # noqa: E402
from gpu_gates.sync.bucket_cache import dtype_name  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPTS = [[1, 17, 42, 99, 7], [3, 5, 8, 13, 21, 34]]
MIB = 1 << 20


def skip_reason() -> Optional[str]:
    """Why this node cannot run the gate (``None``: it can)."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (pip install 'rlharness[vllm]' on a GPU node)"
    if not torch.cuda.is_available():
        return "no CUDA device: vLLM's sleep mode (CuMemAllocator) needs a GPU"
    return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--budget-bytes",
        type=positive_int,
        default=256 << 10,
        help="refit staging budget (two ping-pong buffers of half each; by default the 256 KiB "
        "embedding and LM head are larger than a buffer and go alone)",
    )
    parser.add_argument("--max-tokens", type=positive_int, default=16)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.15)


def check_world(args: argparse.Namespace, world: int) -> Optional[str]:
    if world != 1:
        return f"runs on exactly 1 rank (vLLM brings its own worker process), got world size {world}"
    return skip_reason()


def write_tiny_llama(folder: str, seed: int) -> Dict[str, torch.Tensor]:
    """A random-weight Llama written by transformers into ``folder``; returns its state."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    # head size 64: every vLLM attention backend supports it (some refuse sizes below 32)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


def make_llm(ctx: GateContext, folder: str):
    from vllm import LLM

    return LLM(
        model=folder,
        enable_sleep_mode=True,
        skip_tokenizer_init=True,
        enforce_eager=True,
        dtype="bfloat16",
        max_model_len=128,
        gpu_memory_utilization=ctx.args.gpu_memory_utilization,
        seed=0,
        worker_extension_cls="gpu_gates.engines.vllm_worker_ext.RefitWorkerExtension",
    )


def greedy(ctx: GateContext, llm) -> List[List[int]]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=ctx.args.max_tokens, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def free_bytes() -> int:
    torch.cuda.synchronize()
    return int(torch.cuda.mem_get_info()[0])


def sleep_measured(ctx: GateContext, llm, level: int) -> int:
    before = free_bytes()
    llm.sleep(level=level)
    freed = free_bytes() - before
    ctx.data.setdefault("sleep", {})[f"level{level}"] = {"freed_bytes": freed, "freed_mib": freed / MIB}
    ctx.emit("memory_sample", label=f"after sleep level {level}", used=None, delta_used=-freed, informational=False)
    ctx.check(f"sleep_level{level}_frees_memory", freed > 0, f"sleep(level={level}) freed {freed / MIB:.1f} MiB")
    return freed


def refit(ctx: GateContext, llm, state: Dict[str, torch.Tensor]) -> Dict[str, Any]:
    """This process streams ``state`` (the trainer); vLLM's worker receives it."""
    from gpu_gates.transports import zmq_stream as zs

    named = [(n, t.to(ctx.device)) for n, t in state.items()]
    manifest = {n: [list(t.shape), dtype_name(t.dtype)] for n, t in named}
    endpoint = f"ipc://{ipc.ipc_dir()}/vllm-refit.sock"
    sender = zs.RefitSender(endpoint, peer="vllm worker", timeout_s=120.0, device=ctx.device, emit=ctx.emit)
    sent: Dict[str, Any] = {}

    def stream() -> None:
        try:
            sent["result"] = sender.stream(named, ctx.args.budget_bytes, step=1)
        except BaseException as exc:  # reported below, with the receiver's side
            sent["error"] = exc

    thread = threading.Thread(target=stream, name="refit-sender", daemon=True)
    thread.start()
    try:
        (got,) = llm.collective_rpc(
            "rlh_receive_refit", args=(endpoint, manifest, proto.half_buffer_bytes(ctx.args.budget_bytes), 1)
        )
    finally:
        thread.join(150)
        sender.close()
    if "error" in sent:
        raise RuntimeError(f"refit sender failed: {sent['error']}")
    missing = sorted(set(state) - set(got["loaded"]))
    ctx.check(
        "refit_complete", got["finalized"] and not missing, f"finalized {got['finalized']}, not loaded: {missing}"
    )
    res = sent["result"]
    return {"groups": res.groups, "bytes": res.bytes, "wall_s": res.wall_s, "dedicated_bytes": res.dedicated_bytes}


def run(ctx: GateContext) -> None:
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p
    )  # the worker imports gpu_gates
    with tempfile.TemporaryDirectory(prefix="rlh-vllm-") as tmp:
        original, trained = os.path.join(tmp, "original"), os.path.join(tmp, "trained")
        write_tiny_llama(original, seed=1)
        state = write_tiny_llama(trained, seed=2)  # the trainer's weights; also the fresh engine's
        ctx.set_phase("engine on the original weights")
        llm = make_llm(ctx, original)
        out0 = greedy(ctx, llm)
        ctx.set_phase("sleep level 1")
        sleep_measured(ctx, llm, 1)
        llm.wake_up()
        ctx.check("level1_wake_keeps_output", greedy(ctx, llm) == out0, "output changed across a level-1 sleep")
        ctx.set_phase("sleep level 2, refit")
        sleep_measured(ctx, llm, 2)
        llm.wake_up(tags=["weights"])
        ctx.data["refit"] = refit(ctx, llm, state)
        llm.wake_up(tags=["kv_cache"])
        refitted, digest = greedy(ctx, llm), llm.collective_rpc("rlh_param_digest")[0]
        del llm
        gc.collect()
        torch.cuda.empty_cache()
        ctx.set_phase("fresh engine on the refitted weights")
        fresh = make_llm(ctx, trained)
        expected, fresh_digest = greedy(ctx, fresh), fresh.collective_rpc("rlh_param_digest")[0]
        del fresh
        gc.collect()
    ctx.check(
        "refit_matches_fresh_weights",
        digest == fresh_digest,
        "the refitted engine's parameters differ from a fresh engine's on the same weights",
    )
    ctx.check("greedy_matches_fresh_engine", refitted == expected, f"refitted {refitted} vs fresh {expected}")
    ctx.data.update(outputs={"original": out0, "refitted": refitted, "fresh": expected})


def summarize(args: argparse.Namespace, results: List[Dict[str, Any]]) -> Tuple[Dict[str, Any], List[str]]:
    data = (results[0].get("data") or {}) if results else {}
    return {"sleep": data.get("sleep", {}), "refit": data.get("refit", {}), "outputs": data.get("outputs", {})}, []


SPEC = GateSpec(
    name="vllm_engine",
    description=__doc__.splitlines()[0],
    default_world=1,
    default_cycles=1,
    add_arguments=add_arguments,
    check_world=check_world,
    run=run,
    summarize=summarize,
)


if __name__ == "__main__":
    sys.exit(run_gate(SPEC))
