"""The dual-pipeline gate's scripted workload: the arrival order that makes a handover certain.

Left to their own timing, the two pipelines may never contend for a GPU (ppl1 could finish
its first batch before ppl2 asks), and then no cycle shrinks a donor and expands a
recipient — the one thing the T1 < T2 < T3 check is about — and no drain ever meets a
request in flight. So the gate installs this script; it is not part of any effect handler
(``gpu_gates/dual/effects.py`` does what each effect does, for any pipeline), and the
driver consults it before each effect it dispatches. At step 0:

* ppl2's first GENERATION request waits until ppl1 holds both inference GPUs;
* ppl1's first batch starts only once ppl2 has asked, so ppl1 is still generating when
  the scheduler takes a GPU from it;
* ppl1's first shrink after ppl2 has asked for GENERATION aborts only once ppl1 has
  requests in flight on the ranks it aborts (or its first batch is already over), so the
  drain that follows has something to drain. (A shrink before that ask, ppl2's
  INITIALIZATION taking its training GPU when ppl2 starts late, goes at once.)

Every wait is bounded and never gives up silently: one that runs out is a driver error,
and the gate fails with what it waited for. The ``solo_pipelines`` test hook runs the gate
without the script (and with the pipelines one after the other), where the gate must fail.
"""

from __future__ import annotations

import threading
from typing import Any

from harness.scheduler.types import Priority

LIMIT_S = 20.0


class HandoverScript:
    def __init__(self) -> None:
        self.ppl2_asked = threading.Event()
        self.ppl1_aborted = False

    def before(self, driver: Any, pid: str, effect: Any) -> None:
        """Hold ``effect`` of pipeline ``pid`` until the script's condition for it holds."""
        name = type(effect).__name__
        if (
            name == "RequestGpus"
            and pid == "ppl2"
            and effect.priority == Priority.GENERATION
            and not self.ppl2_asked.is_set()
        ):
            driver._wait_until(lambda: len(driver.routable["ppl1"]) == 2, LIMIT_S, "ppl1 to hold both GPUs")
            self.ppl2_asked.set()
        elif name == "WaitBatch" and pid == "ppl1" and effect.global_step == 0:
            driver._wait_until(self.ppl2_asked.is_set, LIMIT_S, "ppl2 to ask for GENERATION")
        elif name == "Abort" and pid == "ppl1" and not self.ppl1_aborted and self.ppl2_asked.is_set():
            # Only the handover to ppl2's GENERATION is held: an earlier shrink of ppl1 (ppl2's
            # INITIALIZATION taking its training GPU, when ppl2 starts after ppl1 holds both)
            # goes at once. Held, it would wait for ppl1's first batch, which waits for ppl2's
            # GENERATION request, which comes only after that INITIALIZATION is granted: a
            # cycle of the script's own making (seen on a loaded CI machine, 20 s then a failure).
            self.ppl1_aborted = True
            driver._wait_until(
                lambda: (
                    driver.batches_done[pid] > 0 or any(driver._infer(pid, d).call("in_flight") for d in effect.ranks)
                ),
                LIMIT_S,
                "ppl1 requests in flight on the ranks its first shrink aborts",
            )
