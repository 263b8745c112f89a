"""rlharness: the shared, clock-free half of the harness (spec, scheduler model, event log, replay)."""

__version__ = "0.1.0"
