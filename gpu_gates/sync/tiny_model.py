"""A tiny model whose state has every dtype a refit must carry bit-exactly.

bf16, fp16 and fp32 parameters plus int64 buffers (a 2-D index table and a 0-dim step
counter), because each has broken a real bucket path once: bf16 has no numpy dtype, a
0-dim tensor has no "flat" view without a reshape, and int64 buffers are not parameters
so a parameter-only sync silently skips them.
"""

from __future__ import annotations

from typing import List, Tuple

import torch
from torch import nn


class TinyModel(nn.Module):
    def __init__(self, seed: int, width: int = 64) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.embed = nn.Parameter(torch.randn(128, width, generator=gen).to(torch.bfloat16))
        self.proj_weight = nn.Parameter(torch.randn(width, width, generator=gen).to(torch.float16))
        self.proj_bias = nn.Parameter(torch.randn(width, generator=gen).to(torch.float16))
        self.head = nn.Parameter(torch.randn(32, width, generator=gen))
        self.norm = nn.Parameter(torch.ones(width))
        self.register_buffer("position_ids", torch.arange(256, dtype=torch.int64).reshape(2, 128) + seed)
        self.register_buffer("step", torch.tensor(seed, dtype=torch.int64))

    def named_state(self) -> List[Tuple[str, torch.Tensor]]:
        """Parameters and buffers in a fixed order (the bucket layout depends on it)."""
        return list(self.state_dict(keep_vars=False).items())

    @torch.no_grad()
    def train_step(self, cycle: int, seed: int) -> None:
        """Change every tensor deterministically, as an optimizer step would."""
        gen = torch.Generator().manual_seed(seed * 1000 + cycle)
        for _, p in self.named_parameters():
            noise = torch.randn(p.shape, generator=gen).to(p.dtype)
            p.add_(noise.to(p.device) * 0.01)
        self.position_ids.add_(1)
        self.step.add_(1)

    @torch.no_grad()
    def load_named(self, named: List[Tuple[str, torch.Tensor]]) -> None:
        state = self.state_dict()
        for name, tensor in named:
            if name not in state:
                raise KeyError(f"received unknown tensor {name!r}")
            target = state[name]
            if target.dtype != tensor.dtype or target.shape != tensor.shape:
                raise ValueError(
                    f"tensor {name!r}: got {tensor.dtype}{tuple(tensor.shape)}, "
                    f"model has {target.dtype}{tuple(target.shape)}"
                )
            target.copy_(tensor.to(target.device))
