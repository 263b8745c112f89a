"""Which transport each refit target device gets: same-device IPC or a broadcast group.

NCCL cannot put two ranks that share one GPU into one communicator, so a target device
equal to the sender's device *must* be served over IPC (CUDA IPC handle or a serialized
CPU bucket); every other device joins the per-sync dynamic broadcast group
(docs/modelled-systems.md#rlix-selective-sync step 3). A device is a ``(node, gpu)`` pair.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Sequence, Tuple

Device = Tuple[int, int]

IPC = "ipc"
BROADCAST = "broadcast"


def _check_device(device: object, what: str) -> Device:
    if (
        not isinstance(device, (tuple, list))
        or len(device) != 2
        or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in device)
    ):
        raise ValueError(f"{what} must be a (node, gpu) pair of non-negative ints, got {device!r}")
    return (int(device[0]), int(device[1]))


@dataclass(frozen=True)
class CommPlan:
    """Per target dp rank, the local ranks (index into its device list) on each path."""

    sender_device: Device
    ipc: Dict[int, List[int]] = field(default_factory=dict)
    broadcast: Dict[int, List[int]] = field(default_factory=dict)
    devices: Dict[int, List[Device]] = field(default_factory=dict)

    @property
    def needs_group(self) -> bool:
        """A dynamic broadcast group is created only when some target is on another device."""
        return bool(self.broadcast)

    @property
    def broadcast_devices(self) -> List[Device]:
        return [self.devices[dp][lr] for dp in sorted(self.broadcast) for lr in self.broadcast[dp]]

    @property
    def ipc_devices(self) -> List[Device]:
        return [self.devices[dp][lr] for dp in sorted(self.ipc) for lr in self.ipc[dp]]

    def path_of(self, dp_rank: int, local_rank: int) -> str:
        if local_rank in self.ipc.get(dp_rank, ()):
            return IPC
        if local_rank in self.broadcast.get(dp_rank, ()):
            return BROADCAST
        raise KeyError(f"dp rank {dp_rank} local rank {local_rank} is not a target of this plan")


def build_comm_plan(sender_device: Device, targets: Mapping[int, Sequence[Device]]) -> CommPlan:
    """Classify every device of every target dp rank as IPC (sender's device) or broadcast.

    A device may appear only once across all targets: two receivers on one GPU could not
    both join a broadcast group, and one IPC handle per device is the contract.
    """
    sender = _check_device(sender_device, "sender_device")
    ipc: Dict[int, List[int]] = {}
    broadcast: Dict[int, List[int]] = {}
    devices: Dict[int, List[Device]] = {}
    owner_of: Dict[Device, int] = {}
    for dp_rank in sorted(targets):
        if isinstance(dp_rank, bool) or not isinstance(dp_rank, int) or dp_rank < 0:
            raise ValueError(f"target dp rank must be a non-negative int, got {dp_rank!r}")
        device_list = [_check_device(d, f"device of dp rank {dp_rank}") for d in targets[dp_rank]]
        if not device_list:
            raise ValueError(f"dp rank {dp_rank} has no devices")
        devices[dp_rank] = device_list
        for local_rank, device in enumerate(device_list):
            if device in owner_of:
                raise ValueError(f"device {device} is listed for dp rank {owner_of[device]} and dp rank {dp_rank}")
            owner_of[device] = dp_rank
            path = ipc if device == sender else broadcast
            path.setdefault(dp_rank, []).append(local_rank)
    return CommPlan(sender_device=sender, ipc=ipc, broadcast=broadcast, devices=devices)
