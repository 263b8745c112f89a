"""VRAM (``vram``), read from the simulator's ledger records.

Resident bytes per GPU are the running sum of the ``vram`` records' ``delta`` (who
allocated what, in the order it happened), not the ``used`` figure the ledger reports
about itself — that figure is only compared with the sum. The capacity is the header's
``cluster.vram_gib``; the post-sleep threshold is the header's
``meta.post_sleep_threshold_bytes`` (1 GiB, RLix's gate threshold, when absent).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from harness.logs.invariants.base import Records, Violation, invariant

GIB = 1 << 30
DEFAULT_POST_SLEEP_THRESHOLD = 1 * GIB


@invariant("vram", reads=("vram", "oom", "rank_state"), sees=("header",))
def vram(records: Records) -> List[Violation]:
    """Per GPU, resident bytes never exceed capacity — an ``oom`` record is an allocation
    that would have — no owner frees more than it holds, and a rank that went to sleep
    keeps at most the post-sleep threshold on each of its GPUs (rank owner
    ``<pipeline>/dp<rank>``: weights, KV cache and communicator buffers must be gone). Memory
    the engine gave back that the driver has not yet freed (mem ``releasing``: a late release,
    simulators/pipelines/late_release.py) is not the engine's residue; it still counts toward capacity."""
    out: List[Violation] = []
    capacity: Optional[int] = None
    threshold = DEFAULT_POST_SLEEP_THRESHOLD
    if records and records[0]["kind"] == "header":
        head = records[0]
        gib = head["cluster"].get("vram_gib")
        capacity = None if gib is None else int(round(gib * GIB))
        threshold = (head.get("meta") or {}).get("post_sleep_threshold_bytes", threshold)
    used: Dict[int, int] = {}
    held: Dict[Tuple[int, str], int] = {}  # (gpu, owner) -> bytes
    releasing: Dict[Tuple[int, str], int] = {}  # (gpu, owner) -> bytes released, not yet freed
    reported_over = set()
    for r in records:
        k = r["kind"]
        if k == "vram":
            g, owner, delta = r["gpu"], r["owner"], r["delta"]
            now = held.get((g, owner), 0) + delta
            if now < 0:
                out.append(
                    Violation(
                        "vram", r["seq"], f"GPU {g}: {owner} frees {-delta} B of {r['mem']} holding {now - delta} B"
                    )
                )
                now = 0
            held[(g, owner)] = now
            if r["mem"] == "releasing":
                releasing[(g, owner)] = releasing.get((g, owner), 0) + delta
            total = used[g] = used.get(g, 0) + delta
            if capacity is not None and total > capacity and g not in reported_over:
                reported_over.add(g)
                out.append(
                    Violation(
                        "vram",
                        r["seq"],
                        f"GPU {g}: {total} B resident, above its capacity {capacity} B ({owner} {r['mem']})",
                    )
                )
            elif capacity is not None and total <= capacity:
                reported_over.discard(g)
            if r["used"] != total:
                out.append(
                    Violation(
                        "vram",
                        r["seq"],
                        f"GPU {g}: the ledger reports {r['used']} B in use, its allocations sum to {total} B",
                    )
                )
        elif k == "oom":
            g = r["gpu"]
            out.append(
                Violation(
                    "vram",
                    r["seq"],
                    f"GPU {g}: {r['owner']} asked for {r['requested']} B of {r['mem']} with "
                    f"{used.get(g, 0)} B resident of {r['capacity']} B (OOM)",
                )
            )
        elif k == "rank_state" and r["state"] == "asleep":
            owner = f"{r['pipeline_id']}/dp{r['dp_rank']}"
            for g in r["gpus"]:
                left = held.get((g, owner), 0) - releasing.get((g, owner), 0)
                if left > threshold:
                    out.append(
                        Violation(
                            "vram",
                            r["seq"],
                            f"{owner} asleep keeps {left} B on GPU {g}, above the post-sleep threshold {threshold} B",
                        )
                    )
    return out
