"""Streaming-training invariants: 14 (staleness window) and 15 (the split-step protocol).

Both read what happened, never what a runtime says about itself: the version a group
was reserved under (``Reserve`` effect result), what the trainer did (``trainer_step``
records, written by the trainer), and which groups the driver cleared and synced
(``ClearSamples`` / ``SyncWeights`` effects). The staleness bound is configuration
(``streaming_setup.max_age``), not an outcome.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

from harness.logs.invariants.base import Records, Violation, invariant


def _ok_end(r: dict, effect: str) -> bool:
    return r["kind"] == "effect_end" and r["effect"] == effect and not r.get("error")


@invariant("staleness_window", reads=("streaming_setup", "effect_end", "trainer_step"))
def staleness_window(records: Records) -> List[Violation]:
    """14: every group the trainer consumes was committed, and its age (trainer version at
    training minus the weight version it was generated from) is within [0, max_age]."""
    out: List[Violation] = []
    max_age: Dict[str, Optional[int]] = {}
    started: Dict[Tuple[str, int], int] = {}  # (pipeline, group) -> start version
    committed: Set[Tuple[str, int]] = set()
    version: Dict[str, int] = {}
    for r in records:
        k = r["kind"]
        if k == "streaming_setup":
            max_age[r["pipeline_id"]] = r.get("max_age")
        elif k == "effect_end" and r.get("error") is None and r["effect"] in ("Reserve", "Commit"):
            pid = r["pipeline_id"]
            if r["effect"] == "Reserve":
                gid, start = r["result"]
                started[(pid, gid)] = start
            else:
                committed.add((pid, r["args"]["group_id"]))
        elif k == "trainer_step":
            pid = r["pipeline_id"]
            if r["action"] != "microbatch":
                version[pid] = r["version"]
                continue
            current = version.get(pid, r["version"])
            bound = max_age.get(pid)
            for gid in r.get("groups", []):
                if (pid, gid) not in committed:
                    out.append(
                        Violation("staleness_window", r["seq"], f"{pid}: trains group {gid}, which was never committed")
                    )
                    continue
                start = started.get((pid, gid))
                if start is None:
                    continue
                age = current - start
                if age < 0 or (bound is not None and age > bound):
                    out.append(
                        Violation(
                            "staleness_window",
                            r["seq"],
                            f"{pid}: group {gid} generated at version {start} trained at version {current} "
                            f"(age {age}, window {bound})",
                        )
                    )
    return out


@invariant("streaming_step", reads=("trainer_step", "effect_start", "effect_end", "sim_end"))
def streaming_step(records: Records) -> List[Violation]:
    """15: one open step at a time; the trainer version ticks at an applied finish and only
    there (abort and empty finishes leave it); every group trained in a step is cleared
    exactly once, in that step, before its finish; a weight sync ships the version the
    trainer holds; no step is left open when a run ends done."""
    steps = _Steps()
    for r in records:  # (a call per record of the kinds below only: effect records are most of a log)
        k = r["kind"]
        if k == "trainer_step":
            steps.trainer_step(r)
        elif _ok_end(r, "ClearSamples"):
            steps.clear_samples(r)
        elif k == "effect_start" and r["effect"] == "SyncWeights":
            steps.sync_weights(r)
        elif k == "sim_end" and r.get("reason") == "done":
            steps.run_done(r)
    return steps.out


class _Steps:
    """Each pipeline's open step, trainer version and groups trained and cleared, as
    :func:`streaming_step` reads the log; a handler per kind of record it checks."""

    def __init__(self) -> None:
        self.out: List[Violation] = []
        self.open_step: Dict[str, Optional[int]] = {}
        self.version: Dict[str, int] = {}
        self.trained: Dict[str, Set[int]] = {}  # groups trained in the open step
        self.cleared: Dict[str, Set[int]] = {}  # every group ever cleared

    def trainer_step(self, r: dict) -> None:
        """A step begins, trains a microbatch, finishes or aborts; the version ticks only at an applied finish."""
        out, open_step, trained = self.out, self.open_step, self.trained
        pid, action, v = r["pipeline_id"], r["action"], r["version"]
        prev = self.version.get(pid)
        is_open = open_step.get(pid) is not None
        if action == "begin":
            if is_open:
                out.append(
                    Violation(
                        "streaming_step",
                        r["seq"],
                        f"{pid}: step {r['step']} begins while step {open_step[pid]} is open",
                    )
                )
            open_step[pid] = r["step"]
            trained[pid] = set()
        elif action in ("microbatch", "finish") and not is_open:
            out.append(Violation("streaming_step", r["seq"], f"{pid}: {action} of step {r['step']} with no open step"))
        if action == "microbatch":
            trained.setdefault(pid, set()).update(r.get("groups", []))
        elif action == "finish":
            missing = sorted(trained.get(pid, set()) - self.cleared.get(pid, set()))
            if missing:
                out.append(
                    Violation(
                        "streaming_step",
                        r["seq"],
                        f"{pid}: step {r['step']} finishes with trained groups never cleared: {missing}",
                    )
                )
            open_step[pid] = None
            trained[pid] = set()
        elif action == "abort":
            open_step[pid] = None
            trained[pid] = set()
        ticks = action == "finish" and r.get("applied", True)
        if prev is not None and v != (prev + 1 if ticks else prev):
            why = "does not tick by exactly one at finish" if ticks else "ticks outside an applied finish"
            out.append(
                Violation("streaming_step", r["seq"], f"{pid}: trainer version {prev} -> {v} at {action} ({why})")
            )
        self.version[pid] = v

    def clear_samples(self, r: dict) -> None:
        """A ClearSamples that succeeded: each group cleared once, in the open step that trained it."""
        pid, step = r["pipeline_id"], r["args"]["step"]
        for gid in r["args"]["groups"]:
            done = self.cleared.setdefault(pid, set())
            if gid in done:
                self.out.append(Violation("streaming_step", r["seq"], f"{pid}: group {gid} cleared twice"))
            elif gid not in self.trained.get(pid, set()) or self.open_step.get(pid) != step:
                self.out.append(
                    Violation(
                        "streaming_step",
                        r["seq"],
                        f"{pid}: step {step} clears group {gid}, which the open step did not train",
                    )
                )
            done.add(gid)

    def sync_weights(self, r: dict) -> None:
        """A weight sync starts: it ships the version the trainer holds."""
        pid, v = r["pipeline_id"], r["args"]["version"]
        if self.version.get(pid) is not None and v != self.version[pid]:
            self.out.append(
                Violation(
                    "streaming_step",
                    r["seq"],
                    f"{pid}: syncs weights version {v} but the trainer holds version {self.version[pid]}",
                )
            )

    def run_done(self, r: dict) -> None:
        """The run ends done: no step is left open."""
        for pid, s in sorted(self.open_step.items()):
            if s is not None:
                self.out.append(Violation("streaming_step", r["seq"], f"{pid}: run ends with step {s} still open"))
