"""Memory meter: device memory on GPU, process RSS on CPU, always against a start baseline.

On a GPU the number that matters is what the *device* has in use, because NCCL buffers
and communicators live outside PyTorch's caching allocator: ``mem_get_info`` sees them,
``memory_allocated`` does not. Both are recorded. On CPU there is no device memory to
check, so RSS is recorded and marked informational (gates never assert on it).
"""

from __future__ import annotations

import os
from typing import Dict, Optional

import torch

MIB = 1024 * 1024


def process_rss_bytes() -> Optional[int]:
    """Resident set size from ``/proc/self/statm`` (``None`` where there is no procfs)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            resident_pages = int(fh.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


class MemoryMeter:
    """Samples memory on one device; ``used`` is device-wide on CUDA, RSS on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.is_cuda = device.type == "cuda"
        self.baseline = self._read()

    @property
    def informational(self) -> bool:
        """True when samples must not be asserted on (CPU RSS)."""
        return not self.is_cuda

    def _read(self) -> Dict[str, Optional[int]]:
        if self.is_cuda:
            torch.cuda.synchronize(self.device)
            free, total = torch.cuda.mem_get_info(self.device)
            return {
                "used": int(total - free),
                "total": int(total),
                "allocated": int(torch.cuda.memory_allocated(self.device)),
                "reserved": int(torch.cuda.memory_reserved(self.device)),
            }
        return {"used": process_rss_bytes()}

    def sample(self, label: str) -> Dict[str, object]:
        now = self._read()
        base_used = self.baseline.get("used")
        out: Dict[str, object] = {"label": label, "kind": "cuda" if self.is_cuda else "cpu_rss",
                                  "informational": self.informational}
        out.update(now)
        if now.get("used") is not None and base_used is not None:
            out["delta_used"] = int(now["used"]) - int(base_used)
        return out

    def release_caches(self) -> None:
        """Return cached blocks to the driver so ``used`` reflects what is really held."""
        if self.is_cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
