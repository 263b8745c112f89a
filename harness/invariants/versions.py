"""Version invariants (9): caches built in increasing version order; only a built
version is promoted; a sync reads and a publish names the promoted (active) version, a
publish on the expand path comes after that path's sync; published values never go back."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from harness.invariants.base import Records, Violation, invariant


@invariant("versions")
def versions(records: Records) -> List[Violation]:
    out: List[Violation] = []
    built: Dict[str, int] = {}
    active: Dict[str, int] = {}
    published: Dict[str, int] = {}
    synced: Dict[Tuple[str, str], Optional[int]] = {}  # (pipeline, scope) -> version synced in that scope
    for r in records:
        if r["kind"] not in ("effect_start", "effect_end"):
            continue
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
                out.append(Violation("versions", r["seq"], f"{pid}: promotes version {args['version']} but the latest built is {built.get(pid)}"))
            active[pid] = args["version"]
        elif eff == "SyncFromCache" and r["kind"] == "effect_end":
            if pid in active and args["version"] != active[pid]:
                out.append(Violation("versions", r["seq"], f"{pid}: synced version {args['version']} but the active cache is {active[pid]}"))
            synced[(pid, scope)] = args["version"]
        elif eff == "SyncFromCache" and r["kind"] == "effect_start":
            synced[(pid, scope)] = None  # a sync in flight: nothing synced yet in this scope
        elif eff == "PublishVersion" and r["kind"] == "effect_start":
            v = args["version"]
            if active.get(pid) != v:
                out.append(Violation("versions", r["seq"], f"{pid}: publishes version {v} but the active cache is {active.get(pid)}"))
            if args["path"] == "expand" and synced.get((pid, scope)) != v:
                out.append(Violation("versions", r["seq"], f"{pid}: publishes version {v} on the expand path before the sync of that version"))
            value = max(v, 0)
            if pid in published and value < published[pid]:
                out.append(Violation("versions", r["seq"], f"{pid}: published version goes back from {published[pid]} to {value}"))
            published[pid] = max(value, published.get(pid, value))
    return out
