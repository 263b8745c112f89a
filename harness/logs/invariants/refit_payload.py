"""Refit completeness (``refit_payload``): a finalized refit carried every tensor the engine needs.

The refit stream's own manifest check (``refit_wire``) compares what
arrived with the receiver's manifest, but that manifest is usually built from what the
trainer says it will send. When the trainer's export leaves out state that is not a
parameter, both sides agree and the transfer is "clean": NeMo RL's colocated refit did
not carry the FP8 KV-cache scales (NVIDIA-NeMo/RL issue #3226), and the engine served
with stale scales. So the engine states what it needs (``engine_required``: every
parameter and every non-parameter tensor, KV-cache scales included) before a refit, and
this check compares that with the names that really arrived (``refit_group_recv``) by
the time the receiver finalized (``refit_finalize``), per (rank, step). A violation
names the missing tensors and says whether the receiver's manifest
(``refit_stream_begin`` ``expected``) even listed them.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

from harness.logs.invariants.base import Records, Violation, invariant

NAME = "refit_payload"
Key = Tuple[Optional[int], int]


def _key(r: dict) -> Key:
    return (r.get("rank"), r["step"])


def _where(key: Key) -> str:
    rank, step = key
    return (f"rank {rank} " if rank is not None else "") + f"refit step {step}"


@invariant(NAME, reads=("engine_required", "refit_stream_begin", "refit_group_recv", "refit_finalize"))
def check_refit_payload(records: Records) -> List[Violation]:
    """Every name the engine requires arrived before the refit was finalized."""
    required: Dict[Key, List[str]] = {}
    expected: Dict[Key, Set[str]] = {}
    received: Dict[Key, Set[str]] = {}
    out: List[Violation] = []
    for r in records:
        kind = r["kind"]
        if kind == "engine_required":
            required[_key(r)] = [str(n) for n in r["names"]]
        elif kind == "refit_stream_begin" and r.get("role") == "receiver":
            expected[_key(r)] = {str(n) for n in r.get("expected") or ()}
            received[_key(r)] = set()
        elif kind == "refit_group_recv":
            received.setdefault(_key(r), set()).update(str(n) for n in r["names"])
        elif kind == "refit_finalize":
            key = _key(r)
            need = required.get(key)
            if need is None:
                continue
            missing = [n for n in need if n not in received.get(key, set())]
            if missing:
                unlisted = [n for n in missing if n not in expected.get(key, set())]
                note = (
                    "the receiver's manifest did not list them either"
                    if len(unlisted) == len(missing)
                    else f"the receiver's manifest listed {len(missing) - len(unlisted)} of them"
                )
                out.append(
                    Violation(
                        NAME,
                        r["seq"],
                        f"{_where(key)}: finalized without {len(missing)} tensor(s) "
                        f"the engine needs: {', '.join(map(repr, missing))} ({note})",
                    )
                )
    return out
