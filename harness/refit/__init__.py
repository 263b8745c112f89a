"""Refit primitives shared by the simulator and the GPU gates: bucket cache and comm plan."""

from harness.refit.bucket_cache import (
    ALIGNMENT_BYTES,
    BucketRecord,
    VersionedBucketCache,
    build_buckets,
    pack_bucket,
    plan_buckets,
    state_digests,
    tensor_digest,
    unpack_bucket,
)
from harness.refit.comm_plan import BROADCAST, IPC, CommPlan, build_comm_plan

__all__ = [
    "ALIGNMENT_BYTES",
    "BROADCAST",
    "BucketRecord",
    "CommPlan",
    "IPC",
    "VersionedBucketCache",
    "build_buckets",
    "build_comm_plan",
    "pack_bucket",
    "plan_buckets",
    "state_digests",
    "tensor_digest",
    "unpack_bucket",
]
