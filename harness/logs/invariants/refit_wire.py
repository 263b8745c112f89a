"""``refit_wire``, the refit stream's wire rules: read from the ``refit_*`` records of the stream's two sides.

Sender side, per stream (rank, peer, step):
* at most one data group is un-ACKed at any time, and COMPLETE is sent with none;
* a staging buffer is refilled only after its previous group was ACKed;
* slots follow NeMo RL's wire layout (NVIDIA-NeMo/RL ``nemo_rl/models/policy/utils.py``
  @7ea279ab): each slot sits at the running aligned offset — the sum of the 512-byte
  aligned sizes of the slots before it — and that running offset ends exactly at the
  group's byte count (``used_bytes``, which NeMo RL's receiver asserts). A receiver that
  knows only the names finds every tensor by this rule, so a gap, an overlap or a byte
  count at the end of the last tensor would make it read the wrong bytes or refuse the
  group. A ping-pong group fits its half buffer;
* a stream that sent COMPLETE collects exactly ``data groups + 1`` ACKs.

Receiver side: a transfer is finalized only if the names it received are exactly the
manifest's expected names, each once (no missing, duplicate or unexpected name) — derived
from the group records, never from the receiver's own verdict.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

from harness.eventlog.kinds import ALL_KINDS
from harness.logs.invariants.base import Records, Violation, invariant
from harness.refit.stream import ALIGNMENT_BYTES, align_up

NAME = "refit_wire"


def _key(r: dict) -> Tuple:
    return (r.get("rank"), r["peer"], r["step"])


class _SenderStream:
    def __init__(self, half: int) -> None:
        self.half = half
        self.outstanding: List[int] = []
        self.buffer_of: Dict[str, int] = {}  # buffer -> un-ACKed group in it
        self.groups = 0
        self.acks = 0
        self.complete_seq = None
        self.complete_acked = False


def _layout(r: dict, half: int) -> List[str]:
    problems = []
    cursor = 0  # the running aligned offset
    for name, off, size in zip(r["names"], r["offsets"], r["sizes"]):
        if off % ALIGNMENT_BYTES:
            problems.append(f"slot {name!r} at unaligned offset {off}")
        elif off < cursor:
            problems.append(f"slot {name!r} at {off} overlaps the previous slot (running aligned offset {cursor})")
        elif off != cursor:
            problems.append(f"slot {name!r} at {off} leaves a gap (running aligned offset {cursor})")
        cursor = max(cursor, off) + align_up(size)
    if cursor != r["bytes"]:
        problems.append(f"running aligned offset ends at {cursor}, group says {r['bytes']} used bytes")
    if r["buffer"] != "dedicated" and r["bytes"] > half:
        problems.append(f"{r['bytes']} bytes in a {half}-byte half buffer")
    return problems


#: the kinds the check looks at (every other record is skipped by its first test)
REFIT_KINDS = tuple(k for k in ALL_KINDS if k.startswith("refit_"))


@invariant(NAME, sees=REFIT_KINDS)
def refit_wire(records: Records) -> List[Violation]:
    out: List[Violation] = []
    senders: Dict[Tuple, _SenderStream] = {}
    received: Dict[Tuple, List[str]] = {}
    expected: Dict[Tuple, List[str]] = {}

    def bad(r: dict, msg: str) -> None:
        rank = "" if r.get("rank") is None else f"rank {r['rank']} "
        out.append(Violation(NAME, r["seq"], f"{rank}step {r['step']} ({r['role']}, peer {r['peer']}): {msg}"))

    def close(key: Tuple, st: _SenderStream, r: dict) -> None:
        if st.complete_seq is not None and st.acks != st.groups + 1:
            bad(r, f"{st.acks} ACKs for {st.groups} data groups + COMPLETE (expected {st.groups + 1})")

    last: Dict[Tuple, dict] = {}
    for r in records:
        kind = r.get("kind", "")
        if not kind.startswith("refit_"):
            continue
        key = _key(r)
        last[key] = r
        if kind == "refit_stream_begin" and r["role"] == "sender":
            if key in senders:
                close(key, senders[key], r)
            senders[key] = _SenderStream(r.get("half_bytes") or 0)
        elif kind == "refit_stream_begin":
            expected[key], received[key] = list(r.get("expected") or []), []
        elif kind == "refit_group_send":
            st = senders.setdefault(key, _SenderStream(1 << 62))
            if st.outstanding:
                bad(r, f"group {r['group']} sent while group {st.outstanding[0]} is still un-ACKed")
            if r["buffer"] in st.buffer_of:
                bad(
                    r,
                    f"buffer {r['buffer']} refilled with group {r['group']} before group "
                    f"{st.buffer_of[r['buffer']]} in it was ACKed",
                )
            for problem in _layout(r, st.half):
                bad(r, f"group {r['group']}: {problem}")
            st.outstanding.append(r["group"])
            st.buffer_of[r["buffer"]] = r["group"]
            st.groups += 1
        elif kind == "refit_complete_send":
            st = senders.setdefault(key, _SenderStream(1 << 62))
            if st.outstanding:
                bad(r, f"COMPLETE sent while group {st.outstanding[0]} is un-ACKed")
            if r["groups"] != st.groups:
                bad(r, f"COMPLETE announces {r['groups']} groups, {st.groups} were sent")
            st.complete_seq = r["seq"]
        elif kind == "refit_ack":
            st = senders.setdefault(key, _SenderStream(1 << 62))
            st.acks += 1
            if r["group"] == "complete":
                if st.complete_seq is None:
                    bad(r, "ACK of COMPLETE before COMPLETE was sent")
            elif not st.outstanding or str(st.outstanding[0]) != r["group"]:
                bad(r, f"ACK of group {r['group']} but the un-ACKed group is {st.outstanding or 'none'}")
            else:
                g = st.outstanding.pop(0)
                st.buffer_of = {b: x for b, x in st.buffer_of.items() if x != g}
        elif kind == "refit_group_recv":
            received.setdefault(key, []).extend(r["names"])
        elif kind == "refit_finalize":
            want, got = expected.get(key, []), received.get(key, [])
            missing = [n for n in want if n not in got]
            duplicate = sorted({n for n in got if got.count(n) > 1})
            unexpected = sorted({n for n in got if n not in want})
            if missing or duplicate or unexpected:
                bad(
                    r,
                    f"finalized an incomplete transfer: missing {missing}, duplicate {duplicate}, "
                    f"unexpected {unexpected}",
                )
    for key, st in senders.items():
        close(key, st, last[key])
    return out
