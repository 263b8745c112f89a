"""Methods the vLLM gate adds to vLLM's worker (``LLM(worker_extension_cls=...)``).

vLLM runs the model in its own worker process; an extension class is vLLM's documented
way for an RL framework to reach it (its methods are called through
``LLM.collective_rpc(name, args=...)`` and see the worker as ``self``; NeMo RL and vLLM's
RLHF examples update weights this way). Here the worker is the receiving end of the
harness's refit stream (``gpu_gates/transports/zmq_stream.py``, the protocol of
``harness/refit/stream.py``): it connects to the trainer's ``ipc://`` endpoint, takes every
group (CUDA IPC handles of the trainer's staging buffers), and only after a complete,
clean transfer hands the tensors to the model's own ``load_weights``.

Imported only inside vLLM's worker process, on a GPU node (``gpu_gates/vllm_engine.py``).
"""

from __future__ import annotations

import hashlib
from typing import Any, Dict, List

import torch


class RefitWorkerExtension:
    """Mixed into vLLM's worker class by vLLM itself; ``self.model_runner`` is the worker's."""

    def rlh_receive_refit(
        self, endpoint: str, manifest: Dict[str, Any], half_bytes: int, step: int, timeout_s: float = 120.0
    ) -> Dict[str, Any]:
        from gpu_gates.transports import zmq_stream as zs

        # vLLM's worker is always on a GPU; the CPU branch is for the glue's unit test
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        wanted = {n: (tuple(shape), dt) for n, (shape, dt) in manifest.items()}
        received: Dict[str, torch.Tensor] = {}

        def load(slot, view: torch.Tensor) -> None:
            received[slot.name] = view.to(device, copy=True)  # the view aliases the sender's buffer

        loaded: List[str] = []

        def finalize(groups: int) -> None:
            self.model_runner.model.load_weights(weights=list(received.items()))
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            loaded.extend(received)

        receiver = zs.RefitReceiver(endpoint, peer="trainer", timeout_s=timeout_s, device=device)
        try:
            res = receiver.receive(wanted, load, step=step, half_bytes=half_bytes, finalize=finalize)
        finally:
            receiver.close()
        return {"finalized": res.finalized, "groups": res.groups, "bytes": res.bytes, "loaded": sorted(loaded)}

    def rlh_param_digest(self) -> str:
        """One SHA-256 over the served model's parameters in name order (to compare two engines)."""
        h = hashlib.sha256()
        for name, p in sorted(self.model_runner.model.named_parameters()):
            h.update(name.encode())
            h.update(p.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes())
        return h.hexdigest()
