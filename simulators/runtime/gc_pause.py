"""Pausing Python's cyclic garbage collector around work that allocates millions of
objects and keeps most of them (a simulation's event log, the outputs written from it).

While paused, nothing is collected. On resume, everything that survived is moved to the
oldest generation (``gc.freeze()`` then ``gc.unfreeze()``: two constant-time list
splices) before collection is switched back on. Without that step the first automatic
collection after the pause walks every object allocated during it as if it were young:
after the 1024-GPU run that is a few million objects (records, slices, intervals), about
half a second, once after the simulation and again after the outputs — for a few
thousand spent generators that the next full collection still finds (a full collection
runs as usual once enough new objects have survived).
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic collection inside; survivors promoted to the oldest generation after.
    Nested or with the collector already off: it stays off."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.freeze()
            gc.unfreeze()
            gc.enable()
