"""The simulated cluster: per-GPU VRAM ledger, host-RAM ledger, shared links.

Memory is accounted, not sampled: every allocation names its owner (``ppl1/dp0``,
``ppl1/train``) and kind (weights, kv_cache, params, grads, optimizer, nccl, staging,
cuda_context) and, for what a phase loads, the phase (the ``handover`` check reads it),
and an allocation that would exceed a GPU's capacity is an OOM — reported as a fault
that ends the run, never a silent number. Links (PCIe per GPU, the intra-node fabric,
each node's NIC) are resources of capacity one (:class:`~simulators.runtime.env.Link`, a lean
``simpy.Resource``): transfers queue on them, so two pipelines refitting through the
same link slow each other down. PCIe is two resources per GPU, one per direction
(host→device staging, device→host cache builds and offloads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import simpy

from simulators.runtime.env import Link
from simulators.scenario.spec import ClusterSpec

MEM_KINDS = ("weights", "kv_cache", "params", "grads", "optimizer", "nccl", "staging", "cuda_context")


class OutOfMemory(RuntimeError):
    def __init__(self, gpu: int, owner: str, mem: str, requested: int, used: int, capacity: int) -> None:
        super().__init__(
            f"OOM on GPU {gpu}: {owner} asked for {requested} B of {mem} with {used} B of {capacity} B in use"
        )
        self.gpu, self.owner, self.mem = gpu, owner, mem
        self.requested, self.used, self.capacity = requested, used, capacity


Listener = Callable[[int, str, str, int, int, Optional[str]], None]  # gpu, owner, mem, delta, used, phase


class VramLedger:
    def __init__(self, num_gpus: int, capacity: int, listener: Optional[Listener] = None) -> None:
        self.capacity = capacity
        self.used: List[int] = [0] * num_gpus
        self.entries: List[Dict[Tuple[str, str], int]] = [dict() for _ in range(num_gpus)]
        self.peak: List[int] = [0] * num_gpus
        self.listener = listener

    def alloc(self, gpu: int, owner: str, mem: str, nbytes: int, phase: Optional[str] = None) -> None:
        if nbytes <= 0:
            return
        used = self.used[gpu] + nbytes
        if used > self.capacity:
            raise OutOfMemory(gpu, owner, mem, nbytes, self.used[gpu], self.capacity)
        entries, key = self.entries[gpu], (owner, mem)
        entries[key] = entries.get(key, 0) + nbytes
        self.used[gpu] = used
        if used > self.peak[gpu]:
            self.peak[gpu] = used
        if self.listener:
            self.listener(gpu, owner, mem, nbytes, used, phase)

    def free(self, gpu: int, owner: str, mem: str) -> int:
        nbytes = self.entries[gpu].pop((owner, mem), 0)
        if nbytes:
            self.used[gpu] = used = self.used[gpu] - nbytes
            if self.listener:
                self.listener(gpu, owner, mem, -nbytes, used, None)
        return nbytes

    def held(self, gpu: int, owner: str, mem: Optional[str] = None) -> int:
        if mem is not None:  # entries are keyed by (owner, mem): at most one matches
            return self.entries[gpu].get((owner, mem), 0)
        return sum(v for (o, m), v in self.entries[gpu].items() if o == owner)


class HostOutOfMemory(RuntimeError):
    """A host-RAM charge would exceed the node's RAM: a modelled failure (the process is
    killed), reported as a ``host_oom`` record and a failed run, never Python's MemoryError."""

    def __init__(self, node: int, owner: str, requested: int, used: int, capacity: int) -> None:
        super().__init__(
            f"host RAM of node {node} exhausted: {owner} needs {requested} B more with {used} B of {capacity} B in use"
        )
        self.node, self.owner, self.requested, self.used, self.capacity = node, owner, requested, used, capacity


HostListener = Callable[[int, str, int, int], None]  # node, owner, delta, used


class HostRam:
    """Per-node host RAM: CPU bucket caches (at most two model copies per pipeline) and the
    weights a level-1 sleep keeps in host memory. Every change is reported to ``listener``
    (the ``host_ram`` record), so the ledger can be re-derived from the log alone."""

    def __init__(self, nodes: int, capacity: int, listener: Optional[HostListener] = None) -> None:
        self.capacity = capacity
        self.used = [0] * nodes
        self.entries: List[Dict[str, int]] = [dict() for _ in range(nodes)]
        self.listener = listener

    def set(self, node: int, owner: str, nbytes: int, guard: bool = True) -> None:
        """``guard=False`` (fault ``no_host_ram_guard``) lets a charge above capacity through."""
        old = self.entries[node].get(owner, 0)
        if guard and nbytes > old and self.used[node] - old + nbytes > self.capacity:
            raise HostOutOfMemory(node, owner, nbytes - old, self.used[node], self.capacity)
        if nbytes:
            self.entries[node][owner] = nbytes
        else:
            self.entries[node].pop(owner, None)
        self.used[node] += nbytes - old
        if nbytes != old and self.listener:
            self.listener(node, owner, nbytes - old, self.used[node])


@dataclass
class Links:
    h2d: List[Link]  # per GPU, host -> device
    d2h: List[Link]  # per GPU, device -> host
    intra: List[Link]
    nic: List[Link]


class SimCluster:
    def __init__(
        self,
        env: simpy.Environment,
        spec: ClusterSpec,
        listener: Optional[Listener] = None,
        host_listener: Optional[HostListener] = None,
    ) -> None:
        self.spec = spec
        self.vram = VramLedger(spec.num_gpus, spec.vram_bytes, listener)
        self.host = HostRam(spec.nodes, spec.host_ram_bytes, host_listener)
        self.links = Links(
            h2d=[Link(env, 1) for _ in range(spec.num_gpus)],
            d2h=[Link(env, 1) for _ in range(spec.num_gpus)],
            intra=[Link(env, 1) for _ in range(spec.nodes)],
            nic=[Link(env, 1) for _ in range(spec.nodes)],
        )

    def node_of(self, gpu: int) -> int:
        return gpu // self.spec.gpus_per_node
