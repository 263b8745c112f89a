"""GPU presets: the numbers a cost formula needs, each from the vendor's datasheet.

Peak FLOP/s are dense (no structured sparsity). Link figures are per GPU and direction:
``nvlink`` is half the datasheet's bidirectional NVLink figure; ``pcie`` is the host link's
usable rate (about 80 % of the PCIe generation's x16 raw rate, what H2D copies reach);
``nic`` is the per-GPU scale-out NIC of the reference system (HGX/DGX: one NIC per GPU).

Sources (NVIDIA datasheets, read 2026-11):
  H100 SXM  https://www.nvidia.com/en-us/data-center/h100/ (989 TFLOPS BF16 dense, 3.35 TB/s, NVLink 900 GB/s)
  H200 SXM  https://www.nvidia.com/en-us/data-center/h200/ (141 GB, 4.8 TB/s; compute as H100)
  A100 80GB https://www.nvidia.com/en-us/data-center/a100/ (312 TFLOPS BF16, 2,039 GB/s, NVLink 600 GB/s)
  H20       NVIDIA H20 product brief (148 TFLOPS BF16, 96 GB, 4.0 TB/s, NVLink 900 GB/s)
  H800 SXM  NVIDIA H800 Tensor Core GPU datasheet (SXM5: 1,979 TFLOPS BF16 with sparsity, i.e. 989 dense, as the
            H100 SXM; 80 GB HBM3, 3.35 TB/s; NVLink 400 GB/s): the H100 SXM's compute and memory with a
            narrower NVLink
  B200      https://www.nvidia.com/en-us/data-center/dgx-b200/ (per GPU: 2.25 PFLOPS BF16 dense, 180 GB, 7.7 TB/s, NVLink 1.8 TB/s)
  L40S      https://www.nvidia.com/en-us/data-center/l40s/ (362 TFLOPS BF16 dense, 48 GB GDDR6, 864 GB/s, no NVLink, PCIe Gen4)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

GB = 10**9
GiB = 1 << 30


@dataclass(frozen=True)
class GpuSpec:
    name: str
    bf16_flops: float  # dense peak, FLOP/s
    fp8_flops: float  # dense peak, FLOP/s (0: no FP8 tensor cores)
    hbm_bytes: int  # device memory
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float  # per direction (0: none; GPU-GPU then goes over PCIe)
    pcie_bytes_per_s: float  # host link, usable, per direction
    nic_bytes_per_s: float  # scale-out network per GPU


GPU_PRESETS: Dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec("h100_sxm", 989e12, 1979e12, 80 * GiB, 3.35e12, 450 * GB, 50 * GB, 50 * GB),
        GpuSpec("h200", 989e12, 1979e12, 141 * GB, 4.8e12, 450 * GB, 50 * GB, 50 * GB),
        GpuSpec("a100_80gb", 312e12, 0.0, 80 * GiB, 2.039e12, 300 * GB, 25 * GB, 25 * GB),
        GpuSpec("h20", 148e12, 296e12, 96 * GB, 4.0e12, 450 * GB, 50 * GB, 50 * GB),
        GpuSpec("h800", 989e12, 1979e12, 80 * GiB, 3.35e12, 200 * GB, 50 * GB, 50 * GB),
        GpuSpec("b200", 2250e12, 4500e12, 180 * GB, 7.7e12, 900 * GB, 50 * GB, 50 * GB),
        GpuSpec("l40s", 362e12, 733e12, 48 * GB, 864e9, 0.0, 25 * GB, 25 * GB),
    )
}


def cluster_fields(gpu: GpuSpec, gpus_per_node: int) -> Dict[str, float]:
    """The cluster fields a preset sets (each only where the file gives none)."""
    return {
        "vram_bytes": int(gpu.hbm_bytes),
        "pcie_bytes_per_s": gpu.pcie_bytes_per_s,
        "intra_node_bytes_per_s": gpu.nvlink_bytes_per_s or gpu.pcie_bytes_per_s,
        "inter_node_bytes_per_s": gpu.nic_bytes_per_s * gpus_per_node,  # the cluster's figure is per node
    }
