"""A float total with the same bits on every supported Python (3.11-3.13).

CPython 3.12 changed the builtin ``sum()`` of floats from plain left-to-right addition to
compensated (Neumaier) summation, so ``sum([0.1] * 10)`` is ``0.9999999999999999`` on 3.11
and ``1.0`` on 3.12 and 3.13. The project promises byte-identical outputs for a scenario
and seed on 3.11-3.13, and 3.11's bytes are the frozen ones: every float total that reaches
a scheduling decision, an event log or an output file (summary.json's step means and idle
shares were the ones that differed) is taken with :func:`ordered_sum`, which adds left to
right exactly as 3.11's ``sum()`` did, on every version.

Integer totals may keep ``sum()``: integers add exactly everywhere. Totals of measured wall
times (the gates', the refit measurements') are not reproducible anyway and keep it too.
"""

from __future__ import annotations

import operator
from functools import reduce
from typing import Iterable, Union

Number = Union[int, float]


def ordered_sum(values: Iterable[Number]) -> Number:
    """``values`` added left to right, starting from the integer 0 (as ``sum()`` does:
    an empty or all-integer input gives an exact int), with no compensation."""
    return reduce(operator.add, values, 0)
