"""Versions (``versions``, ``stale_serving``): caches built in increasing version order; only a built
version is promoted; a sync reads and a publish names the promoted (active) version, a
publish on the expand path comes after that path's sync; published values never go back
(compared raw: a publish of the base -1 after version 0 goes back in any pipeline)."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from harness.logs.invariants.base import Records, Violation, invariant


class _PublishAfterApply:
    """A version is published only once every rank its sync wrote has applied it: a sync's
    end is the receivers' acknowledgement, their ``Finalize`` (``process_weights_after_loading``)
    the apply. Publishing between the two is RLinf #1456 (a sync completed on the receiver's
    acknowledgement rather than on its apply): the version is announced while the ranks still
    hold a half-applied update. Fed one effect record at a time (the online oracle's one pass)."""

    def __init__(self) -> None:
        self.unapplied: Dict[str, Dict[int, Tuple[set, int]]] = {}  # pipeline -> version -> (ranks, sync seq)

    def see(self, r: dict) -> List[Violation]:
        pid, eff, args, end = r["pipeline_id"], r["effect"], r["args"], r["kind"] == "effect_end"
        pending = self.unapplied.setdefault(pid, {})
        if eff == "SyncFromCache" and not end:
            pending[args["version"]] = (set(args["ranks"]), r["seq"])
        elif eff == "SyncFromCache" and r.get("error"):
            pending.pop(args["version"], None)  # nothing was loaded to apply
        elif eff == "Finalize" and end and not r.get("error"):
            for ranks, _ in pending.values():
                ranks.difference_update(args["ranks"])
        elif eff == "PublishVersion" and not end:
            ranks, sync_seq = pending.pop(args["version"], (set(), 0))
            if ranks:
                return [
                    Violation(
                        "versions",
                        r["seq"],
                        f"{pid}: publishes version {args['version']} before dp {sorted(ranks)} applied it "
                        f"(its sync at seq {sync_seq} was acknowledged; those ranks had not finalized it)",
                    )
                ]
        return []


@invariant("versions", reads=("effect_start", "effect_end"))
def versions(records: Records) -> List[Violation]:
    out: List[Violation] = []
    built: Dict[str, int] = {}
    active: Dict[str, int] = {}
    published: Dict[str, int] = {}
    synced: Dict[Tuple[str, str], Optional[int]] = {}  # (pipeline, scope) -> version synced in that scope
    applied = _PublishAfterApply()
    for r in records:
        if r["kind"] not in ("effect_start", "effect_end"):
            continue
        out.extend(applied.see(r))
        pid, eff, args, scope = r["pipeline_id"], r["effect"], r["args"], r.get("scope", "")
        if r["kind"] == "effect_end" and r.get("error"):
            continue
        if eff == "BuildCache" and r["kind"] == "effect_end":
            v = args["version"]
            if pid in built and v <= built[pid]:
                out.append(Violation("versions", r["seq"], f"{pid}: cache version {v} built after {built[pid]}"))
            built[pid] = v
        elif eff == "PromoteCache" and r["kind"] == "effect_end":
            if built.get(pid) != args["version"]:
                out.append(
                    Violation(
                        "versions",
                        r["seq"],
                        f"{pid}: promotes version {args['version']} but the latest built is {built.get(pid)}",
                    )
                )
            active[pid] = args["version"]
        elif eff == "SyncFromCache" and r["kind"] == "effect_end":
            if pid in active and args["version"] != active[pid]:
                out.append(
                    Violation(
                        "versions",
                        r["seq"],
                        f"{pid}: synced version {args['version']} but the active cache is {active[pid]}",
                    )
                )
            synced[(pid, scope)] = args["version"]
        elif eff == "SyncFromCache" and r["kind"] == "effect_start":
            synced[(pid, scope)] = None  # a sync in flight: nothing synced yet in this scope
        elif eff == "PublishVersion" and r["kind"] == "effect_start":
            v = args["version"]
            if active.get(pid) != v:
                out.append(
                    Violation(
                        "versions", r["seq"], f"{pid}: publishes version {v} but the active cache is {active.get(pid)}"
                    )
                )
            if args["path"] == "expand" and synced.get((pid, scope)) != v:
                out.append(
                    Violation(
                        "versions",
                        r["seq"],
                        f"{pid}: publishes version {v} on the expand path before the sync of that version",
                    )
                )
            if pid in published and v < published[pid]:
                out.append(
                    Violation("versions", r["seq"], f"{pid}: published version goes back from {published[pid]} to {v}")
                )
            published[pid] = max(v, published.get(pid, v))
    return out


@invariant("stale_serving", reads=("effect_start", "effect_end", "request_dispatch"))
def stale_serving(records: Records) -> List[Violation]:
    """No request is dispatched to weights older than the pipeline's published version,
    except while an active refresh is in flight (the tolerated mislabel window).

    Versions are compared as the cache versions they are — the version a publish names
    and the version a rank's weights came from — with no clamp: NeMo labels its base
    weights -1 and publishes them as 0 (debug #31), but a NeMo rank holding -1 after
    the publish of -1 is current either way, while a ROLL rank still serving -1 after
    version 0 is published is stale and must be flagged."""
    out: List[Violation] = []
    published: Dict[str, int] = {}
    refreshing: Dict[str, int] = {}
    reported = set()
    for r in records:
        k = r["kind"]
        if k in ("effect_start", "effect_end") and r["effect"] == "SyncFromCache" and r["args"]["path"] == "active":
            refreshing[r["pipeline_id"]] = refreshing.get(r["pipeline_id"], 0) + (1 if k == "effect_start" else -1)
        elif k == "effect_end" and r["effect"] == "PublishVersion" and not r.get("error"):
            pid, v = r["pipeline_id"], r["args"]["version"]
            published[pid] = max(v, published.get(pid, v))
        elif k == "request_dispatch" and r.get("version") is not None:
            pid = r["pipeline_id"]
            if pid in published and r["version"] < published[pid] and not refreshing.get(pid):
                key = (pid, r["dp_rank"], r["version"], published[pid])
                if key not in reported:
                    reported.add(key)
                    out.append(
                        Violation(
                            "stale_serving",
                            r["seq"],
                            f"{pid} dp{r['dp_rank']} serves version {r['version']} while version {published[pid]} is published",
                        )
                    )
    return out
