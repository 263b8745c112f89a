"""Memory meter: device memory on GPU, process RSS on CPU, always against a start baseline.

On a GPU the number that matters is what the *device* has in use, because NCCL buffers
and communicators live outside PyTorch's caching allocator: ``mem_get_info`` sees them,
``memory_allocated`` does not. Both are recorded. When several ranks share one GPU
(``--device cuda`` under gloo) the device's number includes the other ranks' memory,
which they allocate on their own schedule, so each sample also records this process's own
device memory as the driver counts it (NVML, where ``pynvml`` is installed):
:func:`own_device_bytes` is what a growth check compares then. On CPU there is no device
memory to check, so RSS is recorded and marked informational (gates never assert on it).
"""

from __future__ import annotations

import os
from typing import Dict, Optional, Tuple

import torch

MIB = 1024 * 1024


def nvml_process_bytes(device: torch.device) -> Optional[int]:
    """This process's memory on ``device`` as the driver counts it (NVML's per-process
    used memory: allocator, NCCL, IPC mappings alike); ``None`` without ``pynvml``, or
    where NVML cannot see this process (a PID namespace it does not share)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        index = device.index if device.index is not None else torch.cuda.current_device()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible:  # NVML numbers the physical devices
            index = int(visible.split(",")[index])
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                return int(proc.usedGpuMemory)
    except (pynvml.NVMLError, ValueError, IndexError):
        return None
    return None


def own_device_bytes(sample: Dict[str, object], shared: bool) -> Tuple[Optional[int], str]:
    """The bytes a growth check compares, and what they are: the device's ``used`` when
    this rank has the GPU to itself; this process's own (NVML, else the caching
    allocator's reserved bytes) when ranks share it."""
    if not shared:
        return sample.get("used"), "device memory"  # type: ignore[return-value]
    if sample.get("process_used") is not None:
        return sample["process_used"], "this process's device memory (NVML)"  # type: ignore[return-value]
    return sample.get("reserved"), "this process's reserved memory (torch allocator; no NVML)"  # type: ignore[return-value]


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
                "process_used": nvml_process_bytes(self.device),
            }
        return {"used": process_rss_bytes()}

    def sample(self, label: str) -> Dict[str, object]:
        now = self._read()
        base_used = self.baseline.get("used")
        out: Dict[str, object] = {
            "label": label,
            "kind": "cuda" if self.is_cuda else "cpu_rss",
            "informational": self.informational,
        }
        out.update(now)
        if now.get("used") is not None and base_used is not None:
            out["delta_used"] = int(now["used"]) - int(base_used)
        return out

    def release_caches(self) -> None:
        """Return cached blocks to the driver so ``used`` reflects what is really held."""
        if self.is_cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
