"""Worker side of the data plane: presharded entry points, leader fetch, leader-only write-back.

Each DP rank of a trainer is a *replica group* of TP x CP x PP sibling ranks that all need
the same samples. Only the replica leader (tp = cp = pp = 0) talks to the store: it
fetches its DP shard and broadcasts it to the siblings in two phases — first a small
descriptor (field names, shapes, dtypes, and any object fields, via
``broadcast_object_list``), then each tensor — and it alone writes results back. A
sibling that also wrote would be a second writer of the same (sample, field): Mooncake
refuses it with ``-601 ILLEGAL_CLIENT``, TransferQueue silently overwrites.

``_local_coords`` has no default on purpose (NeMo RL's rule): a worker that cannot say
where it sits would otherwise look like tp = cp = pp = 0 on every rank, making every
rank a write-back leader. ``leader_gate`` exists only so a gate can switch the gate off
as a documented fault and show the duplicate write being caught.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from gpu_gates.dataplane.client import DataPlaneClient
from gpu_gates.dataplane.codec import DTYPE_NAMES, DTYPES
from harness.dataplane.errors import DataPlaneError
from harness.dataplane.meta import KVBatchMeta

REPLICATED_AXES = ("tp", "cp", "pp")


class MissingCoordinatesError(DataPlaneError):
    pass


class DataPlaneWorkerMixin:
    """Mix into a worker that has ``dp_client`` and implements the two hooks below."""

    dp_client: DataPlaneClient
    leader_gate: bool = True  # False only as the documented fault (gate hook leader_gate_off)
    dp_device: torch.device = torch.device("cpu")  # where broadcasts happen (the GPU under NCCL)

    def _local_coords(self) -> Dict[str, int]:
        raise MissingCoordinatesError(
            f"{type(self).__name__} does not implement _local_coords(): without its (dp, tp, cp, pp) "
            "coordinates every rank would look like a replica leader and write back"
        )

    def _replica_group(self) -> Tuple[Any, int, int]:
        """(process group of this rank's TP x CP x PP siblings, leader's global rank, group size)."""
        raise MissingCoordinatesError(f"{type(self).__name__} does not implement _replica_group()")

    # -- leader ------------------------------------------------------------------------
    def _is_replica_leader(self) -> bool:
        coords = self._local_coords()
        missing = [a for a in ("dp", *REPLICATED_AXES) if not isinstance(coords.get(a), int)]
        if missing:
            raise MissingCoordinatesError(f"_local_coords(): no integer coordinate for axis {', '.join(missing)}")
        return all(coords[a] == 0 for a in REPLICATED_AXES)

    # -- fetch -------------------------------------------------------------------------
    def fetch_presharded(self, meta: KVBatchMeta, select_fields: Sequence[str]) -> Dict[str, Any]:
        """Every rank of the replica gets the same fields; only the leader reads the store."""
        import torch.distributed as dist

        leader = self._is_replica_leader()
        group, leader_rank, size = self._replica_group()
        if size == 1:
            return self.dp_client.get_samples(list(meta.sample_ids), meta.partition_id, list(select_fields))
        data: Dict[str, Any] = {}
        descriptor: List[Any] = [None]
        if leader:
            data = self.dp_client.get_samples(list(meta.sample_ids), meta.partition_id, list(select_fields))
            descriptor[0] = {
                name: (
                    ["object", v.tolist()]
                    if isinstance(v, np.ndarray)
                    else ["tensor", list(v.shape), DTYPE_NAMES[v.dtype]]
                )
                for name, v in data.items()
            }
        dist.broadcast_object_list(descriptor, src=leader_rank, group=group)  # phase 1: what is coming
        sent = 0
        for name in sorted(descriptor[0]):  # phase 2: each tensor
            entry = descriptor[0][name]
            if entry[0] == "object":
                if not leader:
                    arr = np.empty(len(entry[1]), dtype=object)
                    arr[:] = entry[1]
                    data[name] = arr
                continue
            t = (
                data[name].contiguous().to(self.dp_device)
                if leader
                else torch.empty(entry[1], dtype=DTYPES[entry[2]], device=self.dp_device)
            )
            dist.broadcast(t, src=leader_rank, group=group)
            data[name] = t
            sent += t.numel() * t.element_size()
        if leader:
            self.dp_client._emit(
                "dp_transfer",
                hop="leader_to_siblings",
                partition=meta.partition_id,
                samples=list(meta.sample_ids),
                fields=sorted(descriptor[0]),
                bytes=sent * (size - 1),
                bulk=True,
            )
        return data

    # -- write-back --------------------------------------------------------------------
    def write_back_presharded(self, meta: KVBatchMeta, fields: Dict[str, Any]) -> Optional[KVBatchMeta]:
        """Leader-only put of this DP shard's results; siblings return None."""
        if self.leader_gate and not self._is_replica_leader():
            return None
        return self.dp_client.put_samples(
            list(meta.sample_ids), meta.partition_id, fields, sequence_lengths=meta.sequence_lengths
        )

    def get_logprobs_presharded(self, meta: KVBatchMeta, logprob_fn) -> Optional[KVBatchMeta]:
        """The shape of NeMo RL's ``get_logprobs_from_meta``: fetch, compute on every sibling, leader writes."""
        data = self.fetch_presharded(meta, ["input_ids"])
        return self.write_back_presharded(meta, {"logprobs": logprob_fn(data["input_ids"])})
