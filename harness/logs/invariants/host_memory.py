"""Host RAM (``host_ram``), read from the simulator's ``host_ram`` ledger records.

The same ledger rules as VRAM (``vram``): holdings per (node, owner) are the running
sum of the records' ``delta``; the ledger's own ``used`` figure is only compared with the
sum of holdings. The capacity is the header's ``cluster.host_ram_bytes``; a charge that
would exceed it must appear as a ``host_oom`` record (the process is killed, RLix's
``CPU bucket cache`` host-RAM guard in ``rlix/pipeline/bucket_cache.py``, rlops/rlix),
never as resident use above capacity.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from harness.logs.invariants.base import Records, Violation, invariant

NAME = "host_ram"


@invariant(NAME, reads=("host_ram",), sees=("header", "host_oom"))
def host_ram(records: Records) -> List[Violation]:
    """Per node: no owner frees more than it holds, ``used`` equals the sum of holdings,
    and use never exceeds the header's capacity without a ``host_oom`` record for it."""
    out: List[Violation] = []
    capacity: Optional[int] = None
    if records and records[0]["kind"] == "header":
        capacity = records[0]["cluster"].get("host_ram_bytes")
    held: Dict[Tuple[int, str], int] = {}
    used: Dict[int, int] = {}
    refused = set()  # nodes with a host_oom record: the over-capacity charge was refused
    for r in records:
        k = r["kind"]
        if k == "host_oom":
            refused.add(r["node"])
        elif k == "host_ram":
            node, owner, delta = r["node"], r["owner"], r["delta"]
            before = held.get((node, owner), 0)
            now = before + delta
            if now < 0:
                out.append(Violation(NAME, r["seq"], f"node {node}: {owner} frees {-delta} B holding {now - delta} B"))
                now = 0
            held[(node, owner)] = now
            total = used[node] = used.get(node, 0) + now - before
            if r["used"] != total:
                out.append(
                    Violation(
                        NAME,
                        r["seq"],
                        f"node {node}: the ledger reports {r['used']} B of host RAM in use, "
                        f"its holdings sum to {total} B",
                    )
                )
            if capacity is not None and total > capacity and node not in refused:
                out.append(
                    Violation(
                        NAME,
                        r["seq"],
                        f"node {node}: {total} B of host RAM in use, above its capacity "
                        f"{capacity} B, with no host_oom record ({owner} +{delta} B)",
                    )
                )
    return out
